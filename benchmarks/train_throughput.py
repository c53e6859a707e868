"""Training throughput: an MLP (hidden 1024 x 3) on 1 rank and on N ranks, in one run.

Weak scaling: every replica gets ``--batch`` examples (256) of synthetic data, so
N ranks do N times the work of one; the efficiency is steps/s on N ranks over
steps/s on 1 rank. The 1-rank figures are taken first, on rank 0, while the other
ranks sleep (they do not spin, so rank 0 has a core to itself); then all ranks
train together under MultiWorkerMirroredStrategy. BLAS and Numba use one thread
per rank. The two are measured in turn, ``--rounds`` times, and the medians are
reported (this host's timings wander by 10% between runs). The run also reports
the share of the step spent in the gradient allreduce, the optimizer's own time
per step (packing when needed, clipping, the fused update)
against one NumPy axpy over the same parameter bytes, and, when torch is
installed, the same model under DistributedDataParallel with gloo, side by side.
Each round also times all ranks training alone at the same moment, with no
communication: the ceiling this host allows (two busy ranks share memory
bandwidth and cache), and how close hpcdist comes to it.

Run: ``mpirun -n 2 python benchmarks/train_throughput.py [--steps 20] [--optimizer sgd]``;
results in ``benchmarks/results/train_throughput.json`` and ``.png``.
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
from hpcdist.nn import Dense, Sequential  # noqa: E402
from hpcdist.nn.losses import Reduction, SparseCategoricalCrossentropy  # noqa: E402


def build(args: argparse.Namespace) -> Sequential:
    layers = [Dense(args.hidden, activation="relu", input_shape=(args.features,))]
    layers += [Dense(args.hidden, activation="relu") for _ in range(args.layers - 1)]
    return Sequential([*layers, Dense(args.classes)])


def make_optimizer(name: str) -> Any:
    if name == "adam":
        return hd.optimizers.Adam(1e-3)
    return hd.optimizers.SGD(learning_rate=0.01, momentum=0.9)


def synthetic(args: argparse.Namespace, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(args.batch, args.features)).astype(np.float32)
    y = rng.integers(0, args.classes, size=args.batch)
    return x, y


class Stopwatch:
    """Adds up the wall time spent inside a wrapped callable."""

    def __init__(self, fn: Any) -> None:
        self.fn = fn
        self.seconds = 0.0

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        try:
            return self.fn(*args, **kwargs)
        finally:
            self.seconds += time.perf_counter() - start


def train(strategy: Any, args: argparse.Namespace, seed: int) -> dict[str, float]:
    """Time ``args.steps`` custom-loop steps; returns seconds per step and its parts."""
    global_batch = args.batch * strategy.num_replicas_in_sync
    with strategy.scope():
        model = build(args)
        optimizer = make_optimizer(args.optimizer)
        loss_object = SparseCategoricalCrossentropy(from_logits=True, reduction=Reduction.NONE)

        def compute_loss(labels: Any, logits: Any) -> Any:
            return hd.nn.compute_average_loss(
                loss_object(labels, logits), global_batch_size=global_batch
            )

    grad_fn = hd.nn.value_and_grad(model, compute_loss)
    apply = Stopwatch(optimizer.apply_gradients)
    optimizer.apply_gradients = apply
    collectives = strategy.extended.collectives
    comm = None
    if collectives is not None:
        comm = Stopwatch(collectives.allreduce)
        collectives.allreduce = comm

    def step(x: np.ndarray, y: np.ndarray) -> Any:
        loss, grads = grad_fn(x, y)
        optimizer.apply_gradients(zip(grads, model.trainable_variables, strict=True))
        return loss

    x, y = synthetic(args, seed)
    for _ in range(args.warmup):
        strategy.run(step, args=(x, y))
    apply.seconds = 0.0
    if comm is not None:
        comm.seconds = 0.0
        collectives.barrier()
    start = time.perf_counter()
    for _ in range(args.steps):
        strategy.run(step, args=(x, y))
    elapsed = time.perf_counter() - start
    if collectives is not None:
        del collectives.allreduce  # back to the class's method
    comm_s = comm.seconds if comm is not None else 0.0
    params = sum(v.size for v in model.trainable_variables)
    return {
        "step_s": elapsed / args.steps,
        "steps_per_s": args.steps / elapsed,
        "comm_s": comm_s / args.steps,
        "optimizer_s": (apply.seconds - comm_s) / args.steps,
        "params": int(params),
    }


def axpy_seconds(params: int, repeats: int = 20) -> dict[str, float]:
    """One NumPy axpy over ``params`` float32: as users write it, and with a reused buffer."""
    rng = np.random.default_rng(0)
    p = rng.normal(size=params).astype(np.float32)
    g = rng.normal(size=params).astype(np.float32)
    tmp = np.empty_like(p)
    naive, two_pass = [], []
    for _ in range(repeats):
        t = time.perf_counter()
        p -= np.float32(0.01) * g
        naive.append(time.perf_counter() - t)
        t = time.perf_counter()
        np.multiply(g, np.float32(-0.01), out=tmp)
        np.add(p, tmp, out=p)
        two_pass.append(time.perf_counter() - t)
    return {"naive_s": float(np.median(naive)), "preallocated_s": float(np.median(two_pass))}


def torch_ddp(args: argparse.Namespace, comm: Any, seed: int) -> dict[str, float] | None:
    """The same model and step under torch DDP (gloo), or ``None`` without torch."""
    try:
        import torch
        import torch.distributed as dist
    except ImportError:
        return None
    torch.set_num_threads(1)
    port = comm.bcast(29500 + int(np.random.default_rng().integers(0, 2000)), root=0)
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=comm.rank, world_size=comm.size
    )
    try:
        torch.manual_seed(0)
        layers: list[Any] = [torch.nn.Linear(args.features, args.hidden), torch.nn.ReLU()]
        for _ in range(args.layers - 1):
            layers += [torch.nn.Linear(args.hidden, args.hidden), torch.nn.ReLU()]
        model = torch.nn.Sequential(*layers, torch.nn.Linear(args.hidden, args.classes))
        ddp = torch.nn.parallel.DistributedDataParallel(model)
        opt = torch.optim.SGD(ddp.parameters(), lr=0.01, momentum=0.9)
        x, y = synthetic(args, seed)
        tx, ty = torch.from_numpy(x), torch.from_numpy(y)
        loss_fn = torch.nn.CrossEntropyLoss()

        def step() -> None:
            opt.zero_grad(set_to_none=True)
            loss_fn(ddp(tx), ty).backward()
            opt.step()

        for _ in range(args.warmup):
            step()
        dist.barrier()
        start = time.perf_counter()
        for _ in range(args.steps):
            step()
        elapsed = time.perf_counter() - start
    finally:
        dist.destroy_process_group()
    return {"step_s": elapsed / args.steps, "steps_per_s": args.steps / elapsed}


def sleep_until_released(comm: Any) -> None:
    """Wait for rank 0 without spinning (so rank 0 measures alone on its core)."""
    request = comm.Ibarrier()
    while not request.Test():
        time.sleep(0.005)


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="MLP training throughput, 1 rank vs N ranks")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--rounds", type=int, default=5, help="1-rank/N-rank pairs; medians reported")
    p.add_argument("--batch", type=int, default=256, help="examples per replica")
    p.add_argument("--features", type=int, default=784)
    p.add_argument("--hidden", type=int, default=1024)
    p.add_argument("--layers", type=int, default=3, help="hidden layers")
    p.add_argument("--classes", type=int, default=10)
    p.add_argument("--optimizer", choices=("sgd", "adam"), default="sgd")
    p.add_argument("--no-torch", action="store_true", help="skip the torch DDP comparison")
    return p.parse_args(argv)


def measure_round(args: argparse.Namespace, comm: Any, strategy: Any) -> tuple[dict, dict]:
    """One round: 1 rank alone (the others sleep), then all ranks together."""
    single = None
    if comm.rank == 0:
        single = train(hd.get_strategy(), args, seed=0)
        comm.Ibarrier().Wait()
    else:
        sleep_until_released(comm)
    single = comm.bcast(single, root=0)
    # Every rank alone at once, no communication: what this host allows N ranks at best.
    alone = train(hd.get_strategy(), args, seed=comm.rank)
    independent = {"steps_per_s": comm.allreduce(alone["steps_per_s"], op=hd.runtime.mpi().MIN)}
    multi = train(strategy, args, seed=comm.rank)
    multi["independent_steps_per_s"] = independent["steps_per_s"]
    multi["comm_s"] = comm.allreduce(multi["comm_s"]) / comm.size
    multi["optimizer_s"] = comm.allreduce(multi["optimizer_s"]) / comm.size
    multi["step_s"] = comm.allreduce(multi["step_s"], op=hd.runtime.mpi().MAX)
    multi["steps_per_s"] = 1.0 / multi["step_s"]
    return single, multi


def median_row(rows: list[dict]) -> dict:
    return {key: float(np.median([r[key] for r in rows])) for key in rows[0]}


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    comm = hd.world().comm
    rank, size = comm.rank, comm.size
    strategy = hd.MultiWorkerMirroredStrategy()
    rounds = [measure_round(args, comm, strategy) for _ in range(args.rounds)]
    efficiencies = [m["steps_per_s"] / s["steps_per_s"] for s, m in rounds]
    ceilings = [m["independent_steps_per_s"] / s["steps_per_s"] for s, m in rounds]
    vs_independent = [m["steps_per_s"] / m["independent_steps_per_s"] for _, m in rounds]
    single = median_row([s for s, _ in rounds])
    multi = median_row([m for _, m in rounds])
    axpy = axpy_seconds(int(single["params"]))
    torch_multi = None
    if not args.no_torch and size > 1:
        torch_multi = torch_ddp(args, comm, seed=rank)
    if rank != 0:
        return 0
    efficiency = float(np.median(efficiencies))
    report = {
        "command": f"mpirun -n {size} python benchmarks/train_throughput.py",
        "model": f"MLP {args.features}-{'x'.join([str(args.hidden)] * args.layers)}-{args.classes}",
        "params": int(single["params"]),
        "batch_per_replica": args.batch,
        "optimizer": args.optimizer,
        "ranks": size,
        "one_rank": single,
        "n_ranks": multi,
        "rounds": args.rounds,
        "weak_scaling_efficiency": efficiency,
        "weak_scaling_efficiency_per_round": efficiencies,
        "host_ceiling": float(np.median(ceilings)),
        "host_ceiling_per_round": ceilings,
        "efficiency_vs_independent_ranks": float(np.median(vs_independent)),
        "comm_share": multi["comm_s"] / multi["step_s"],
        "axpy": axpy,
        "optimizer_vs_axpy_naive": single["optimizer_s"] / axpy["naive_s"],
        "optimizer_vs_axpy_preallocated": single["optimizer_s"] / axpy["preallocated_s"],
        "torch_ddp_gloo": torch_multi,
        "targets": {"weak_scaling_efficiency": ">= 0.85", "optimizer_vs_axpy": "<= 1.5"},
    }
    path = save_report("train_throughput", report)
    print(f"{report['model']}, {report['params']:,} params, batch {args.batch} per replica")
    print(f"{'':<28}{'steps/s':>10}{'step ms':>10}{'comm ms':>10}{'optim ms':>10}")
    for label, row in (("hpcdist, 1 rank", single), (f"hpcdist, {size} ranks", multi)):
        print(
            f"{label:<28}{row['steps_per_s']:>10.2f}{row['step_s'] * 1e3:>10.1f}"
            f"{row['comm_s'] * 1e3:>10.2f}{row['optimizer_s'] * 1e3:>10.2f}"
        )
    if torch_multi is not None:
        print(
            f"{f'torch DDP gloo, {size} ranks':<28}{torch_multi['steps_per_s']:>10.2f}"
            f"{torch_multi['step_s'] * 1e3:>10.1f}"
        )
    print(
        f"weak-scaling efficiency at {size} ranks: {efficiency:.1%} (median of {args.rounds} "
        f"rounds: {', '.join(f'{e:.1%}' for e in efficiencies)}; target >= 85%)"
    )
    print(
        f"{size} ranks training alone at once, no communication: "
        f"{report['host_ceiling']:.1%} of 1 rank (this host's ceiling); hpcdist reaches "
        f"{report['efficiency_vs_independent_ranks']:.1%} of that"
    )
    print(f"communication share of the step: {report['comm_share']:.1%}")
    print(
        f"optimizer per step {single['optimizer_s'] * 1e3:.2f} ms vs NumPy axpy "
        f"{axpy['naive_s'] * 1e3:.2f} ms (p -= lr*g) / {axpy['preallocated_s'] * 1e3:.2f} ms "
        f"(preallocated): {report['optimizer_vs_axpy_naive']:.2f}x / "
        f"{report['optimizer_vs_axpy_preallocated']:.2f}x (target <= 1.5x)"
    )
    plot(report)
    print(f"wrote {path}")
    return 0


def plot(report: dict[str, Any]) -> None:
    plt = pyplot()
    if plt is None:
        return
    labels = ["hpcdist 1 rank", f"hpcdist {report['ranks']} ranks"]
    values = [report["one_rank"]["steps_per_s"], report["n_ranks"]["steps_per_s"]]
    if report["torch_ddp_gloo"] is not None:
        labels.append(f"torch DDP {report['ranks']} ranks")
        values.append(report["torch_ddp_gloo"]["steps_per_s"])
    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.bar(labels, values, color=["#4c72b0", "#55a868", "#c44e52"][: len(values)])
    ax.set_ylabel(f"steps per second (each replica: batch {report['batch_per_replica']})")
    ax.set_title(
        f"{report['model']}: weak scaling {report['weak_scaling_efficiency']:.0%}", fontsize=10
    )
    fig.tight_layout()
    from common import RESULTS

    fig.savefig(RESULTS / "train_throughput.png", dpi=120)
    plt.close(fig)


if __name__ == "__main__":
    sys.exit(main())
