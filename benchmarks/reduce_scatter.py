"""The engine's reduce_scatter against its allreduce, on the ZeRO-2 buckets of torch_zero.py.

A reduce-scatter leaves each rank only its block of the sum, so it should
cost clearly less than an allreduce of the same bytes (on one node through
shared memory: no copy of the whole result back to every rank). Per N, in
one job, alternating rounds, medians: the engine's ``allreduce`` and
``reduce_scatter`` (MEAN, AUTO) of the three float32 buckets that
``benchmarks/torch_zero.py``'s MLP makes (4.04, 4.00 and 3.07 MiB: two of
them larger than a 4 MiB shared slot), its ``allgather`` of the blocks
(the ZeRO parameter gather), and MPI's own ``Reduce_scatter_block`` and
``Allreduce`` on the same buffers for reference.

Target: reduce_scatter <= 0.6x the allreduce's time (a real reduce-scatter
moves about half the bytes).

Run: ``python benchmarks/reduce_scatter.py`` (it starts its own ``mpirun``
jobs); results in ``benchmarks/results/reduce_scatter.json`` and ``.png``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

BUCKETS = (1048576 + 1024 + 10240 + 10, 1048576 + 1024, 802816 + 1024)  # torch_zero.py's
VARIANTS = ("allreduce", "reduce_scatter", "allgather", "mpi_allreduce", "mpi_reduce_scatter")
MPI_ENV = {
    "OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
    "OMPI_MCA_rmaps_base_oversubscribe": "1", "PRTE_MCA_rmaps_default_mapping_policy":
    ":oversubscribe", "OMPI_MCA_osc": "^ucx", "OMP_NUM_THREADS": "1",
}


def job(rounds: int, reps: int) -> None:
    """Every variant on this job's ranks; rank 0 prints medians (ms per set of buckets)."""
    from hpcdist.collectives import Collectives
    from hpcdist.runtime import mpi, world

    w = world()
    comm = w.comm
    n = w.size
    c = Collectives(comm)
    rng = np.random.default_rng(w.rank)
    padded = [-(-b // n) * n for b in BUCKETS]
    bufs = [rng.standard_normal(p).astype(np.float32) for p in padded]
    blocks = [np.empty(p // n, np.float32) for p in padded]
    outs = [np.empty_like(b) for b in bufs]
    MPI = mpi()

    def run(name: str) -> None:
        for b, blk, out in zip(bufs, blocks, outs, strict=True):
            if name == "allreduce":
                c.allreduce([b], "MEAN")
            elif name == "reduce_scatter":
                c.reduce_scatter(b, "MEAN")
            elif name == "allgather":
                c.allgather(blk)
            elif name == "mpi_allreduce":
                comm.Allreduce(b, out, MPI.SUM)
            else:
                comm.Reduce_scatter_block(b, blk, MPI.SUM)

    for name in VARIANTS:
        run(name)
    times: dict[str, list[float]] = {k: [] for k in VARIANTS}
    for _ in range(rounds):
        for name in VARIANTS:
            comm.Barrier()
            start = time.perf_counter()
            for _ in range(reps):
                run(name)
            comm.Barrier()
            times[name].append((time.perf_counter() - start) / reps)
    if w.rank == 0:
        print("RESULT " + json.dumps({k: float(np.median(v)) * 1e3 for k, v in times.items()}))


def driver(args: argparse.Namespace) -> None:
    report: dict[str, Any] = {"buckets_bytes": [4 * b for b in BUCKETS], "ms": {},
                              "rounds": args.rounds, "reps": args.reps,
                              "target_reduce_scatter_vs_allreduce_max": 0.6}
    for n in args.sizes:
        cmd = [str(Path(sys.executable).parent / "mpirun"), "-n", str(n), sys.executable,
               __file__, "--job", "--rounds", str(args.rounds), "--reps", str(args.reps)]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=600,
                              env={**os.environ, **MPI_ENV})
        lines = [x for x in done.stdout.splitlines() if x.startswith("RESULT ")]
        if not lines:
            raise RuntimeError(f"{' '.join(cmd)} failed:\n{done.stdout[-2000:]}\n"
                               f"{done.stderr[-2000:]}")
        ms = json.loads(lines[0][7:])
        ms["reduce_scatter_vs_allreduce"] = ms["reduce_scatter"] / ms["allreduce"]
        report["ms"][f"n{n}"] = ms
        print(f"N={n}: " + ", ".join(f"{k} {v:.2f}" for k, v in ms.items()), flush=True)
    sys.path.insert(0, str(Path(__file__).parent))
    from common import RESULTS, pyplot, save_report

    save_report("reduce_scatter", report)
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 3.6))
    keys = list(report["ms"])
    width = 0.16
    for k, name in enumerate(VARIANTS):
        ax.bar(np.arange(len(keys)) + (k - 2) * width, [report["ms"][n][name] for n in keys],
               width, label=name)
    ax.set_xticks(np.arange(len(keys)))
    ax.set_xticklabels([f"N={n[1:]}" for n in keys])
    ax.set_ylabel("ms for the 3 buckets (11.1 MiB)")
    ax.set_title("engine reduce_scatter vs allreduce (float32, MEAN)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(RESULTS / "reduce_scatter.png", dpi=100)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--job", action="store_true")
    p.add_argument("--rounds", type=int, default=10)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--sizes", type=int, nargs="+", default=[2, 4])
    args = p.parse_args()
    if args.job:
        job(args.rounds, args.reps)
    else:
        driver(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
