"""The cost of checked collectives: hpcdist allreduce blocking vs checked vs raw mpi4py.

Checked mode (a timeout in effect: ``CommunicationOptions(timeout_seconds=...)``,
``set_default_timeout`` or ``HPCDIST_TIMEOUT_SECONDS``) adds, per call, a sequence
number in the agreement digest, two arrival-board writes (an RMA lock on the own
rank each) and sleeping waits instead of blocking ones. This measures what that costs
for a small (4 KiB) and a large (64 MiB) float32 SUM allreduce, on the default
path (AUTO: shared memory on one node) and on the MPI path, against raw mpi4py
``Comm.Allreduce`` on the same buffers, same ranks, same run. The variants run
interleaved, round after round, so a busy machine slows them alike.

Writes ``benchmarks/results/checked_collectives.json``.
Run: ``mpirun -n 2 python benchmarks/checked_collectives.py``.
"""

from __future__ import annotations

import os
import platform
import time
from typing import Any

import numpy as np
from common import save_report  # noqa: E402  (benchmarks/ is on sys.path)

from hpcdist.collectives import Collectives, CommunicationOptions
from hpcdist.collectives.arrivals import ArrivalBoard
from hpcdist.runtime import library_version, mpi, world

SIZES = {"4 KiB": 4 << 10, "64 MiB": 64 << 20}
ROUNDS = {"4 KiB": 200, "64 MiB": 8}
CALLS_PER_ROUND = {"4 KiB": 20, "64 MiB": 2}
TIMEOUT = 600.0


def variants(comm, engine: Collectives, buf: np.ndarray) -> dict:
    """name -> a function running one allreduce of ``buf``."""
    MPI = mpi()
    options = {
        f"hpcdist {mode} {impl}": CommunicationOptions(
            timeout_seconds=TIMEOUT if mode == "checked" else None, implementation=impl
        )
        for impl in ("AUTO", "MPI")
        for mode in ("blocking", "checked")
    }
    out = np.empty_like(buf)
    runs = {"raw mpi4py Allreduce": lambda: comm.Allreduce(buf, out, op=MPI.SUM)}
    for name, opts in options.items():
        runs[name] = lambda opts=opts: engine.allreduce([buf], "SUM", opts, out=[out])
    return runs


def measure(comm, runs: dict, rounds: int, calls: int) -> dict[str, float]:
    """Median seconds per call of each variant (slowest rank), interleaved rounds."""
    MPI = mpi()
    samples: dict[str, list[float]] = {name: [] for name in runs}
    for run in runs.values():  # warm-up: layouts, kernels, windows, the board
        run()
        run()
    for _ in range(rounds):
        for name, run in runs.items():
            comm.Barrier()
            t0 = time.perf_counter()
            for _ in range(calls):
                run()
            samples[name].append((time.perf_counter() - t0) / calls)
    return {
        name: comm.allreduce(float(np.median(values)), op=MPI.MAX)
        for name, values in samples.items()
    }


def board_cost(comm: Any, calls: int = 20000) -> float:
    """Seconds of one arrival-board enter + leave (this rank's record, no other rank).

    The board is the one a checked collective uses (collective to create and free).
    """
    board = ArrivalBoard(comm)
    t0 = time.perf_counter()
    for seq in range(1, calls + 1):
        board.enter(seq, "allreduce(op=SUM, [float32(1024,)], timeout set)")
        board.leave(seq)
    seconds = (time.perf_counter() - t0) / calls
    board.free()
    return seconds


def main() -> None:
    w = world()
    comm = w.comm.Dup()
    engine = Collectives(comm)
    engine.barrier(CommunicationOptions(timeout_seconds=TIMEOUT))  # sets the board up
    board_seconds = comm.allreduce(board_cost(comm), op=mpi().MAX)
    rows = []
    for label, nbytes in SIZES.items():
        buf = np.ones(nbytes // 4, dtype=np.float32)
        seconds = measure(comm, variants(comm, engine, buf), ROUNDS[label], CALLS_PER_ROUND[label])
        raw = seconds["raw mpi4py Allreduce"]
        for name, s in seconds.items():
            rows.append(
                {"size": label, "bytes": nbytes, "variant": name, "seconds": s, "vs_raw": s / raw}
            )
        for impl in ("AUTO", "MPI"):
            blocking = seconds[f"hpcdist blocking {impl}"]
            checked = seconds[f"hpcdist checked {impl}"]
            rows.append(
                {
                    "size": label,
                    "bytes": nbytes,
                    "variant": f"checked / blocking {impl}",
                    "ratio": checked / blocking,
                    "extra_seconds": checked - blocking,
                }
            )
    engine.close()
    comm.Free()
    if w.rank != 0:
        return
    report = {
        "benchmark": "allreduce float32 SUM: hpcdist blocking vs checked (timeout set) vs mpi4py",
        "ranks": w.size,
        "nodes": w.node_count,
        "mpi_library": library_version(),
        "machine": platform.platform(),
        "note": "median per call over interleaved rounds, slowest rank; one run",
        "load_average_1min": os.getloadavg()[0],
        "cpu_cores": os.cpu_count(),
        "board_enter_leave_seconds": board_seconds,
        "rows": rows,
    }
    path = save_report("checked_collectives", report)
    print(f"{'size':>7} {'variant':<28} {'us/call':>12} {'vs raw':>7}")
    for r in rows:
        if "seconds" in r:
            us = r["seconds"] * 1e6
            print(f"{r['size']:>7} {r['variant']:<28} {us:>12.1f} {r['vs_raw']:>7.2f}")
        else:
            print(
                f"{r['size']:>7} {r['variant']:<28} {'ratio':>12} {r['ratio']:>7.3f} "
                f"({r['extra_seconds'] * 1e6:+.1f} us)"
            )
    print(f"arrival board enter + leave: {board_seconds * 1e6:.2f} us per call")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
