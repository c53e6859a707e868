"""The Horovod example script's model and optimizer on hpcdist.horovod, against the same
model on hpcdist.torch's DistributedOptimizer and on torch DDP (gloo), side by side.

Under ``mpirun -n 2`` every variant trains the CNN of
``examples/horovod/pytorch_synthetic_benchmark.py`` (built by that script's own
``make_model``, plain BatchNorm so that the model is the same everywhere) on the
same synthetic batch, SGD with momentum, in alternating short rounds
(horovod, hpcdist.torch, DDP, then again ...); the medians of the rounds are
reported as img/sec over all ranks. Extra rows, not part of the targets:
fp16 compression and SyncBatchNorm on hpcdist.horovod.

Targets: hpcdist.horovod within 5 % of hpcdist.torch (ratio >= 0.95), and
>= 1.0x DDP gloo.

Run: ``mpirun -n 2 python benchmarks/horovod_synthetic.py [--rounds 20] [--steps 2]``;
results in ``benchmarks/results/horovod_synthetic.json`` and ``.png``.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
import time
from pathlib import Path
from typing import Any

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMBA_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from common import RESULTS, pyplot, save_report  # noqa: E402

import hpcdist.horovod.torch as hvd  # noqa: E402
import hpcdist.torch as hdt  # noqa: E402
from hpcdist.horovod import install_alias  # noqa: E402
from hpcdist.runtime import world  # noqa: E402

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "horovod" / \
    "pytorch_synthetic_benchmark.py"
TARGETS = {"vs_hpcdist_torch": 0.95, "vs_ddp_gloo": 1.0}


def _example() -> Any:
    install_alias()  # the script imports horovod.torch
    spec = importlib.util.spec_from_file_location("horovod_example", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def measure(args: argparse.Namespace) -> dict[str, Any]:
    w = world()
    example = _example()
    g = torch.Generator().manual_seed(w.rank)
    x = torch.randn(args.batch, 3, 32, 32, generator=g)
    y = torch.randint(0, 10, (args.batch,), generator=g)

    def sgd(model: torch.nn.Module) -> torch.optim.Optimizer:
        return torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)

    def build(sync_bn: bool = False) -> torch.nn.Module:
        torch.manual_seed(0)
        return example.make_model(args.width, sync_bn)

    def runner(model: torch.nn.Module, opt: Any) -> Any:
        def step() -> None:
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
        return step

    steps: dict[str, Any] = {}
    m = build()
    steps["horovod"] = runner(m, hvd.DistributedOptimizer(
        sgd(m), named_parameters=m.named_parameters(), op=hvd.Average))
    m = build()
    steps["hpcdist_torch"] = runner(m, hdt.DistributedOptimizer(sgd(m), model=m))
    ddp = torch.nn.parallel.DistributedDataParallel(build())
    steps["ddp_gloo"] = runner(ddp, sgd(ddp))
    m = build()
    steps["horovod_fp16"] = runner(m, hvd.DistributedOptimizer(
        sgd(m), named_parameters=m.named_parameters(), compression=hvd.Compression.fp16))
    m = build(sync_bn=True)
    steps["horovod_syncbn"] = runner(m, hvd.DistributedOptimizer(
        sgd(m), named_parameters=m.named_parameters()))
    for step in steps.values():
        for _ in range(args.warmup):
            step()
    times: dict[str, list[float]] = {k: [] for k in steps}
    for _ in range(args.rounds):
        for key, step in steps.items():
            w.comm.Barrier()
            start = time.perf_counter()
            for _ in range(args.steps):
                step()
            w.comm.Barrier()
            times[key].append((time.perf_counter() - start) / args.steps)
    med = {k: float(np.median(v)) for k, v in times.items()}
    img = {k: args.batch * w.size / v for k, v in med.items()}
    return {
        "img_per_s": img,
        "step_s": med,
        "rounds_step_s": times,
        "ratio_vs_hpcdist_torch": img["horovod"] / img["hpcdist_torch"],
        "ratio_vs_ddp_gloo": img["horovod"] / img["ddp_gloo"],
        "best_ratio_vs_hpcdist_torch": min(times["hpcdist_torch"]) / min(times["horovod"]),
        "best_ratio_vs_ddp_gloo": min(times["ddp_gloo"]) / min(times["horovod"]),
        "load_average": list(os.getloadavg()),
        "parameters": sum(p.numel() for p in build().parameters()),
    }


def plot(report: dict[str, Any]) -> None:
    plt = pyplot()
    r = report["result"]
    keys = ["horovod", "hpcdist_torch", "ddp_gloo", "horovod_fp16", "horovod_syncbn"]
    labels = ["hpcdist.horovod", "hpcdist.torch", "DDP gloo", "hvd fp16", "hvd SyncBN"]
    fig, ax = plt.subplots(figsize=(7, 3.5))
    ax.bar(labels, [r["img_per_s"][k] for k in keys],
           color=["C0", "C1", "C2", "C7", "C7"])
    ax.set_ylabel(f"img/sec, {report['ranks']} ranks (median)")
    ax.set_title(f"Horovod example CNN: hvd/hpcdist.torch {r['ratio_vs_hpcdist_torch']:.2f} "
                 f"(target >= 0.95), hvd/DDP {r['ratio_vs_ddp_gloo']:.2f} (>= 1.0)",
                 fontsize=9)
    fig.tight_layout()
    fig.savefig(RESULTS / "horovod_synthetic.png", dpi=100)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=20)
    p.add_argument("--steps", type=int, default=2)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--width", type=int, default=32)
    args = p.parse_args()
    w = world()
    if w.size < 2:
        print("run under mpirun -n 2 (or more)", file=sys.stderr)
        return 2
    torch.set_num_threads(1)
    hvd.init()
    port = w.comm.bcast(29500 + int(np.random.default_rng().integers(0, 2000)), root=0)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=w.rank,
                            world_size=w.size)
    try:
        result = measure(args)
    finally:
        dist.destroy_process_group()
    report = {"ranks": w.size, "torch": torch.__version__, "rounds": args.rounds,
              "steps_per_round": args.steps, "batch_per_rank": args.batch,
              "width": args.width, "targets": TARGETS, "result": result}
    if w.rank == 0:
        for k, v in result["img_per_s"].items():
            print(f"{k:<16}{v:>10.1f} img/sec")
        print(f"hpcdist.horovod / hpcdist.torch: {result['ratio_vs_hpcdist_torch']:.3f} "
              f"(target >= {TARGETS['vs_hpcdist_torch']})")
        print(f"hpcdist.horovod / DDP gloo:      {result['ratio_vs_ddp_gloo']:.3f} "
              f"(target >= {TARGETS['vs_ddp_gloo']})")
        save_report("horovod_synthetic", report)
        plot(report)
    hvd.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
