"""The all-reduce benchmark's rows in the OSU micro-benchmarks' and nccl-tests' column layouts.

``hpcdist bench allreduce --format osu`` prints what ``osu_allreduce -f``
prints (size, average, minimum and maximum latency in microseconds,
iterations), ``--format nccl-tests`` what ``all_reduce_perf`` prints (size,
count, type, redop, root, then time, algbw, busbw and #wrong), so that
plotting scripts written for those tools read hpcdist's output unchanged.
The numbers are one series of the run (default ``hpcdist-auto``); hpcdist's
all-reduce returns new arrays, so nccl-tests' in-place columns are measured
the same way as the out-of-place ones and repeat them.

Example:
    >>> rows = [{"bytes": 4, "iters": 100, "checked": True,
    ...          "series": {"hpcdist-auto": {"seconds": 2e-6, "repeats": [2e-6, 3e-6],
    ...                                      "algbw_gb_per_s": 0.002, "busbw_gb_per_s": 0.002}}}]
    >>> print(format_osu(rows, "hpcdist-auto").splitlines()[-1])
    4                       2.50              2.00              3.00         100
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

FORMATS = ("table", "osu", "nccl-tests")


def format_osu(rows: Sequence[dict[str, Any]], series: str) -> str:
    """``osu_allreduce -f`` layout: ``# Size  Avg Latency(us)  Min  Max  Iterations``."""
    lines = [
        f"# OSU MPI Allreduce Latency Test (hpcdist bench allreduce, series {series})",
        "# Datatype: MPI_FLOAT.",
        f"{'# Size':<10}{'Avg Latency(us)':>18}{'Min Latency(us)':>18}{'Max Latency(us)':>18}"
        f"{'Iterations':>12}",
    ]
    for row in rows:
        times = [t * 1e6 for t in row["series"][series]["repeats"]]
        avg = sum(times) / len(times)
        lines.append(f"{row['bytes']:<10d}{avg:18.2f}{min(times):18.2f}{max(times):18.2f}"
                     f"{row['iters']:12d}")
    return "\n".join(lines)


def _time(us: float) -> str:
    return f"{us:7.2f}" if us < 1e4 else f"{us:7.1f}" if us < 1e6 else f"{us:7.0f}"


def format_nccl_tests(rows: Sequence[dict[str, Any]], series: str, ranks: int) -> str:
    """``all_reduce_perf`` layout, out-of-place and in-place columns, and its two footer lines."""
    lines = [
        f"# hpcdist bench allreduce, series {series}, {ranks} ranks "
        "(nccl-tests all_reduce_perf layout)",
        "#",
        f"# {'':>54}out-of-place{'':>23}in-place",
        "#       size         count      type   redop    root     time   algbw   busbw #wrong"
        "     time   algbw   busbw #wrong",
        "#        (B)    (elements)                               (us)  (GB/s)  (GB/s)       "
        "     (us)  (GB/s)  (GB/s)",
    ]
    busbws = []
    for row in rows:
        s = row["series"][series]
        wrong = "0" if row.get("checked") else "N/A"
        cell = f"  {_time(s['seconds'] * 1e6)}  {s['algbw_gb_per_s']:6.2f}  " \
               f"{s['busbw_gb_per_s']:6.2f}  {wrong:>5}"
        busbws.append(s["busbw_gb_per_s"])
        lines.append(f"{row['bytes']:12d}  {row['bytes'] // 4:12d}  {'float':>8}  {'sum':>6}  "
                     f"{-1:6d}{cell}{cell}")
    lines.append("# Out of bounds values : 0 OK")
    avg = sum(busbws) / len(busbws) if busbws else 0.0
    lines.append(f"# Avg bus bandwidth    : {avg:g} ")
    return "\n".join(lines)
