"""``hpcdist bench train``: synthetic-data training throughput, per rank and in total.

Like Horovod's synthetic benchmark: after ``--warmup`` untimed iterations,
``--iters`` iterations of ``--batches-per-iter`` training steps are timed;
each iteration gives samples/sec (per-replica batch x steps / seconds); the
per-rank figure is their mean with a 95 % interval (1.96 standard
deviations), the total is the sum over the ranks. Models:

* ``mlp`` (default): an ``hpcdist.nn`` MLP under ``MultiWorkerMirroredStrategy``
  (custom training loop: value_and_grad, apply_gradients);
* ``cnn``: a small torch CNN (3x32x32 images, 10 classes) through
  ``hpcdist.torch.DistributedOptimizer``;
* ``transformer``: a stack of torch ``TransformerEncoderLayer`` through
  ``hpcdist.torch.DistributedOptimizer``.

``--compression bf16|fp16`` sends float32 gradients between nodes in 16
bits (``CommunicationOptions(compression=...)``). ``--batch-size`` is per
replica (weak scaling); ``--global-batch-size`` instead fixes the batch of all
replicas together (strong scaling). Rank 0
prints the result and writes ``<out>/<name>.json`` (default
``train_<model>_n<ranks>``), which ``hpcdist bench report`` combines into a
scaling table.

Example: ``mpirun -n 4 hpcdist bench train --model mlp --iters 5``.
"""

from __future__ import annotations

import argparse
import math
import platform
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

import hpcdist as hd
from hpcdist.bench.report import save_report
from hpcdist.collectives.options import COMPRESSIONS
from hpcdist.errors import BenchmarkError
from hpcdist.nn import Dense, Sequential
from hpcdist.nn.losses import Reduction, SparseCategoricalCrossentropy
from hpcdist.runtime import library_version, world

MODELS = ("mlp", "cnn", "transformer")


def interval(values: Sequence[float]) -> tuple[float, float]:
    """Mean and half-width of the 95 % interval (1.96 sample standard deviations).

    Example: ``interval([10.0, 12.0])`` is ``(11.0, 2.77...)``.
    """
    mean = statistics.fmean(values)
    spread = statistics.stdev(values) if len(values) > 1 else 0.0
    return mean, 1.96 * spread


def _mlp_step(args: argparse.Namespace, batch: int, global_batch: int) -> Callable[[], None]:
    options = hd.experimental.CommunicationOptions(compression=args.compression)
    strategy = hd.MultiWorkerMirroredStrategy(communication_options=options)
    with strategy.scope():
        layers: list[Any] = [Dense(args.hidden, activation="relu", input_shape=(args.features,))]
        layers += [Dense(args.hidden, activation="relu") for _ in range(args.layers - 1)]
        model = Sequential([*layers, Dense(args.classes)])
        optimizer = hd.optimizers.SGD(learning_rate=0.01, momentum=0.9)
        loss_object = SparseCategoricalCrossentropy(from_logits=True, reduction=Reduction.NONE)

    def compute_loss(labels: Any, logits: Any) -> Any:
        return hd.nn.compute_average_loss(loss_object(labels, logits),
                                          global_batch_size=global_batch)

    grad_fn = hd.nn.value_and_grad(model, compute_loss)
    rng = np.random.default_rng(world().rank)
    x = rng.normal(size=(batch, args.features)).astype(np.float32)
    y = rng.integers(0, args.classes, size=batch)

    def replica_step(x: np.ndarray, y: np.ndarray) -> None:
        _, grads = grad_fn(x, y)
        optimizer.apply_gradients(zip(grads, model.trainable_variables, strict=True))

    return lambda: strategy.run(replica_step, args=(x, y))


def _torch_step(args: argparse.Namespace, batch: int) -> Callable[[], None]:
    try:
        import torch  # lazy: optional framework (PyTorch)
    except ImportError as err:
        raise BenchmarkError(
            f"--model {args.model} needs PyTorch, which is not installed; use --model mlp"
        ) from err
    import hpcdist.torch as hdt  # lazy: optional framework adapter (PyTorch)

    torch.manual_seed(0)
    torch.set_num_threads(1)
    if args.model == "cnn":
        model = torch.nn.Sequential(
            torch.nn.Conv2d(3, 32, 3, padding=1), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
            torch.nn.Conv2d(32, 64, 3, padding=1), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
            torch.nn.Flatten(), torch.nn.Linear(64 * 8 * 8, 128), torch.nn.ReLU(),
            torch.nn.Linear(128, 10),
        )
        x = torch.randn(batch, 3, 32, 32)
        y = torch.randint(0, 10, (batch,))
        loss_fn: Any = torch.nn.CrossEntropyLoss()
    else:
        layer = torch.nn.TransformerEncoderLayer(args.d_model, args.heads, 4 * args.d_model,
                                                 batch_first=True)
        model = torch.nn.TransformerEncoder(layer, args.layers, enable_nested_tensor=False)
        x = torch.randn(batch, args.seq_len, args.d_model)
        y = torch.randn(batch, args.seq_len, args.d_model)
        loss_fn = torch.nn.MSELoss()
    opt = hdt.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01), model=model,
                                   compression=args.compression)
    hdt.broadcast_parameters(model, root=0)

    def step() -> None:
        opt.zero_grad()
        loss_fn(model(x), y).backward()
        opt.step()

    return step


def build_parser(prog: str = "hpcdist bench train") -> argparse.ArgumentParser:
    """The command line options. Example: ``build_parser().parse_args([]).model == "mlp"``."""
    p = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n\n")[0])
    p.add_argument("--model", choices=MODELS, default="mlp")
    p.add_argument("--batch-size", type=int, default=64, help="per replica (default 64)")
    p.add_argument("--global-batch-size", type=int, default=None,
                   help="fix the batch of all replicas together instead (strong scaling)")
    p.add_argument("--iters", type=int, default=10, help="timed iterations (default 10)")
    p.add_argument("--batches-per-iter", type=int, default=10, help="steps per iteration")
    p.add_argument("--warmup", type=int, default=2, help="untimed iterations (default 2)")
    p.add_argument("--compression", choices=COMPRESSIONS, default=None,
                   help="float32 gradients between nodes as bf16 or fp16 (default: none)")
    p.add_argument("--features", type=int, default=256, help="mlp: input features")
    p.add_argument("--hidden", type=int, default=512, help="mlp: hidden units")
    p.add_argument("--layers", type=int, default=3, help="mlp / transformer: layers")
    p.add_argument("--classes", type=int, default=10, help="mlp: classes")
    p.add_argument("--d-model", type=int, default=128, help="transformer: model width")
    p.add_argument("--heads", type=int, default=4, help="transformer: attention heads")
    p.add_argument("--seq-len", type=int, default=64, help="transformer: sequence length")
    p.add_argument("--out", default="benchmarks/results", help="folder for the JSON")
    p.add_argument("--name", default=None, help="file name (default train_<model>_n<ranks>)")
    return p


def main(argv: Sequence[str] | None = None, *, prog: str = "hpcdist bench train") -> int:
    """Run on every rank; rank 0 prints and writes the JSON. Returns the exit status."""
    args = build_parser(prog).parse_args(argv)
    for option in ("batch_size", "iters", "batches_per_iter"):
        if getattr(args, option) < 1:
            raise BenchmarkError(f"--{option.replace('_', '-')} is {getattr(args, option)}; "
                                 "expected an integer >= 1")
    w = world()
    if args.global_batch_size is not None:
        if args.global_batch_size < w.size:
            raise BenchmarkError(f"--global-batch-size {args.global_batch_size} is smaller "
                                 f"than the {w.size} ranks; give each rank at least one sample")
        batch = math.ceil(args.global_batch_size / w.size)
    else:
        batch = args.batch_size
    global_batch = batch * w.size
    step = _mlp_step(args, batch, global_batch) if args.model == "mlp" else _torch_step(args, batch)
    for _ in range(args.warmup * args.batches_per_iter):
        step()
    w.comm.Barrier()
    rates = []
    for _ in range(args.iters):
        start = time.perf_counter()
        for _ in range(args.batches_per_iter):
            step()
        rates.append(batch * args.batches_per_iter / (time.perf_counter() - start))
    per_rank = w.comm.gather(rates, root=0)
    if w.rank != 0:
        return 0
    means = [statistics.fmean(r) for r in per_rank]
    totals = [sum(r[i] for r in per_rank) for i in range(args.iters)]
    mean, half = interval(rates)
    total, total_half = interval(totals)
    result = {
        "benchmark": "train", "model": args.model, "ranks": w.size, "nodes": w.node_count,
        "virtual_nodes": w.virtual_nodes,
        "scaling": "strong" if args.global_batch_size is not None else "weak",
        "batch_per_replica": batch, "global_batch": global_batch,
        "compression": args.compression,
        "iters": args.iters, "batches_per_iter": args.batches_per_iter,
        "samples_per_s_per_rank": means,
        "samples_per_s_rank0": {"mean": mean, "ci95": half},
        "samples_per_s_total": {"mean": total, "ci95": total_half},
        "mpi_library": library_version(), "machine": platform.platform(),
        "command": f"mpirun -n {w.size} {prog} " + " ".join(argv or sys.argv[1:]),
    }
    print(f"model {args.model}, {w.size} ranks on {w.node_count} node(s), batch {batch} per "
          f"replica ({global_batch} global)")
    for rank, value in enumerate(means):
        print(f"  rank {rank}: {value:.1f} samples/sec")
    print(f"samples/sec per rank (rank 0): {mean:.1f} +-{half:.1f}")
    print(f"total samples/sec on {w.size} ranks: {total:.1f} +-{total_half:.1f}")
    path = save_report(args.name or f"train_{args.model}_n{w.size}", result, args.out)
    print(f"wrote {path}")
    return 0
