"""hpcdist.torch ZeRO-1/ZeRO-2: memory per rank and step time, vs torch ZeroRedundancyOptimizer.

Variants (Adam, an MLP 784-W-W-W-10, synthetic data):

* ``unsharded``: ``hdt.DistributedOptimizer(Adam)``;
* ``zero1``: ``shard="optimizer"``; ``zero2``: ``shard="gradients"``;
* ``torch_zero``: ``torch.distributed.optim.ZeroRedundancyOptimizer(Adam)`` with
  ``DistributedDataParallel``, both on gloo (started under mpirun as in
  ``benchmarks/torch_ddp.py``);
* ``ddp_adam``: plain Adam with DDP gloo (no sharding), to tell the cost of
  sharding from the cost of the transport.

Memory (one fresh job per variant and N = 1, 2, 4, so that peak RSS is the
variant's own): optimizer-state bytes per rank and gradient bytes per rank
after a backward (read from the real tensors), peak RSS per rank, and the
peak RSS above the process's size before the model was built.

Step time (one job per N, every variant in the same processes, alternating
short rounds; medians): targets sharded <= 1.15x unsharded hpcdist and
>= 1.0x ZeroRedundancyOptimizer + DDP gloo (ratio of steps/s).

Run: ``python benchmarks/torch_zero.py`` (it starts the mpirun jobs itself);
results in ``benchmarks/results/torch_zero.json`` and ``.png``.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMBA_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import numpy as np  # noqa: E402

VARIANTS = ("unsharded", "zero1", "zero2", "torch_zero", "ddp_adam")
SHARD = {"unsharded": None, "zero1": "optimizer", "zero2": "gradients"}
MPI_ENV = {
    "OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
    "OMPI_MCA_rmaps_base_oversubscribe": "1", "PRTE_MCA_rmaps_default_mapping_policy":
    ":oversubscribe", "OMPI_MCA_osc": "^ucx", "OMP_NUM_THREADS": "1",
}


def _rss() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _current_rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _setup(width: int) -> Any:
    import numpy as np
    import torch
    import torch.distributed as dist

    from hpcdist.runtime import world

    torch.set_num_threads(1)
    w = world()
    port = w.comm.bcast(31500 + int(np.random.default_rng().integers(0, 2000)), root=0)
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=w.rank, world_size=w.size
    )
    return w


def _model(width: int) -> Any:
    import torch

    torch.manual_seed(0)
    layers: list[Any] = [torch.nn.Linear(784, width), torch.nn.ReLU()]
    for _ in range(2):
        layers += [torch.nn.Linear(width, width), torch.nn.ReLU()]
    return torch.nn.Sequential(*layers, torch.nn.Linear(width, 10))


def _variant(name: str, width: int, bucket: int) -> tuple[Any, Any, Any]:
    """(module to call, optimizer, the optimizer whose .state is this rank's)."""
    import torch
    from torch.distributed.optim import ZeroRedundancyOptimizer

    import hpcdist.torch as hdt

    model = _model(width)
    if name == "ddp_adam":
        ddp = torch.nn.parallel.DistributedDataParallel(model, bucket_cap_mb=bucket / 2**20)
        opt = torch.optim.Adam(ddp.parameters(), lr=1e-3)
        return ddp, opt, opt
    if name == "torch_zero":
        ddp = torch.nn.parallel.DistributedDataParallel(model, bucket_cap_mb=bucket / 2**20)
        opt = ZeroRedundancyOptimizer(ddp.parameters(), optimizer_class=torch.optim.Adam, lr=1e-3)
        return ddp, opt, opt.optim
    opt = hdt.DistributedOptimizer(
        torch.optim.Adam(model.parameters(), lr=1e-3), model=model, bytes_per_pack=bucket,
        shard=SHARD[name],
    )
    return model, opt, getattr(opt, "local_optimizer", opt)


def _step_fn(module: Any, opt: Any, x: Any, y: Any) -> Any:
    import torch

    loss_fn = torch.nn.CrossEntropyLoss()

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        loss_fn(module(x), y).backward()
        opt.step()

    return step


def _data(batch: int, rank: int) -> tuple[Any, Any]:
    import torch

    g = torch.Generator().manual_seed(rank)
    return torch.randn(batch, 784, generator=g), torch.randint(0, 10, (batch,), generator=g)


def _bytes(tensors: Any) -> int:
    return int(sum(t.numel() * t.element_size() for t in tensors))


def memory_job(args: argparse.Namespace) -> None:
    """One variant at one N: bytes and peak RSS per rank (printed as JSON by rank 0)."""
    import torch

    w = _setup(args.width)
    before = _current_rss()
    module, opt, local = _variant(args.variant, args.width, args.bucket)
    x, y = _data(args.batch, w.rank)
    step = _step_fn(module, opt, x, y)
    for _ in range(3):
        step()
    getattr(opt, "wait_parameters", lambda: None)()
    state = _bytes(t for s in local.state.values() for t in s.values()
                   if torch.is_tensor(t) and t.dim() > 0)
    opt.zero_grad(set_to_none=True)
    torch.nn.CrossEntropyLoss()(module(x), y).backward()
    if hasattr(opt, "synchronize"):
        opt.synchronize()
    params = list(module.parameters())
    grads = [p.grad for p in params if p.grad is not None]
    if hasattr(opt, "shard_gradients"):
        grads.append(opt.shard_gradients())
    row = {"optimizer_state_bytes": state, "gradient_bytes": _bytes(grads),
           "peak_rss_bytes": _rss(), "peak_rss_above_start_bytes": _rss() - before,
           "parameters": int(sum(p.numel() for p in params))}
    rows = w.comm.gather(row, root=0)
    if w.rank == 0:
        print("RESULT " + json.dumps(rows))


def time_job(args: argparse.Namespace) -> None:
    """Every variant at one N, alternating rounds; medians of seconds per step."""
    import torch.distributed as dist

    w = _setup(args.width)
    x, y = _data(args.batch, w.rank)
    steps, waits = {}, {}
    for name in VARIANTS:
        module, opt, _ = _variant(name, args.width, args.bucket)
        steps[name] = _step_fn(module, opt, x, y)
        # the parameters' all-gather overlaps the next forward; before another variant's
        # collectives run, it must be done (the engines share the node's shared memory)
        waits[name] = getattr(opt, "wait_parameters", lambda: None)
    for name, step in steps.items():
        for _ in range(2):
            step()
        waits[name]()
    times: dict[str, list[float]] = {k: [] for k in steps}
    for _ in range(args.rounds):
        for name, step in steps.items():
            w.comm.Barrier()
            start = time.perf_counter()
            for _ in range(args.steps):
                step()
            waits[name]()
            w.comm.Barrier()
            times[name].append((time.perf_counter() - start) / args.steps)
    dist.destroy_process_group()
    if w.rank == 0:
        print("RESULT " + json.dumps({k: float(np.median(v)) for k, v in times.items()}))


def _launch(n: int, extra: list[str], timeout: float) -> Any:
    cmd = [str(Path(sys.executable).parent / "mpirun"), "-n", str(n), sys.executable,
           __file__, *extra]
    env = {**os.environ, **MPI_ENV}
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout)
    for line in done.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[7:])
    raise RuntimeError(f"{' '.join(cmd)} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")


def driver(args: argparse.Namespace) -> None:
    common = ["--width", str(args.width), "--batch", str(args.batch),
              "--bucket", str(args.bucket)]
    report: dict[str, Any] = {"width": args.width, "batch_per_rank": args.batch,
                              "bucket_bytes": args.bucket, "memory": {}, "step_s": {},
                              "targets": {"sharded_vs_unsharded_max": 1.15,
                                          "sharded_vs_torch_zero_min": 1.0}}
    for n in args.sizes:
        report["memory"][n] = {}
        for name in VARIANTS:
            rows = _launch(n, ["--job", "memory", "--variant", name, *common], 600)
            report["memory"][n][name] = rows
            r = {k: v / 2**20 for k, v in rows[0].items()}
            print(f"N={n} {name:<11} state {r['optimizer_state_bytes']:8.2f} MiB  "
                  f"grads {r['gradient_bytes']:8.2f} MiB  peak RSS "
                  f"{r['peak_rss_bytes']:8.1f} MiB (+{r['peak_rss_above_start_bytes']:.1f})",
                  flush=True)
    for n in args.time_sizes:
        med = _launch(n, ["--job", "time", "--rounds", str(args.rounds), "--steps",
                          str(args.steps), *common], 900)
        ratios = {f"{k}_vs_unsharded": med[k] / med["unsharded"] for k in ("zero1", "zero2")}
        ratios.update({f"{k}_speed_vs_torch_zero": med["torch_zero"] / med[k]
                       for k in ("zero1", "zero2")})
        report["step_s"][n] = {"median_s": med, "ratios": ratios}
        print(f"N={n} step s: " + ", ".join(f"{k} {v * 1e3:.1f} ms" for k, v in med.items()))
        print(f"N={n} ratios: " + ", ".join(f"{k} {v:.3f}" for k, v in ratios.items()),
              flush=True)
    sys.path.insert(0, str(Path(__file__).parent))
    from common import save_report

    summarize(report)
    save_report("torch_zero", report)
    plot(report)


def summarize(report: dict[str, Any]) -> None:
    """``report["mib"]``: rank 0's figures in MiB, keyed ``n<N>`` and variant (for the docs)."""
    mib: dict[str, Any] = {}
    for n, variants in report["memory"].items():
        mib[f"n{n}"] = {
            name: {k: max(r[k] for r in rows) / 2**20 for k in rows[0] if k != "parameters"}
            for name, rows in variants.items()
        }
        base = mib[f"n{n}"]["unsharded"]
        for name in ("zero1", "zero2"):
            row = mib[f"n{n}"][name]
            row["state_share"] = row["optimizer_state_bytes"] / base["optimizer_state_bytes"]
            row["gradient_share"] = row["gradient_bytes"] / base["gradient_bytes"]
    report["mib"] = mib
    report["time"] = {f"n{n}": {**{f"{k}_ms": v * 1e3 for k, v in t["median_s"].items()},
                                **t["ratios"]}
                      for n, t in report["step_s"].items()}


def plot(report: dict[str, Any]) -> None:
    from common import RESULTS, pyplot

    plt = pyplot()
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.8))
    sizes = list(report["memory"])
    width = 0.16
    for ax, key, title in ((axes[0], "optimizer_state_bytes", "optimizer state / rank"),
                           (axes[1], "gradient_bytes", "gradients after backward / rank")):
        for k, name in enumerate(VARIANTS):
            vals = [report["memory"][n][name][0][key] / 2**20 for n in sizes]
            ax.bar(np.arange(len(sizes)) + (k - 2) * width, vals, width, label=name)
        ax.set_xticks(np.arange(len(sizes)))
        ax.set_xticklabels([f"N={n}" for n in sizes])
        ax.set_ylabel("MiB")
        ax.set_title(title)
    axes[0].legend(fontsize=8)
    ax = axes[2]
    tsizes = list(report["step_s"])
    for k, name in enumerate(VARIANTS):
        vals = [report["step_s"][n]["median_s"][name] * 1e3 for n in tsizes]
        ax.bar(np.arange(len(tsizes)) + (k - 2) * width, vals, width, label=name)
    ax.set_xticks(np.arange(len(tsizes)))
    ax.set_xticklabels([f"N={n}" for n in tsizes])
    ax.set_ylabel("ms per step (median)")
    ax.set_title("step time")
    fig.suptitle(f"hpcdist.torch ZeRO vs torch ZeroRedundancyOptimizer (MLP width "
                 f"{report['width']}, Adam)")
    fig.tight_layout()
    fig.savefig(RESULTS / "torch_zero.png", dpi=100)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--job", choices=("memory", "time"), default=None)
    p.add_argument("--variant", choices=VARIANTS, default="unsharded")
    p.add_argument("--width", type=int, default=1024)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--bucket", type=int, default=4 << 20)
    p.add_argument("--rounds", type=int, default=10)
    p.add_argument("--steps", type=int, default=2)
    p.add_argument("--sizes", type=int, nargs="+", default=[1, 2, 4])
    p.add_argument("--time-sizes", type=int, nargs="+", default=[2, 4])
    args = p.parse_args()
    if args.job == "memory":
        memory_job(args)
    elif args.job == "time":
        time_job(args)
    else:
        driver(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
