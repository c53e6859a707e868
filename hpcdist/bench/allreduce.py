"""All-reduce benchmark: hpcdist's collectives engine against raw MPI, side by side.

Run: ``mpirun -n 2 hpcdist bench allreduce`` (or ``python -m hpcdist bench
allreduce``, or ``python benchmarks/allreduce.py`` from the repository).

In one run, on the same buffers and ranks, for float32 SUM of 4 B .. 64 MiB:

* ``mpi4py``: raw ``comm.Allreduce(sendbuf, recvbuf, MPI.SUM)`` (the baseline);
* ``hpcdist-auto``, ``hpcdist-mpi``, ``hpcdist-shm``, ``hpcdist-hierarchical``:
  ``Collectives.allreduce([x], "SUM", CommunicationOptions(implementation=...))``
  with AUTO and each backend forced (AUTO follows ``HPCDIST_COLLECTIVES`` when
  it is set; the benchmark records it but never sets it);
* ``gloo``: ``torch.distributed.all_reduce`` over gloo when torch is importable.

For each size every series is timed in turn, ``--repeats`` times (the order
rotates from one repetition to the next), after ``--warmup`` untimed calls.
One repetition is ``iters`` calls between a barrier and ``time.perf_counter``;
its time is the slowest rank's, divided by ``iters``; a series' time is the
median (``--stat min``: the best) of its repetitions. Bandwidths follow
nccl-tests: ``algbw = bytes / time``, ``busbw = algbw * 2 (n - 1) / n``, in
GB/s (1e9 bytes). The memory-bandwidth roofline is the per-rank ``np.copyto``
bandwidth of a 64 MiB buffer with every rank copying at once.

A second case reduces ResNet-50's 161 gradient tensors (25.6 M float32) three
ways: one hpcdist call on the list, a loop of per-tensor ``comm.Allreduce``,
and one ``comm.Allreduce`` of a single buffer of the same size.

With ``--check`` (the default) every series' result is compared with raw
MPI's (and raw MPI's with the exact sum) once per size before it is timed;
a mismatch raises :class:`BenchmarkError` on every rank, so no number is
reported for a wrong result. Rank 0 prints the tables and writes
``<out>/allreduce.json`` and ``.png`` (``allreduce_mpi<N>`` for N != 2 ranks).

Example:
    >>> sizes(4, 1024, 4)
    [4, 16, 64, 256, 1024]
    >>> [round(v, 3) for v in bandwidths(1_000_000, 0.001, ranks=4)]
    [1.0, 1.5]
"""

from __future__ import annotations

import argparse
import datetime
import functools
import importlib.util
import logging
import os
import platform
import socket
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from hpcdist.bench.report import save_line_plot, save_report
from hpcdist.bench.resnet50 import resnet50_gradients
from hpcdist.collectives import Collectives, CommunicationOptions, ReduceOp
from hpcdist.errors import BenchmarkError
from hpcdist.runtime import library_version, mpi, world

RAW = "mpi4py"
GLOO = "gloo"
BACKENDS = ("AUTO", "MPI", "SHM", "HIERARCHICAL")
AUTO_SERIES = "hpcdist-auto"
ENV_OVERRIDE = "HPCDIST_COLLECTIVES"

DEFAULT_MAX_BYTES = 64 << 20
QUICK_MAX_BYTES = 1 << 20
MEMCPY_BYTES = 64 << 20
BYTES_PER_REPEAT = 16 << 20  # adaptive iterations: about this many bytes per repetition
MAX_ITERS = 100
QUICK_MAX_ITERS = 20

#: The lead's targets, defined for 2 ranks.
TARGET_RANKS = 2
LARGE_BYTES = 4 << 20
LARGE_BUSBW_RATIO = 1.5
SMALL_BYTES = 4 << 10
SMALL_LATENCY_RATIO = 1.5
RESNET_LOOP_SPEEDUP = 3.0
RESNET_SINGLE_RATIO = 1.2

_UNITS = {
    "": 1,
    "B": 1,
    "K": 1 << 10,
    "KB": 1 << 10,
    "KIB": 1 << 10,
    "M": 1 << 20,
    "MB": 1 << 20,
    "MIB": 1 << 20,
    "G": 1 << 30,
    "GB": 1 << 30,
    "GIB": 1 << 30,
}


def series_name(implementation: str) -> str:
    """The series label of an hpcdist backend. Example: ``series_name("SHM") == "hpcdist-shm"``."""
    return f"hpcdist-{implementation.lower()}"


def parse_bytes(text: str) -> int:
    """A byte count from ``"4096"``, ``"4K"``, ``"64MiB"`` (binary units).

    Example:
        >>> parse_bytes("64MiB"), parse_bytes("4k"), parse_bytes("16")
        (67108864, 4096, 16)
    """
    clean = text.strip().upper().replace(" ", "")
    digits = clean.rstrip("KMGIB")
    unit = clean[len(digits) :]
    if not digits.isdigit() or unit not in _UNITS:
        raise argparse.ArgumentTypeError(
            f"size is {text!r}; expected a whole number of bytes with an optional unit "
            "K/KiB, M/MiB or G/GiB, such as 4096 or 64MiB"
        )
    return int(digits) * _UNITS[unit]


def format_bytes(nbytes: int) -> str:
    """A byte count in binary units. Example: ``format_bytes(4 << 20) == "4 MiB"``."""
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if nbytes >= scale and nbytes % scale == 0:
            return f"{nbytes // scale} {unit}"
    return f"{nbytes} B"


def sizes(min_bytes: int, max_bytes: int, factor: int = 4) -> list[int]:
    """Message sizes ``min_bytes * factor**k`` up to ``max_bytes``, whole float32 elements.

    Example:
        >>> sizes(4, 64, 2)
        [4, 8, 16, 32, 64]
    """
    if min_bytes < 4 or min_bytes % 4:
        raise BenchmarkError(
            f"the smallest size is {min_bytes} bytes; expected a multiple of 4 (float32) >= 4"
        )
    if max_bytes < min_bytes:
        raise BenchmarkError(
            f"--max-bytes is {max_bytes}, below --min-bytes {min_bytes}; raise --max-bytes"
        )
    if factor < 2:
        raise BenchmarkError(f"--factor is {factor}; expected 2 or more")
    out = []
    nbytes = min_bytes
    while nbytes <= max_bytes:
        out.append(nbytes)
        nbytes *= factor
    return out


def iterations(nbytes: int, fixed: int | None = None, cap: int = MAX_ITERS) -> int:
    """Calls per timed repetition: ``fixed``, or about 16 MiB of traffic, 1 to ``cap``.

    Example:
        >>> iterations(4), iterations(1 << 20), iterations(64 << 20), iterations(4, fixed=3)
        (100, 16, 1, 3)
    """
    if fixed is not None:
        return fixed
    return max(1, min(cap, BYTES_PER_REPEAT // nbytes))


def bus_factor(ranks: int) -> float:
    """nccl-tests' all-reduce bus factor ``2 (n - 1) / n``. Example: ``bus_factor(4) == 1.5``."""
    return 2 * (ranks - 1) / ranks


def bandwidths(nbytes: int, seconds: float, ranks: int) -> tuple[float, float]:
    """``(algbw, busbw)`` in GB/s (1e9 bytes) of an all-reduce of ``nbytes`` in ``seconds``.

    Example:
        >>> bandwidths(2_000_000, 0.001, ranks=2)
        (2.0, 2.0)
    """
    algbw = nbytes / seconds / 1e9
    return algbw, algbw * bus_factor(ranks)


def statistic(values: Sequence[float], stat: str) -> float:
    """The median or the minimum (``stat`` ``"median"``/``"min"``) of the repetitions.

    Example:
        >>> statistic([3.0, 1.0, 2.0], "median"), statistic([3.0, 1.0, 2.0], "min")
        (2.0, 1.0)
    """
    return float(statistics.median(values) if stat == "median" else min(values))


# -- results from recorded times (pure: the unit test recomputes these) -----


def summarize_row(
    nbytes: int,
    repeats: dict[str, list[float]],
    *,
    ranks: int,
    stat: str,
    memcpy_gb_per_s: float,
) -> dict[str, dict[str, Any]]:
    """Per series: the time, bandwidths and ratios to raw MPI from its repetitions.

    ``busbw_ratio_to_raw`` is ``busbw / busbw(raw)`` (above 1: faster than raw);
    ``latency_ratio_to_raw`` is ``seconds / seconds(raw)`` (above 1: slower).

    Example:
        >>> row = summarize_row(4000, {"mpi4py": [1e-6], "x": [2e-6]}, ranks=2, stat="median",
        ...                     memcpy_gb_per_s=10.0)
        >>> row["x"]["busbw_ratio_to_raw"], row["x"]["latency_ratio_to_raw"]
        (0.5, 2.0)
    """
    out: dict[str, dict[str, Any]] = {}
    raw_seconds = statistic(repeats[RAW], stat)
    _, raw_busbw = bandwidths(nbytes, raw_seconds, ranks)
    for name, times in repeats.items():
        seconds = statistic(times, stat)
        algbw, busbw = bandwidths(nbytes, seconds, ranks)
        out[name] = {
            "seconds": seconds,
            "repeats": list(times),
            "algbw_gb_per_s": algbw,
            "busbw_gb_per_s": busbw,
            "busbw_ratio_to_raw": busbw / raw_busbw,
            "latency_ratio_to_raw": seconds / raw_seconds,
            "fraction_of_memcpy": busbw / memcpy_gb_per_s,
        }
    return out


def _target(
    name: str, series: str, comparison: str, threshold: float, values: dict[str, float]
) -> dict[str, Any]:
    if not values:
        measured, passed = None, None
    elif comparison == ">=":
        measured = min(values.values())
        passed = measured >= threshold
    else:
        measured = max(values.values())
        passed = measured <= threshold
    return {
        "name": name,
        "series": series,
        "comparison": comparison,
        "threshold": threshold,
        "measured": measured,
        "values": values,
        "pass": passed,
        "status": "SKIPPED" if passed is None else ("PASS" if passed else "FAIL"),
    }


def evaluate_targets(rows: list[dict[str, Any]], resnet: dict[str, Any] | None) -> list[dict]:
    """The four targets (defined for 2 ranks), each PASS, FAIL or SKIPPED (nothing measured).

    ``measured`` is the worst value over the sizes the target covers.

    Example:
        >>> evaluate_targets([], None)[0]["status"]
        'SKIPPED'
    """
    large = {
        str(r["bytes"]): r["series"][AUTO_SERIES]["busbw_ratio_to_raw"]
        for r in rows
        if r["bytes"] >= LARGE_BYTES
    }
    small = {
        str(r["bytes"]): r["series"][AUTO_SERIES]["latency_ratio_to_raw"]
        for r in rows
        if r["bytes"] <= SMALL_BYTES
    }
    loop = {"resnet50": resnet["loop_over_hpcdist"]} if resnet else {}
    single = {"resnet50": resnet["hpcdist_over_single"]} if resnet else {}
    return [
        _target(
            f"busbw >= {LARGE_BUSBW_RATIO}x raw MPI at sizes >= {format_bytes(LARGE_BYTES)}",
            AUTO_SERIES,
            ">=",
            LARGE_BUSBW_RATIO,
            large,
        ),
        _target(
            f"latency <= {SMALL_LATENCY_RATIO}x raw MPI at sizes <= {format_bytes(SMALL_BYTES)}",
            AUTO_SERIES,
            "<=",
            SMALL_LATENCY_RATIO,
            small,
        ),
        _target(
            f"ResNet-50 list: per-tensor loop / hpcdist >= {RESNET_LOOP_SPEEDUP}x",
            AUTO_SERIES,
            ">=",
            RESNET_LOOP_SPEEDUP,
            loop,
        ),
        _target(
            f"ResNet-50 list: hpcdist / single buffer <= {RESNET_SINGLE_RATIO}x",
            AUTO_SERIES,
            "<=",
            RESNET_SINGLE_RATIO,
            single,
        ),
    ]


def format_table(rows: list[dict[str, Any]], names: Sequence[str]) -> str:
    """The per-size table: latency, algbw, busbw, ratios to raw MPI, fraction of memcpy.

    Example: ``print(format_table(report["rows"], report["series"]))``.
    """
    header = (
        f"{'size':>8}  {'series':<21}{'iters':>5}{'lat(us)':>11}{'algbw':>9}{'busbw':>9}"
        f"{'bus/raw':>9}{'lat/raw':>9}{'of memcpy':>10}"
    )
    lines = [header, "-" * len(header)]
    for row in rows:
        for name in names:
            s = row["series"].get(name)
            if s is None:
                continue
            lines.append(
                f"{format_bytes(row['bytes']):>8}  {name:<21}{row['iters']:>5}"
                f"{s['seconds'] * 1e6:>11.1f}{s['algbw_gb_per_s']:>9.3f}{s['busbw_gb_per_s']:>9.3f}"
                f"{s['busbw_ratio_to_raw']:>8.2f}x{s['latency_ratio_to_raw']:>8.2f}x"
                f"{s['fraction_of_memcpy'] * 100:>9.1f}%"
            )
        lines.append("")
    return "\n".join(lines).rstrip()


# -- measuring ---------------------------------------------------------------


def time_call(comm: Any, call: Callable[[], Any], iters: int) -> float:
    """Seconds per call of ``iters`` calls after a barrier, the slowest rank's.

    Example: ``time_call(comm, functools.partial(comm.Allreduce, x, y), 10)``.
    """

    comm.Barrier()
    t0 = time.perf_counter()
    for _ in range(iters):
        call()
    elapsed = time.perf_counter() - t0
    return comm.allreduce(elapsed, op=mpi().MAX) / iters


def time_interleaved(
    comm: Any, calls: dict[str, Callable[[], Any]], iters: int, repeats: int, warmup: int
) -> dict[str, list[float]]:
    """Each series' per-call seconds over ``repeats`` rounds, the series timed in turn.

    Round ``r`` starts with series ``r mod len(calls)``, so no series always
    runs first or after the same neighbour.

    Example: ``time_interleaved(comm, {"raw": f, "hpcdist": g}, iters=10, repeats=5, warmup=2)``.
    """
    names = list(calls)
    for name in names:
        for _ in range(warmup):
            calls[name]()
    times: dict[str, list[float]] = {name: [] for name in names}
    for r in range(repeats):
        for k in range(len(names)):
            name = names[(r + k) % len(names)]
            times[name].append(time_call(comm, calls[name], iters))
    return times


def memcpy_bandwidth(comm: Any, nbytes: int, repeats: int, stat: str) -> float:
    """Per-rank ``np.copyto`` GB/s of an ``nbytes`` buffer, every rank copying at once."""
    src = np.ones(nbytes // 4, dtype=np.float32)
    dst = np.empty_like(src)
    copy = functools.partial(np.copyto, dst, src)
    times = time_interleaved(comm, {"memcpy": copy}, iters=4, repeats=repeats, warmup=2)
    return nbytes / statistic(times["memcpy"], stat) / 1e9


def agree_or_raise(comm: Any, problems: list[str], what: str) -> None:
    """Raise on every rank when any rank found a problem (so no rank waits for the others)."""
    everyone = comm.allgather(problems)
    found = [f"rank {rank}: {p}" for rank, ps in enumerate(everyone) for p in ps]
    if found:
        raise BenchmarkError(
            f"{what}: {'; '.join(found[:8])}. The benchmark reports no numbers for wrong "
            "results; fix the engine, or pass --no-check to time it anyway"
        )


class Gloo:
    """torch.distributed over gloo, started from the MPI world (rank 0's address and port).

    Example: ``gloo = Gloo.start(comm)``; ``gloo.dist`` is ``None`` and ``gloo.note``
    says why when torch is missing or the group cannot start.
    """

    def __init__(self, dist: Any, torch: Any, note: str | None) -> None:
        self.dist = dist
        self.torch = torch
        self.note = note

    @classmethod
    def start(cls, comm: Any, timeout_seconds: float = 60.0) -> Gloo:
        """Join every rank into one gloo process group, or a ``Gloo`` with a note why not."""
        if importlib.util.find_spec("torch") is None:
            return cls(None, None, "torch is not installed: the gloo series is skipped")
        rank, size = comm.Get_rank(), comm.Get_size()
        hosts = comm.allgather(socket.gethostname())
        address = "127.0.0.1" if len(set(hosts)) == 1 else hosts[0]
        port = 0
        if rank == 0:
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
                s.bind(("", 0))
                port = s.getsockname()[1]
        port = comm.bcast(port, root=0)
        error = ""
        started: Any = None  # torch.distributed, once imported
        try:
            import torch  # lazy: optional framework (PyTorch)
            import torch.distributed as dist  # lazy: optional framework (PyTorch)

            started = dist
            dist.init_process_group(
                "gloo",
                init_method=f"tcp://{address}:{port}",
                rank=rank,
                world_size=size,
                timeout=datetime.timedelta(seconds=timeout_seconds),
            )
        except Exception as exc:  # any failure: skip the series on every rank
            error = f"{type(exc).__name__}: {exc}"
        errors = [e for e in comm.allgather(error) if e]
        if errors:
            if started is not None and started.is_initialized():
                started.destroy_process_group()
            return cls(None, None, f"torch.distributed gloo did not start ({errors[0]}): skipped")
        return cls(dist, torch, None)

    def stop(self) -> None:
        """Leave the process group. Example: ``gloo.stop()``."""
        if self.dist is not None:
            self.dist.destroy_process_group()
            self.dist = None


class _Warnings(logging.Handler):
    """Collects the engine's warnings (fallbacks) for the report."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        if message not in self.messages:
            self.messages.append(message)


def _fill(x: np.ndarray, rank: int) -> None:
    """Values whose sums over ranks are exact in float32: ((i mod 17) + rank) / 4."""
    x[:] = np.arange(x.size) % 17
    x += rank
    x *= 0.25


def _exact_sum(n: int, ranks: int) -> np.ndarray:
    base = (np.arange(n) % 17).astype(np.float32)
    return ((base * ranks + ranks * (ranks - 1) / 2) * 0.25).astype(np.float32)


def measure_size(
    nbytes: int,
    *,
    comm: Any,
    engine: Any,
    gloo: Gloo,
    iters: int,
    repeats: int,
    warmup: int,
    check: bool,
) -> dict[str, list[float]]:
    """Check (optionally) and time every series on one set of buffers of ``nbytes``.

    Example: ``measure_size(4096, comm=comm, engine=Collectives(comm), gloo=gloo, iters=100,
    repeats=5, warmup=2, check=True)``.
    """

    MPI = mpi()
    rank, size = comm.Get_rank(), comm.Get_size()
    x = np.empty(nbytes // 4, dtype=np.float32)
    _fill(x, rank)
    xs = [x]
    recv = np.empty_like(x)
    calls: dict[str, Callable[[], Any]] = {RAW: functools.partial(comm.Allreduce, x, recv, MPI.SUM)}
    for implementation in BACKENDS:
        options = CommunicationOptions(implementation=implementation)
        calls[series_name(implementation)] = functools.partial(
            engine.allreduce, xs, ReduceOp.SUM, options
        )
    tensor = None
    if gloo.dist is not None:
        gbuf = np.zeros_like(x)
        tensor = gloo.torch.from_numpy(gbuf)
        calls[GLOO] = functools.partial(gloo.dist.all_reduce, tensor)
    if check:
        problems = []
        calls[RAW]()
        if not np.allclose(recv, _exact_sum(x.size, size)):
            problems.append(f"raw MPI Allreduce of {format_bytes(nbytes)} is not the exact sum")
        for name, call in calls.items():
            if name == RAW:
                continue
            if name == GLOO:
                np.copyto(gbuf, x)
                call()
                got = gbuf
            else:
                got = call()[0]
            if got.shape != x.shape or got.dtype != x.dtype or not np.allclose(got, recv):
                problems.append(f"{name} of {format_bytes(nbytes)} differs from raw MPI")
        if tensor is not None:
            gbuf.fill(0)  # zeros stay zeros: repeated in-place sums never overflow
        agree_or_raise(comm, problems, "all-reduce results differ")
    return time_interleaved(comm, calls, iters, repeats, warmup)


def measure_resnet(
    *, comm: Any, engine: Any, repeats: int, warmup: int, check: bool, stat: str
) -> dict[str, Any]:
    """ResNet-50's gradient list: one hpcdist call vs per-tensor and single-buffer MPI.

    Example: ``measure_resnet(comm=comm, engine=engine, repeats=5, warmup=1, check=True,
    stat="median")["loop_over_hpcdist"]``.
    """

    MPI = mpi()
    rank, size = comm.Get_rank(), comm.Get_size()
    grads = resnet50_gradients(np.float32, fill=rank + 1)
    pairs = [(g, np.empty_like(g)) for g in grads]
    total = sum(g.size for g in grads)
    flat = np.full(total, rank + 1, dtype=np.float32)
    flat_recv = np.empty_like(flat)
    allreduce = comm.Allreduce
    SUM = MPI.SUM

    def loop() -> None:
        for g, r in pairs:
            allreduce(g, r, SUM)

    calls: dict[str, Callable[[], Any]] = {
        "hpcdist": functools.partial(engine.allreduce, grads, ReduceOp.SUM, CommunicationOptions()),
        "loop": loop,
        "single": functools.partial(allreduce, flat, flat_recv, SUM),
    }
    if check:
        expected = size * (size + 1) / 2
        got = calls["hpcdist"]()
        loop()
        calls["single"]()
        problems = []
        if not all(np.all(r == expected) for _, r in pairs) or not np.all(flat_recv == expected):
            problems.append("raw MPI Allreduce of the ResNet-50 list is not the exact sum")
        if len(got) != len(grads) or not all(
            a.shape == r.shape and a.dtype == r.dtype and np.allclose(a, r)
            for a, (_, r) in zip(got, pairs, strict=True)
        ):
            problems.append("hpcdist allreduce of the ResNet-50 list differs from raw MPI")
        agree_or_raise(comm, problems, "ResNet-50 all-reduce results differ")
        del got
    times = time_interleaved(comm, calls, iters=1, repeats=repeats, warmup=warmup)
    seconds = {name: statistic(t, stat) for name, t in times.items()}
    return {
        "tensors": len(grads),
        "parameters": total,
        "bytes": total * 4,
        "seconds": seconds,
        "repeats": times,
        "loop_over_hpcdist": seconds["loop"] / seconds["hpcdist"],
        "hpcdist_over_single": seconds["hpcdist"] / seconds["single"],
        "checked": check,
    }


# -- the command -------------------------------------------------------------


def build_parser(
    prog: str = "hpcdist bench allreduce", out: str = "benchmarks/results"
) -> argparse.ArgumentParser:
    """The command line options. Example: ``build_parser().parse_args(["--quick"]).quick``."""
    p = argparse.ArgumentParser(
        prog=prog,
        description="All-reduce benchmark: hpcdist's collectives engine vs raw mpi4py "
        "(and torch gloo), float32 SUM, run under mpirun.",
    )
    p.add_argument("--min-bytes", type=parse_bytes, default=4, help="smallest size (default 4)")
    p.add_argument(
        "--max-bytes",
        type=parse_bytes,
        default=None,
        help="largest size, e.g. 64MiB (default 64 MiB; 1 MiB with --quick)",
    )
    p.add_argument("--factor", type=int, default=4, help="size step: 4 (default) or 2")
    p.add_argument(
        "--iters",
        type=int,
        default=None,
        help="calls per timed repetition at every size (default: about 16 MiB of traffic, "
        f"1 to {MAX_ITERS})",
    )
    p.add_argument("--repeats", type=int, default=None, help="timed repetitions (default 5)")
    p.add_argument(
        "--warmup", type=int, default=2, help="untimed calls per series and size (default 2)"
    )
    p.add_argument(
        "--stat",
        choices=("median", "min"),
        default="median",
        help="statistic of the repetitions (default median)",
    )
    p.add_argument(
        "--quick",
        action="store_true",
        help=f"sizes to 1 MiB, 3 repetitions, at most {QUICK_MAX_ITERS} calls each",
    )
    p.add_argument(
        "--check",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="verify hpcdist's results against raw MPI once per size (default on)",
    )
    p.add_argument("--no-gloo", action="store_true", help="skip the torch gloo series")
    p.add_argument(
        "--resnet-repeats",
        type=int,
        default=None,
        help="repetitions of the ResNet-50 case (default 5, 2 with --quick; 0 skips it)",
    )
    p.add_argument("--out", default=out, help=f"folder for the JSON and PNG (default {out})")
    p.add_argument(
        "--name",
        default=None,
        help="file name without extension (default allreduce for 2 ranks, else allreduce_mpiN)",
    )
    return p


def _validate(args: argparse.Namespace) -> None:
    for option in ("iters", "repeats", "resnet_repeats"):
        value = getattr(args, option)
        lowest = 0 if option == "resnet_repeats" else 1
        if value is not None and value < lowest:
            raise BenchmarkError(
                f"--{option.replace('_', '-')} is {value}; expected an integer >= {lowest}"
            )
    if args.warmup < 0:
        raise BenchmarkError(f"--warmup is {args.warmup}; expected an integer >= 0")


def main(
    argv: Sequence[str] | None = None,
    *,
    prog: str = "hpcdist bench allreduce",
    out: str = "benchmarks/results",
) -> int:
    """Run the benchmark on every rank; rank 0 prints and writes. Returns the exit status.

    Example: ``main(["--quick"])`` under ``mpirun -n 2``.
    """
    args = build_parser(prog, out).parse_args(argv)
    _validate(args)

    started = time.perf_counter()
    w = world()
    comm = w.comm
    if w.size < 2:
        raise BenchmarkError(
            f"the all-reduce benchmark runs on {w.size} rank; expected 2 or more. "
            f"Run it as: mpirun -n 2 {prog}"
        )
    max_bytes = args.max_bytes or (QUICK_MAX_BYTES if args.quick else DEFAULT_MAX_BYTES)
    size_list = sizes(args.min_bytes, max_bytes, args.factor)
    repeats = args.repeats or (3 if args.quick else 5)
    resnet_repeats = (
        args.resnet_repeats if args.resnet_repeats is not None else (2 if args.quick else 5)
    )
    cap = QUICK_MAX_ITERS if args.quick else MAX_ITERS
    chief = w.rank == 0
    say = print if chief else (lambda *a, **k: None)
    caught = _Warnings()
    logging.getLogger("hpcdist").addHandler(caught)

    override = os.environ.get(ENV_OVERRIDE)
    engine = Collectives(comm)
    gloo = Gloo.start(comm) if not args.no_gloo else Gloo(None, None, "--no-gloo: skipped")
    notes = [gloo.note] if gloo.note else []
    if override:
        notes.append(f"{ENV_OVERRIDE}={override} is set: hpcdist-auto runs what it names")
    phases = {"setup": time.perf_counter() - started}
    try:
        mark = time.perf_counter()
        memcpy = memcpy_bandwidth(comm, MEMCPY_BYTES, repeats, args.stat)
        phases["memcpy"] = time.perf_counter() - mark
        mark = time.perf_counter()
        say(
            f"memcpy roofline: {memcpy:.2f} GB/s per rank ({format_bytes(MEMCPY_BYTES)} "
            f"np.copyto, {w.size} ranks at once)"
        )
        rows = []
        for nbytes in size_list:
            iters = iterations(nbytes, args.iters, cap)
            times = measure_size(
                nbytes,
                comm=comm,
                engine=engine,
                gloo=gloo,
                iters=iters,
                repeats=repeats,
                warmup=args.warmup,
                check=args.check,
            )
            series = summarize_row(
                nbytes, times, ranks=w.size, stat=args.stat, memcpy_gb_per_s=memcpy
            )
            rows.append({"bytes": nbytes, "iters": iters, "checked": args.check, "series": series})
            auto = series[AUTO_SERIES]
            say(
                f"  {format_bytes(nbytes):>8}: raw {series[RAW]['seconds'] * 1e6:10.1f} us, "
                f"auto {auto['seconds'] * 1e6:10.1f} us ({auto['busbw_ratio_to_raw']:.2f}x busbw)",
                flush=True,
            )
        phases["sweep"] = time.perf_counter() - mark
        mark = time.perf_counter()
        resnet = None
        if resnet_repeats:
            resnet = measure_resnet(
                comm=comm,
                engine=engine,
                repeats=resnet_repeats,
                warmup=min(args.warmup, 1),
                check=args.check,
                stat=args.stat,
            )
        phases["resnet50"] = time.perf_counter() - mark
    finally:
        gloo.stop()
        logging.getLogger("hpcdist").removeHandler(caught)
    elapsed = comm.allreduce(time.perf_counter() - started, op=mpi().MAX)
    if not chief:
        return 0

    names = [RAW, *(series_name(b) for b in BACKENDS)] + (
        [GLOO] if GLOO in rows[0]["series"] else []
    )
    targets = evaluate_targets(rows, resnet)
    name = args.name or ("allreduce" if w.size == TARGET_RANKS else f"allreduce_mpi{w.size}")
    command = f"mpirun -n {w.size} {prog} " + " ".join(argv if argv is not None else sys.argv[1:])
    report = {
        "benchmark": "all-reduce float32 SUM: hpcdist engine vs raw mpi4py (and torch gloo)",
        "command": command.strip(),
        "ranks": w.size,
        "nodes": w.node_count,
        "virtual_nodes": w.virtual_nodes,
        "mpi_library": library_version(),
        "machine": platform.platform(),
        "python": platform.python_version(),
        "dtype": "float32",
        "op": "SUM",
        "statistic": args.stat,
        "repeats": repeats,
        "warmup": args.warmup,
        "check": args.check,
        "bandwidth_definition": "algbw = bytes / seconds / 1e9; busbw = algbw * 2 (n - 1) / n",
        ENV_OVERRIDE: override,
        "series": names,
        "notes": notes,
        "engine_warnings": caught.messages,
        "memcpy": {"bytes": MEMCPY_BYTES, "gb_per_s": memcpy},
        "rows": rows,
        "resnet50": resnet,
        "targets_defined_for_ranks": TARGET_RANKS,
        "targets": targets,
        "elapsed_seconds": elapsed,
        "phase_seconds_rank0": phases,
    }
    print()
    print(
        f"all-reduce float32 SUM, {w.size} ranks on {w.node_count} node(s), "
        f"{library_version().split(',')[0]}; {args.stat} of {repeats} repetitions; "
        f"memcpy roofline {memcpy:.2f} GB/s per rank"
    )
    print(
        "latency in us; algbw and busbw in GB/s (busbw = algbw * 2(n-1)/n); "
        "bus/raw > 1 and lat/raw < 1 are better than raw MPI"
    )
    print(format_table(rows, names))
    for note in notes + caught.messages:
        print(f"note: {note}")
    if resnet:
        s = resnet["seconds"]
        print()
        print(
            f"ResNet-50 gradients: {resnet['tensors']} float32 tensors, "
            f"{resnet['parameters']:,} parameters ({resnet['bytes'] / 1e6:.1f} MB)"
        )
        print(f"  hpcdist allreduce of the list (AUTO)   {s['hpcdist'] * 1e3:10.2f} ms")
        print(f"  per-tensor comm.Allreduce loop         {s['loop'] * 1e3:10.2f} ms")
        print(f"  one comm.Allreduce, single buffer      {s['single'] * 1e3:10.2f} ms")
        print(
            f"  loop / hpcdist = {resnet['loop_over_hpcdist']:.2f}x, "
            f"hpcdist / single = {resnet['hpcdist_over_single']:.2f}x"
        )
    print()
    print(f"targets (defined for {TARGET_RANKS} ranks; this run has {w.size}):")
    for t in targets:
        measured = "-" if t["measured"] is None else f"worst {t['measured']:.2f}x"
        print(f"  {t['status']:<7} {t['name']} ({t['series']}): {measured}")
    path = save_report(name, report, args.out)
    plot = save_line_plot(
        name,
        [r["bytes"] for r in rows],
        {n: [r["series"][n]["busbw_gb_per_s"] for r in rows] for n in names},
        folder=args.out,
        xlabel="message size (bytes)",
        ylabel="bus bandwidth (GB/s)",
        title=f"All-reduce float32 SUM, {w.size} ranks, {args.stat} of {repeats}",
        loglog=True,
        references={f"memcpy {memcpy:.1f} GB/s": memcpy},
    )
    spent = ", ".join(f"{k} {v:.1f} s" for k, v in phases.items())
    print(f"wrote {path}" + (f" and {plot}" if plot else "") + f"; {elapsed:.1f} s ({spent})")
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
