"""Parameter server against MultiWorkerMirrored: samples per second on the same model and ranks.

One run, the same ranks, the same MLP (hidden ``--hidden`` x ``--layers`` on
``--features`` inputs), the same per-worker batch of synthetic data and the same
optimizer (SGD with momentum):

1. MultiWorkerMirroredStrategy over all N ranks: every step is one fused
   gradient allreduce; samples/s = N x batch x steps / wall time.
2. ParameterServerStrategy with 1 ps rank and N - 1 workers: every step pulls
   the variables, pushes the gradients, and the ps applies them as they come;
   samples/s = (N - 1) x batch x steps / the slowest worker's wall time.

The PS run also reports the staleness the ps saw: for each applied gradient,
how many updates of the variable landed between the read the gradient was
computed from and the update itself (0 = as fresh as synchronous training).
BLAS and Numba use one thread per rank.

Run: ``mpirun -n 4 --oversubscribe python benchmarks/ps_vs_mwms.py [--steps 60]``;
results in ``benchmarks/results/ps_vs_mwms.json`` and ``.png``.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Any

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMBA_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import numpy as np  # noqa: E402
from common import pyplot, save_report  # noqa: E402

import hpcdist as hd  # noqa: E402
from hpcdist.cluster.mpi import MPIClusterResolver  # noqa: E402
from hpcdist.nn import Dense, Sequential  # noqa: E402
from hpcdist.nn.losses import Reduction, SparseCategoricalCrossentropy  # noqa: E402


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=60, help="timed steps per worker")
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--batch", type=int, default=64, help="examples per worker and step")
    p.add_argument("--features", type=int, default=64)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--classes", type=int, default=10)
    return p.parse_args(argv)


def train(strategy: Any, args: argparse.Namespace, seed: int, barrier: Any) -> tuple[float, int]:
    """Wall seconds of ``args.steps`` custom-loop steps on this worker, and the parameters."""
    with strategy.scope():
        layers = [Dense(args.hidden, activation="relu", input_shape=(args.features,))]
        layers += [Dense(args.hidden, activation="relu") for _ in range(args.layers - 1)]
        model = Sequential([*layers, Dense(args.classes)])
        optimizer = hd.optimizers.SGD(learning_rate=0.01, momentum=0.9)
        loss_object = SparseCategoricalCrossentropy(from_logits=True, reduction=Reduction.NONE)
    global_batch = args.batch * strategy.num_replicas_in_sync

    def compute_loss(labels: Any, logits: Any) -> Any:
        per_example = loss_object(labels, logits)
        return hd.nn.compute_average_loss(per_example, global_batch_size=global_batch)

    grad_fn = hd.nn.value_and_grad(model, compute_loss)

    def step(x: np.ndarray, y: np.ndarray) -> Any:
        loss, grads = grad_fn(x, y)
        optimizer.apply_gradients(zip(grads, model.trainable_variables, strict=True))
        return loss

    rng = np.random.default_rng(seed)
    x = rng.normal(size=(args.batch, args.features)).astype(np.float32)
    y = rng.integers(0, args.classes, size=args.batch)
    for _ in range(args.warmup):
        strategy.run(step, args=(x, y))
    barrier()
    start = time.perf_counter()
    for _ in range(args.steps):
        strategy.run(step, args=(x, y))
    elapsed = time.perf_counter() - start
    return elapsed, int(sum(v.size for v in model.trainable_variables))


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    comm = hd.world().comm
    size, rank = comm.Get_size(), comm.Get_rank()
    if size < 2:
        print("run under mpirun with at least 2 ranks (1 ps + 1 worker)", file=sys.stderr)
        return 2

    mwms = hd.MultiWorkerMirroredStrategy()
    seconds, params = train(mwms, args, seed=rank, barrier=comm.Barrier)
    mwms_wall = comm.allreduce(seconds, op=hd.runtime.mpi().MAX)
    mwms_rate = size * args.batch * args.steps / mwms_wall

    resolver = MPIClusterResolver(jobs={"ps": 1, "worker": size - 1})
    workers = comm.Split(1 if resolver.task_type == "ps" else 0, rank)
    ps = hd.ParameterServerStrategy(resolver, exit_after_serving=False)
    if ps.is_ps:
        ps_seconds, served = 0.0, ps.served
    else:
        ps_seconds, _ = train(ps, args, seed=rank, barrier=workers.Barrier)
        workers.Barrier()
        ps.shutdown()
        served = None
    workers.Free()
    ps_wall = comm.allreduce(ps_seconds, op=hd.runtime.mpi().MAX)
    stats = comm.bcast(served, root=0)  # rank 0 is the ps: its final statistics
    ps_rate = (size - 1) * args.batch * args.steps / ps_wall
    if rank != 0:
        return 0
    count = max(stats["staleness_count"], 1)
    report = {
        "ranks": size,
        "model": {"features": args.features, "hidden": args.hidden, "layers": args.layers,
                  "classes": args.classes, "params": params},  # fmt: skip
        "batch_per_worker": args.batch,
        "steps_per_worker": args.steps,
        "mwms": {"workers": size, "wall_s": mwms_wall, "samples_per_s": mwms_rate},
        "ps": {"ps_tasks": 1, "workers": size - 1, "wall_s": ps_wall, "samples_per_s": ps_rate},
        "ps_over_mwms": ps_rate / mwms_rate,
        "staleness": {
            "mean": stats["staleness_sum"] / count,
            "max": stats["staleness_max"],
            "histogram": stats["staleness_hist"],
            "applies": stats["staleness_count"],
        },
    }
    print(f"{size} ranks, MLP {args.features}-{args.hidden}x{args.layers}-{args.classes} "
          f"({params} params), batch {args.batch} per worker, {args.steps} steps")  # fmt: skip
    print(f"MultiWorkerMirrored, {size} workers:      {mwms_rate:10.0f} samples/s")
    print(f"ParameterServer, 1 ps + {size - 1} workers: {ps_rate:10.0f} samples/s "
          f"({ps_rate / mwms_rate:.2f}x)")  # fmt: skip
    print(f"staleness: mean {report['staleness']['mean']:.2f}, max {stats['staleness_max']} "
          f"updates over {stats['staleness_count']} applied gradients")  # fmt: skip
    path = save_report("ps_vs_mwms", report)
    plot(report)
    print(f"wrote {path}")
    return 0


def plot(report: dict) -> None:
    plt = pyplot()
    if plt is None:
        return
    from common import RESULTS

    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    names = [f"MWMS\n{report['mwms']['workers']} workers",
             f"PS\n1 ps + {report['ps']['workers']} workers"]  # fmt: skip
    left.bar(names, [report["mwms"]["samples_per_s"], report["ps"]["samples_per_s"]])
    left.set_ylabel("samples / s")
    left.set_title(f"{report['ranks']} ranks, {report['model']['params']} params")
    hist = report["staleness"]["histogram"]
    right.bar(range(len(hist)), hist)
    right.set_xlabel("staleness (updates; last bar: that many or more)")
    right.set_ylabel("applied gradients")
    right.set_title(f"PS staleness, mean {report['staleness']['mean']:.2f}")
    fig.tight_layout()
    fig.savefig(RESULTS / "ps_vs_mwms.png", dpi=120)


if __name__ == "__main__":
    sys.exit(main())
