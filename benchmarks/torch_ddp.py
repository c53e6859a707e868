"""hpcdist.torch's DistributedOptimizer against torch DistributedDataParallel (gloo), side by side.

Under ``mpirun -n 2`` two models train in alternating rounds (hpcdist, then DDP,
then hpcdist again, ...; medians of the rounds reported, and the best of
the rounds in the JSON), with the same
synthetic data, the same model and SGD with momentum:

* ``resnet``: a ResNet-style CNN (basic blocks, 3 stages), 32x32 RGB images,
  batch 32 per rank (compute-heavy);
* ``mlp``: the MLP of ``benchmarks/train_throughput.py`` (784-1024x3-10,
  2.9 M parameters), batch 256 per rank (communication-heavy).

DDP with the ``mpi`` backend is added when this torch build has it. The
share of communication hidden behind backward is
``(compute + comm - step) / comm``: ``compute`` a step with no communication,
``comm`` one blocking allreduce of all gradients, ``step`` the distributed
step. Targets: hpcdist >= 1.0x DDP gloo on the CNN, >= 1.2x on the MLP.

Run: ``mpirun -n 2 python benchmarks/torch_ddp.py [--rounds 30] [--steps 2]``;
results in ``benchmarks/results/torch_ddp.json`` and ``.png``.
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
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from common import pyplot, save_report  # noqa: E402

import hpcdist.torch as hdt  # noqa: E402
from hpcdist.adapters import engine_for  # noqa: E402
from hpcdist.runtime import world  # noqa: E402

TARGETS = {"resnet": 1.0, "mlp": 1.2}


class Block(torch.nn.Module):
    """A ResNet basic block: two 3x3 convolutions with batch norm and a shortcut."""

    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.conv1 = torch.nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = torch.nn.BatchNorm2d(cout)
        self.conv2 = torch.nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = torch.nn.BatchNorm2d(cout)
        self.short = torch.nn.Sequential()
        if stride != 1 or cin != cout:
            self.short = torch.nn.Sequential(
                torch.nn.Conv2d(cin, cout, 1, stride, bias=False), torch.nn.BatchNorm2d(cout)
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = torch.relu(self.bn1(self.conv1(x)))
        return torch.relu(self.bn2(self.conv2(out)) + self.short(x))


def resnet(widths: tuple[int, ...] = (16, 32, 64), classes: int = 10) -> torch.nn.Module:
    layers: list[torch.nn.Module] = [
        torch.nn.Conv2d(3, widths[0], 3, 1, 1, bias=False), torch.nn.BatchNorm2d(widths[0]),
        torch.nn.ReLU(),
    ]
    cin = widths[0]
    for i, w in enumerate(widths):
        layers += [Block(cin, w, 1 if i == 0 else 2), Block(w, w, 1)]
        cin = w
    layers += [torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(cin, classes)]
    return torch.nn.Sequential(*layers)


def mlp() -> torch.nn.Module:
    layers: list[torch.nn.Module] = [torch.nn.Linear(784, 1024), torch.nn.ReLU()]
    for _ in range(2):
        layers += [torch.nn.Linear(1024, 1024), torch.nn.ReLU()]
    return torch.nn.Sequential(*layers, torch.nn.Linear(1024, 10))


MODELS = {
    "resnet": (resnet, lambda g: torch.randn(32, 3, 32, 32, generator=g)),
    "mlp": (mlp, lambda g: torch.randn(256, 784, generator=g)),
}


def _timed(step: Any, steps: int, barrier: Any) -> float:
    barrier()
    start = time.perf_counter()
    for _ in range(steps):
        step()
    barrier()
    return (time.perf_counter() - start) / steps


def measure(name: str, args: argparse.Namespace, backends: list[str]) -> dict[str, Any]:
    w = world()
    build, data = MODELS[name]
    g = torch.Generator().manual_seed(w.rank)
    x = data(g)
    y = torch.randint(0, 10, (x.shape[0],), generator=g)
    loss_fn = torch.nn.CrossEntropyLoss()

    def runner(model: torch.nn.Module, opt: Any) -> Any:
        def step() -> None:
            opt.zero_grad(set_to_none=True)
            loss_fn(model(x), y).backward()
            opt.step()
        return step

    torch.manual_seed(0)
    hd_model = build()
    hd_opt = hdt.DistributedOptimizer(
        torch.optim.SGD(hd_model.parameters(), lr=0.01, momentum=0.9), model=hd_model,
        bytes_per_pack=args.bucket_bytes, overlap=True,
    )
    steps = {"hpcdist": runner(hd_model, hd_opt)}
    torch.manual_seed(0)
    serial_model = build()
    serial_opt = hdt.DistributedOptimizer(
        torch.optim.SGD(serial_model.parameters(), lr=0.01, momentum=0.9), model=serial_model,
        bytes_per_pack=args.bucket_bytes, overlap=False,
    )
    steps["hpcdist_no_overlap"] = runner(serial_model, serial_opt)
    groups = {}
    for backend in backends:
        groups[backend] = dist.new_group(backend=backend) if backend != "gloo" else None
        torch.manual_seed(0)
        ddp = torch.nn.parallel.DistributedDataParallel(build(), process_group=groups[backend])
        steps[f"ddp_{backend}"] = runner(ddp, torch.optim.SGD(ddp.parameters(), lr=0.01,
                                                              momentum=0.9))
    torch.manual_seed(0)
    alone = build()
    steps["compute_only"] = runner(alone, torch.optim.SGD(alone.parameters(), lr=0.01,
                                                          momentum=0.9))
    grads = [torch.zeros_like(p) for p in alone.parameters()]
    engine = engine_for()  # the world's engine: the same ranks as the optimizer's
    steps["allreduce_only"] = lambda: engine.allreduce(grads, "MEAN", out=grads)

    barrier = w.comm.Barrier
    times: dict[str, list[float]] = {k: [] for k in steps}
    for step in steps.values():  # warm up every variant once
        for _ in range(args.warmup):
            step()
    for _ in range(args.rounds):  # short rounds, so every variant sees the same load
        for key, step in steps.items():
            times[key].append(_timed(step, args.steps, barrier))
    med = {k: float(np.median(v)) for k, v in times.items()}
    best = {k: float(min(v)) for k, v in times.items()}
    compute, comm, step_s = med["compute_only"], med["allreduce_only"], med["hpcdist"]
    hidden = (compute + comm - step_s) / comm if comm > 0 else 0.0
    params = sum(p.numel() for p in alone.parameters())
    out = {
        "parameters": params,
        "batch_per_rank": int(x.shape[0]),
        "step_s": med,
        "steps_per_s": {k: 1.0 / v for k, v in med.items()},
        "rounds_step_s": times,
        "hidden_comm_share": float(min(1.0, max(0.0, hidden))),
        "target_vs_ddp_gloo": TARGETS[name],
        "ratio_vs_ddp_gloo": med["ddp_gloo"] / step_s,
        "best_step_s": best,
        "best_ratio_vs_ddp_gloo": best["ddp_gloo"] / best["hpcdist"],
        "ratio_no_overlap_vs_ddp_gloo": med["ddp_gloo"] / med["hpcdist_no_overlap"],
    }
    for backend in backends:
        if backend != "gloo":
            out[f"ratio_vs_ddp_{backend}"] = med[f"ddp_{backend}"] / step_s
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=30)
    p.add_argument("--steps", type=int, default=2)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--bucket-bytes", type=int, default=None)
    p.add_argument("--models", default="resnet,mlp")
    args = p.parse_args()
    w = world()
    if w.size < 2:
        print("run under mpirun -n 2 (or more)", file=sys.stderr)
        return 2
    torch.set_num_threads(1)
    port = w.comm.bcast(29500 + int(np.random.default_rng().integers(0, 2000)), root=0)
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=w.rank, world_size=w.size
    )
    backends = ["gloo"] + (["mpi"] if dist.is_mpi_available() else [])
    report: dict[str, Any] = {
        "ranks": w.size, "torch": torch.__version__, "backends": backends,
        "mpi_backend_available": dist.is_mpi_available(), "rounds": args.rounds,
        "steps_per_round": args.steps, "models": {},
    }
    try:
        for name in args.models.split(","):
            report["models"][name] = measure(name, args, backends)
    finally:
        dist.destroy_process_group()
    if w.rank == 0:
        print(f"{'model':<8}{'params':>10}{'hpcdist/s':>11}{'DDP gloo/s':>12}{'ratio':>7}"
              f"{'target':>8}{'hidden':>8}{'no-overlap ratio':>18}")
        for name, r in report["models"].items():
            sps = r["steps_per_s"]
            print(f"{name:<8}{r['parameters']:>10}{sps['hpcdist']:>11.2f}{sps['ddp_gloo']:>12.2f}"
                  f"{r['ratio_vs_ddp_gloo']:>7.2f}{r['target_vs_ddp_gloo']:>8.1f}"
                  f"{r['hidden_comm_share']:>8.0%}{r['ratio_no_overlap_vs_ddp_gloo']:>18.2f}")
        save_report("torch_ddp", report)
        plot(report)
    return 0


def plot(report: dict[str, Any]) -> None:
    plt = pyplot()
    names = list(report["models"])
    fig, ax = plt.subplots(figsize=(6, 3.5))
    width = 0.38
    for k, (key, label) in enumerate((("hpcdist", "hpcdist DistributedOptimizer"),
                                      ("ddp_gloo", "torch DDP (gloo)"))):
        vals = [report["models"][n]["steps_per_s"][key] for n in names]
        ax.bar(np.arange(len(names)) + (k - 0.5) * width, vals, width, label=label)
    ax.set_xticks(np.arange(len(names)))
    ax.set_xticklabels([f"{n}\n(ratio {report['models'][n]['ratio_vs_ddp_gloo']:.2f}, "
                        f"target {report['models'][n]['target_vs_ddp_gloo']})" for n in names])
    ax.set_ylabel("steps/s (median of rounds)")
    ax.set_title(f"PyTorch training, {report['ranks']} ranks: hpcdist vs DDP")
    ax.legend()
    fig.tight_layout()
    from common import RESULTS

    fig.savefig(RESULTS / "torch_ddp.png", dpi=100)


if __name__ == "__main__":
    sys.exit(main())
