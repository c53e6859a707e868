"""What the strategy layer costs on top of raw MPI: all-reduce latency, side by side.

For float32 sizes from 4 B to 4 MiB, on the same buffers and ranks in one run:

* ``raw``: mpi4py ``Comm.Allreduce`` in place (the baseline);
* ``engine``: ``hpcdist.collectives.Collectives.allreduce`` (new result arrays,
  metadata check, float sums reduced to one rank and broadcast for bitwise
  identical results);
* ``run-1``: ``strategy.run`` of ``ReplicaContext.all_reduce`` under
  ``MultiWorkerMirroredStrategy``, one replica per rank;
* ``run-2``: the same with 2 logical CPU devices per rank (replica threads).

Writes ``benchmarks/results/strategy_overhead.json`` and ``.png``.

Run: ``mpirun -n 2 python benchmarks/strategy_overhead.py``.
"""

from __future__ import annotations

import platform
import time

import numpy as np
from common import save_line_plot, save_report  # noqa: E402  (benchmarks/ is on sys.path)

import hpcdist as hd
from hpcdist.collectives import Collectives
from hpcdist.runtime import library_version, mpi, world

SIZES = [4 * 4**k for k in range(11)]  # 4 B .. 4 MiB


def median_seconds(comm, call, repeats: int) -> float:
    """Median seconds of ``call()`` over ``repeats``, the slowest rank's."""
    call()  # warm-up
    times = []
    for _ in range(repeats):
        comm.Barrier()
        t0 = time.perf_counter()
        call()
        times.append(time.perf_counter() - t0)
    return comm.allreduce(float(np.median(times)), op=mpi().MAX)


def main() -> None:
    w = world()
    MPI = mpi()
    engine = Collectives(w.comm)
    one = hd.MultiWorkerMirroredStrategy()
    two = hd.MultiWorkerMirroredStrategy(devices=["/cpu:0", "/cpu:1"])
    rows = []
    for nbytes in SIZES:
        buf = np.ones(nbytes // 4, dtype=np.float32)
        repeats = max(10, min(300, (16 << 20) // max(nbytes, 1) // 4))

        def replica_fn(x=buf):
            return hd.get_replica_context().all_reduce("SUM", x)

        series = {
            "raw": lambda b=buf: w.comm.Allreduce(MPI.IN_PLACE, b, op=MPI.SUM),
            "engine": lambda b=buf: engine.allreduce([b], "SUM"),
            "run-1": lambda f=replica_fn: one.run(f),
            "run-2": lambda f=replica_fn: two.run(f),
        }
        row = {"bytes": nbytes}
        for name, call in series.items():
            row[name] = median_seconds(w.comm, call, repeats)
        rows.append(row)
    if w.rank != 0:
        return
    names = ["raw", "engine", "run-1", "run-2"]
    print(f"{w.size} ranks, {library_version().split(',')[0]}; median latency in us (ratio to raw)")
    print(f"{'bytes':>9} " + " ".join(f"{n:>18}" for n in names))
    for r in rows:
        cells = [f"{r[n] * 1e6:>9.1f} ({r[n] / r['raw']:>5.2f}x)" for n in names]
        print(f"{r['bytes']:>9} " + " ".join(f"{c:>18}" for c in cells))
    report = {
        "benchmark": "all-reduce latency: raw mpi4py vs engine vs strategy.run (float32 SUM)",
        "ranks": w.size,
        "mpi_library": library_version(),
        "machine": platform.platform(),
        "command": f"mpirun -n {w.size} python benchmarks/strategy_overhead.py",
        "rows": rows,
    }
    path = save_report("strategy_overhead", report)
    save_line_plot(
        "strategy_overhead",
        [r["bytes"] for r in rows],
        {name: [r[name] * 1e6 for r in rows] for name in names},
        xlabel="message size (bytes)",
        ylabel="median latency (us)",
        title=f"All-reduce through the strategy layer, {w.size} ranks",
        loglog=True,
    )
    print(f"wrote {path} and .png")


if __name__ == "__main__":
    main()
