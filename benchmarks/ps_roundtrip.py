"""Parameter-server round trips: push (assign) then pull one variable, against raw MPI.

On 2 ranks, rank 0 serves (``hpcdist.distribute.ps.server.serve``) and rank 1 is the
client (``PSClient``). For each size, one round trip is ``client.update(assign)`` of the
whole array followed by ``client.pull`` of it into a preallocated array: two array
transfers plus one request header and one reply header. The baseline is the same two
transfers with plain ``comm.Send``/``Recv`` of the array (a raw echo), so the ratio is
what the ps protocol adds (headers, dispatch, the copy into the variable).

``--label`` names the run and ``--append`` adds it to ``results/ps_roundtrip_runs.json``;
``--report`` writes the comparison (``results/ps_roundtrip.json`` + ``.png``: best of each
label, and with two labels the second's best ps time over the first's), so two hpcdist
trees (e.g. before and after a protocol change, via ``PYTHONPATH``) run in turns under one
lock.

Run: ``mpirun -n 2 python benchmarks/ps_roundtrip.py --label new --append``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMBA_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import numpy as np  # noqa: E402
from common import RESULTS, save_line_plot, save_report  # noqa: E402

SIZES = (8, 4096, 1 << 20, 16 << 20, 64 << 20)  # bytes


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=7, help="best of this many timed rounds")
    p.add_argument("--label", default="current", help="name of this run in the report")
    p.add_argument("--append", action="store_true", help="add this run to the raw runs file")
    p.add_argument("--report", action="store_true", help="write the report of the raw runs")
    p.add_argument("--runs-file", default=None, help="raw runs file (default: in results/)")
    return p.parse_args(argv)


def _iters(nbytes: int) -> int:
    return max(3, min(300, (64 << 20) // max(nbytes, 1) // 4))


def measure(args: argparse.Namespace) -> dict[str, Any] | None:
    """Best seconds per round trip, per size: ps and raw MPI (on the client rank)."""
    from hpcdist.distribute.ps.client import PSClient
    from hpcdist.distribute.ps.server import serve
    from hpcdist.runtime import mpi

    MPI = mpi()
    comm = MPI.COMM_WORLD.Dup()
    rank = comm.Get_rank()
    raw: dict[int, float] = {}
    for nbytes in SIZES:  # raw echo: client sends, server sends back
        buf = np.zeros(nbytes // 8, np.float64)
        best = float("inf")
        for _ in range(args.repeats):
            comm.Barrier()
            t0 = time.perf_counter()
            for _ in range(_iters(nbytes)):
                if rank == 1:
                    comm.Send([buf, MPI.DOUBLE], 0, 5)
                    comm.Recv([buf, MPI.DOUBLE], 0, 6)
                else:
                    comm.Recv([buf, MPI.DOUBLE], 1, 5)
                    comm.Send([buf, MPI.DOUBLE], 1, 6)
            best = min(best, (time.perf_counter() - t0) / _iters(nbytes))
        raw[nbytes] = best
    if rank == 0:
        serve(comm, [1])
        comm.Free()
        return None
    client = PSClient(comm, [0], initializer=True)
    ps: dict[int, float] = {}
    for i, nbytes in enumerate(SIZES):
        value = np.random.default_rng(i).random(nbytes // 8)
        out = np.empty_like(value)
        client.create(0, i, value, f"v{i}")
        best = float("inf")
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            for _ in range(_iters(nbytes)):
                client.update(0, i, "assign", value)
                client.pull(0, [i], [out])
            best = min(best, (time.perf_counter() - t0) / _iters(nbytes))
        assert np.array_equal(out, value)
        ps[nbytes] = best
    client.close()
    comm.Free()
    return {"ps_s": ps, "raw_s": raw}


def report(path: str) -> None:
    """The comparison of the labelled runs in ``path`` (best of each label)."""
    runs = json.loads(open(path, encoding="utf-8").read())
    labels = list(dict.fromkeys(r["label"] for r in runs))
    best: dict[str, dict[str, list[float]]] = {}
    for label in labels:
        mine = [r for r in runs if r["label"] == label]
        best[label] = {
            key: [min(r[key][str(n)] for r in mine) for n in SIZES] for key in ("ps_s", "raw_s")
        }
    rows = []
    for j, n in enumerate(SIZES):
        row: dict[str, Any] = {"bytes": n}
        for label in labels:
            ps, raw = best[label]["ps_s"][j], best[label]["raw_s"][j]
            row[label] = {"ps_us": ps * 1e6, "raw_us": raw * 1e6, "ps_over_raw": ps / raw}
        if len(labels) == 2:  # best ps time against best ps time, and per raw MPI time
            a, b = labels
            row[f"{b}_over_{a}"] = row[b]["ps_us"] / row[a]["ps_us"]
            row[f"{b}_over_{a}_per_raw"] = row[b]["ps_over_raw"] / row[a]["ps_over_raw"]
        rows.append(row)
    data = {
        "what": "ps push(assign)+pull round trip vs raw MPI send+recv echo, 2 ranks, best of runs",
        "labels": labels,
        "runs": {label: sum(r["label"] == label for r in runs) for label in labels},
        "rows": rows,
        "by_bytes": {str(r["bytes"]): r for r in rows},
    }
    save_report("ps_roundtrip", data)
    save_line_plot(
        "ps_roundtrip",
        [float(n) for n in SIZES],
        {f"{label}: ps / raw MPI": [r[label]["ps_over_raw"] for r in rows] for label in labels},
        xlabel="bytes per transfer",
        ylabel="round-trip time / raw MPI echo",
        title="Parameter-server round trip (push + pull) over raw MPI",
    )


def main(argv: list[str] | None = None) -> None:
    args = parse(argv)
    raw_path = args.runs_file or str(RESULTS / "ps_roundtrip_runs.json")
    if args.report:
        report(raw_path)
        return
    out = measure(args)
    if out is None:
        return
    line = {"label": args.label, **{k: {str(n): v for n, v in d.items()} for k, d in out.items()}}
    print(json.dumps(line))
    if args.append:
        runs = json.loads(open(raw_path).read()) if os.path.exists(raw_path) else []
        runs.append(line)
        with open(raw_path, "w", encoding="utf-8") as f:
            json.dump(runs, f, indent=1)
    sys.stdout.flush()


if __name__ == "__main__":
    main()
