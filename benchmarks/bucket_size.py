"""Which bucket size (``bytes_per_pack``) makes the shared-memory allreduce fastest.

Run: ``mpirun -n 2 python benchmarks/bucket_size.py``. For fp32 allreduces of
1, 4, 16 and 64 MiB it times raw ``Comm.Allreduce`` and the hpcdist engine
with buckets of 128 KiB to 4 MiB, side by side (best of 5 after a warm-up),
and writes ``benchmarks/results/bucket_size.json``. The engine's default
(``hpcdist.collectives.choice.DEFAULT_BUCKET_BYTES``) is the fastest size found.
"""

from __future__ import annotations

import time

import numpy as np
from common import save_report

from hpcdist.collectives import Collectives, CommunicationOptions
from hpcdist.runtime import mpi

SIZES = [1 << 20, 4 << 20, 16 << 20, 64 << 20]
BUCKETS = [128 << 10, 256 << 10, 512 << 10, 1 << 20, 2 << 20, 4 << 20]


def best_us(comm, fn, iters: int, repeats: int = 5) -> float:
    """The fastest of ``repeats`` timings of ``iters`` calls, in microseconds per call."""
    best = float("inf")
    for _ in range(repeats):
        comm.Barrier()
        start = time.perf_counter()
        for _ in range(iters):
            fn()
        elapsed = comm.allreduce(time.perf_counter() - start, op=mpi().MAX)
        best = min(best, elapsed / iters * 1e6)
    return best


def main() -> None:
    MPI = mpi()
    comm = MPI.COMM_WORLD
    engine = Collectives(comm)
    rows = []
    for nbytes in SIZES:
        x = np.ones(nbytes // 4, np.float32)
        iters = max(3, min(100, (256 << 20) // nbytes // 4))
        comm.Allreduce(MPI.IN_PLACE, x, MPI.SUM)
        row = {"bytes": nbytes, "raw_us": best_us(comm, lambda x=x: comm.Allreduce(
            MPI.IN_PLACE, x, MPI.SUM), iters), "hpcdist_us": {}}
        for bucket in BUCKETS:
            opts = CommunicationOptions(bytes_per_pack=bucket, implementation="SHM")
            engine.allreduce([x], "SUM", opts)
            row["hpcdist_us"][bucket] = best_us(
                comm, lambda x=x, o=opts: engine.allreduce([x], "SUM", o), iters
            )
        rows.append(row)
        if comm.rank == 0:
            cells = "  ".join(f"{b >> 10}K {t:8.0f}" for b, t in row["hpcdist_us"].items())
            print(f"{nbytes >> 20:>3} MiB  raw {row['raw_us']:8.0f} us  {cells}", flush=True)
    if comm.rank == 0:
        totals = {b: sum(r["hpcdist_us"][b] / r["raw_us"] for r in rows) for b in BUCKETS}
        fastest = min(totals, key=totals.get)
        print(f"fastest bucket over these sizes (sum of time / raw): {fastest >> 10} KiB")
        save_report(
            "bucket_size",
            {"ranks": comm.size, "rows": rows, "fastest_bucket_bytes": fastest,
             "command": "mpirun -n 2 python benchmarks/bucket_size.py"},
        )


if __name__ == "__main__":
    main()
