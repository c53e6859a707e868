"""Baseline: raw mpi4py ``Comm.Allreduce`` bandwidth on this machine.

The collectives engine is measured against these numbers (same buffers, same
ranks, one run). Writes ``benchmarks/results/mpi_baseline.json`` and ``.png``.

Run: ``make bench`` or ``mpirun -n 2 python benchmarks/mpi_baseline.py``.
"""

from __future__ import annotations

import platform
import time

import numpy as np
from common import save_line_plot, save_report  # noqa: E402  (benchmarks/ is on sys.path)

from hpcdist.runtime import library_version, mpi, world

SIZES = [2**k for k in range(12, 27, 2)]  # 4 KiB .. 64 MiB


def time_allreduce(comm, nbytes: int, repeats: int) -> float:
    """Median seconds of one in-place float32 SUM allreduce of ``nbytes``."""
    MPI = mpi()
    buf = np.ones(nbytes // 4, dtype=np.float32)
    comm.Allreduce(MPI.IN_PLACE, buf, op=MPI.SUM)  # warm-up
    times = []
    for _ in range(repeats):
        comm.Barrier()
        t0 = time.perf_counter()
        comm.Allreduce(MPI.IN_PLACE, buf, op=MPI.SUM)
        times.append(time.perf_counter() - t0)
    # The slowest rank decides when a collective is done.
    return comm.allreduce(float(np.median(times)), op=MPI.MAX)


def main() -> None:
    w = world()
    rows = []
    for nbytes in SIZES:
        repeats = max(5, min(200, (64 << 20) // nbytes // 4))
        seconds = time_allreduce(w.comm, nbytes, repeats)
        # Bus bandwidth as in nccl-tests: 2 (n-1)/n bytes cross each link.
        busbw = 2 * (w.size - 1) / w.size * nbytes / seconds / 1e9
        rows.append({"bytes": nbytes, "seconds": seconds, "bus_gb_per_s": busbw})
    if w.rank != 0:
        return
    report = {
        "benchmark": "mpi4py Comm.Allreduce float32 SUM, in place",
        "ranks": w.size,
        "nodes": w.node_count,
        "mpi_library": library_version(),
        "machine": platform.platform(),
        "rows": rows,
    }
    path = save_report("mpi_baseline", report)
    print(f"{'bytes':>10} {'ms':>10} {'bus GB/s':>9}")
    for r in rows:
        print(f"{r['bytes']:>10} {r['seconds'] * 1e3:>10.3f} {r['bus_gb_per_s']:>9.2f}")
    save_line_plot(
        "mpi_baseline",
        [r["bytes"] for r in rows],
        {"mpi4py Allreduce": [r["bus_gb_per_s"] for r in rows]},
        xlabel="message size (bytes)",
        ylabel="bus bandwidth (GB/s)",
        title=f"Allreduce baseline, {w.size} ranks, {library_version().split(',')[0]}",
    )
    print(f"wrote {path} and .png")


if __name__ == "__main__":
    main()
