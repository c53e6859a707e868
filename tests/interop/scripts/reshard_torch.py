"""One leg of the resharding round trip: load the previous leg's sharded checkpoint, check it.

``python reshard_torch.py WORKDIR PREV STAGE`` under ``mpirun -n N``: loads
``WORKDIR/ckpt-PREV`` (unless PREV is 0: a fresh start), checks that the
parameters and the consolidated optimizer state are bitwise the reference
that leg gathered (``ref-PREV.npz``), trains on with the sharded optimizer
next to an unsharded one started from the same state (they must agree),
then saves ``ckpt-N`` and ``ref-N.npz``.
"""

from __future__ import annotations

import copy
import sys

import numpy as np
import torch

import hpcdist.torch as hdt
from hpcdist.errors import CheckpointError
from hpcdist.runtime import world

GLOBAL = 24
BUCKET = 4096


def model(seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(
        torch.nn.Linear(10, 64), torch.nn.Tanh(), torch.nn.Linear(64, 33), torch.nn.Tanh(),
        torch.nn.Linear(33, 3),
    )


def batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    w = world()
    g = torch.Generator().manual_seed(500 + step)
    x, y = torch.randn(GLOBAL, 10, generator=g), torch.randn(GLOBAL, 3, generator=g)
    per = GLOBAL // w.size
    return x[w.rank * per : (w.rank + 1) * per], y[w.rank * per : (w.rank + 1) * per]


def train(net, opt, steps: range) -> None:
    for s in steps:
        x, y = batch(s)
        opt.zero_grad()
        torch.nn.functional.mse_loss(net(x), y).backward()
        opt.step()
        if hasattr(opt, "wait_parameters"):
            opt.wait_parameters()


def reference(net, opt) -> dict[str, np.ndarray]:
    out = {f"p/{n}": p.detach().numpy().copy() for n, p in net.named_parameters()}
    for i, entry in opt.consolidated_state_dict()["state"].items():
        for k, v in entry.items():
            out[f"s/{i}/{k}"] = np.asarray(v.numpy() if torch.is_tensor(v) else v).copy()
    return out


def main() -> None:
    workdir, prev, stage = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    w = world()
    net = model(seed=7 + w.size)  # another start than the saved one: loading must replace it
    opt = hdt.DistributedOptimizer(
        torch.optim.Adam(net.parameters(), lr=0.01), model=net, bytes_per_pack=BUCKET,
        shard=stage,
    )
    start = 0
    if prev:
        manifest = hdt.load_sharded(f"{workdir}/ckpt-{prev}", opt)
        assert manifest["world_size"] == prev
        want = np.load(f"{workdir}/ref-{prev}.npz", allow_pickle=False)
        got = reference(net, opt)
        assert sorted(got) == sorted(want.files), (sorted(got), want.files)
        for key in want.files:
            assert got[key].dtype == want[key].dtype and got[key].shape == want[key].shape, key
            assert got[key].tobytes() == want[key].tobytes(), f"{key} differs after resharding"
        start = int(want["s/0/step"])
        # training continues: the sharded optimizer and an unsharded one from the same state
        twin = model(seed=1)
        twin.load_state_dict(net.state_dict())
        plain = torch.optim.Adam(twin.parameters(), lr=0.01)
        plain.load_state_dict(copy.deepcopy(opt.consolidated_state_dict()))
        twin_opt = hdt.DistributedOptimizer(plain, model=twin, bytes_per_pack=BUCKET)
        train(net, opt, range(start, start + 3))
        train(twin, twin_opt, range(start, start + 3))
        for a, b in zip(net.parameters(), twin.parameters(), strict=True):
            rel = float((a - b).abs().max() / b.abs().max())
            assert rel <= 1e-6, rel
        start += 3
        if w.size == 1:  # a checkpoint of another model is a typed error
            other = torch.nn.Sequential(torch.nn.Linear(10, 5))
            o = hdt.DistributedOptimizer(torch.optim.Adam(other.parameters()), model=other,
                                         shard=stage)
            try:
                hdt.load_sharded(f"{workdir}/ckpt-{prev}", o)
            except CheckpointError as err:
                print("mismatch:", type(err).__name__, str(err)[:80])
            else:
                raise AssertionError("loading another model's checkpoint did not fail")
    else:
        net = model(seed=1)
        opt = hdt.DistributedOptimizer(
            torch.optim.Adam(net.parameters(), lr=0.01), model=net, bytes_per_pack=BUCKET,
            shard=stage,
        )
        train(net, opt, range(0, 4))
        start = 4
    hdt.save_sharded(f"{workdir}/ckpt-{w.size}", opt)
    ref = reference(net, opt)
    if w.rank == 0:
        np.savez(f"{workdir}/ref-{w.size}.npz", **ref)
    w.comm.Barrier()
    print(f"leg {prev}->{w.size} ok at step {start}")


if __name__ == "__main__":
    main()
