"""Input pipeline throughput: hpcdist.data vs a hand-written NumPy loop, side by side.

Both read the same 1,000,000 x 64 float32 array in a shuffled order, in
global batches of 1024 split over 2 replicas:

* ``numpy``: ``perm = rng.permutation(n)``, then ``x[perm[i:i + 1024]]`` cut in two;
* ``hpcdist``: ``Dataset.from_tensor_slices(x).shuffle(n, seed).batch(1024)``
  through ``MirroredStrategy(["/cpu:0", "/cpu:1"]).experimental_distribute_dataset``.

Under ``mpirun -n 2`` it also times a ``MultiWorkerMirroredStrategy`` epoch
(1 replica per rank, DATA sharding, one tiny end-of-data all-reduce per
step), per step in microseconds, read ahead by the input thread (the default
with several workers) and in the caller's thread
(``experimental_per_replica_buffer_size=0``), next to a raw ``Comm.Allreduce``
of one integer.

Each series is timed best of 5 epochs, the two taking turns. Writes
``benchmarks/results/input_pipeline.json`` (``ratio``: numpy's time over
hpcdist's) and ``.png``.

Run: ``python benchmarks/input_pipeline.py`` and
``mpirun -n 2 python benchmarks/input_pipeline.py``.
"""

from __future__ import annotations

import platform
import time

import numpy as np
from common import RESULTS, pyplot, save_report  # noqa: E402  (benchmarks/ is on sys.path)

import hpcdist as hd
from hpcdist.data.dataset import Dataset
from hpcdist.runtime import mpi, world

N, D, BATCH = 1_000_000, 64, 1024


def numpy_epoch(x: np.ndarray, seed: int) -> int:
    rng = np.random.default_rng(seed)
    perm = rng.permutation(len(x))
    steps = 0
    for i in range(0, len(x), BATCH):
        batch = x[perm[i : i + BATCH]]
        half = (len(batch) + 1) // 2
        _ = (batch[:half], batch[half:])
        steps += 1
    return steps


def hpcdist_dataset(x: np.ndarray, seed: int) -> Dataset:
    return Dataset.from_tensor_slices(x).shuffle(len(x), seed=seed).batch(BATCH)


def hpcdist_epoch(strategy, x: np.ndarray, seed: int, options=None) -> int:
    steps = 0
    for _ in strategy.experimental_distribute_dataset(hpcdist_dataset(x, seed), options):
        steps += 1
    return steps


def best_of(*fns, repeats: int = 5) -> list[tuple[float, int]]:
    """The best time (and step count) of each ``fn(repeat)``, the fns taking turns.

    Taking turns exposes every series to the same slow and fast moments of a
    shared VM, so their ratio varies less from run to run than the timings do.
    """
    best = [(float("inf"), 0)] * len(fns)
    for r in range(repeats):
        for i, fn in enumerate(fns):
            t0 = time.perf_counter()
            steps = fn(r)
            best[i] = (min(best[i][0], time.perf_counter() - t0), steps)
    return best


def main() -> None:
    w = world()
    x = np.random.default_rng(0).standard_normal((N, D), dtype=np.float32)
    report: dict = {
        "benchmark": "input pipeline, 1M x 64 float32, shuffle + batch 1024 over 2 replicas",
        "machine": platform.platform(),
        "ranks": w.size,
        "command": (f"mpirun -n {w.size} " if w.size > 1 else "")
        + "python benchmarks/input_pipeline.py",
    }
    if w.size == 1:
        mirrored = hd.MirroredStrategy(["/cpu:0", "/cpu:1"])
        (t_np, steps), (t_hd, steps_hd) = best_of(
            lambda r: numpy_epoch(x, r), lambda r: hpcdist_epoch(mirrored, x, r)
        )
        assert steps == steps_hd, (steps, steps_hd)
        report["rows"] = [
            {"series": "numpy", "seconds": t_np, "batches_per_s": steps / t_np},
            {"series": "hpcdist", "seconds": t_hd, "batches_per_s": steps / t_hd},
        ]
        report["ratio"] = t_np / t_hd
        it = iter(mirrored.experimental_distribute_dataset(hpcdist_dataset(x, 0)))
        report["reads_ahead_in_a_thread"] = it.reads_ahead
        it.close()
        print(f"numpy   {steps / t_np:10.1f} batches/s")
        print(f"hpcdist {steps / t_hd:10.1f} batches/s  ({100 * t_np / t_hd:.0f}% of numpy)")
        name = "input_pipeline"
    else:
        strategy = hd.MultiWorkerMirroredStrategy()
        MPI = mpi()
        flag = np.zeros(1, np.int64)
        w.comm.Barrier()
        t0 = time.perf_counter()
        for _ in range(1000):
            w.comm.Allreduce(MPI.IN_PLACE, flag, op=MPI.MAX)
        raw_us = (time.perf_counter() - t0) / 1000 * 1e6
        in_caller = hd.InputOptions(experimental_per_replica_buffer_size=0)
        (t_hd, steps), (t_sync, _) = best_of(
            lambda r: hpcdist_epoch(strategy, x, r),
            lambda r: hpcdist_epoch(strategy, x, r, in_caller),
            repeats=2,
        )
        per_step_us = t_hd / steps * 1e6
        sync_us = t_sync / steps * 1e6
        report["rows"] = [
            {"series": "hpcdist MWMS epoch", "seconds": t_hd, "steps": steps},
            {"series": "raw 1-int Allreduce", "microseconds": raw_us},
            {"series": "hpcdist step", "microseconds": per_step_us},
            {"series": "hpcdist step, read in the caller's thread", "microseconds": sync_us},
        ]
        if w.rank == 0:
            print(
                f"MWMS epoch over {w.size} ranks: {steps} steps in {t_hd:.2f} s "
                f"({per_step_us:.0f} us per step; {sync_us:.0f} us read in the caller's "
                f"thread); raw agreement Allreduce {raw_us:.1f} us"
            )
        name = f"input_pipeline_mpi{w.size}"
    if w.rank != 0:
        return
    path = save_report(name, report)
    plt = pyplot()
    if plt is None:
        return
    if w.size == 1:
        fig, ax = plt.subplots(figsize=(5, 3.5))
        rows = report["rows"]
        ax.bar([r["series"] for r in rows], [r["batches_per_s"] for r in rows])
        ax.set_ylabel("batches of 1024 per second")
        ax.set_title("shuffle + batch over 2 replicas")
        fig.tight_layout()
        fig.savefig(RESULTS / f"{name}.png", dpi=100)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
