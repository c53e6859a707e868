"""hpcdist.torch ZeRO-1/ZeRO-2 (``DistributedOptimizer(shard=...)``) on N ranks.

Sharded training equals unsharded hpcdist training at the same N (float32,
50 Adam steps, 1e-6 relative); per-rank optimizer-state and gradient bytes,
read from the real tensors, are at most 1/N of the unsharded ones plus one
bucket; the consolidated state equals the unsharded optimizer's state.
"""

from __future__ import annotations

import copy

import pytest
import torch

import hpcdist.torch as hdt
from hpcdist.errors import ShardingError
from hpcdist.runtime import world

pytestmark = pytest.mark.mpi

BUCKET = 4096  # bytes: several buckets, parameters cut across slices
PER_RANK = 8


def _model() -> torch.nn.Module:
    torch.manual_seed(3)
    return torch.nn.Sequential(
        torch.nn.Linear(10, 64), torch.nn.Tanh(), torch.nn.Linear(64, 33), torch.nn.Tanh(),
        torch.nn.Linear(33, 3),
    )


def _batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    w = world()
    g = torch.Generator().manual_seed(1000 + step)
    x = torch.randn(PER_RANK * w.size, 10, generator=g)
    y = torch.randn(PER_RANK * w.size, 3, generator=g)
    lo = w.rank * PER_RANK
    return x[lo : lo + PER_RANK], y[lo : lo + PER_RANK]


def _step(model, opt, step: int) -> None:
    x, y = _batch(step)
    opt.zero_grad()
    torch.nn.functional.mse_loss(model(x), y).backward()
    opt.step()


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-30))


def _state_bytes(opt: torch.optim.Optimizer) -> int:
    return sum(
        t.numel() * t.element_size()
        for s in opt.state.values() for t in s.values() if torch.is_tensor(t) and t.dim() > 0
    )


def _grad_bytes(model: torch.nn.Module, extra: list[torch.Tensor]) -> int:
    grads = [p.grad for p in model.parameters() if p.grad is not None] + extra
    return sum(g.numel() * g.element_size() for g in grads)


@pytest.mark.parametrize("stage", ["optimizer", "gradients"])
def test_sharded_adam_equals_unsharded_after_50_steps(stage: str) -> None:
    ref, net = _model(), _model()
    ref_opt = hdt.DistributedOptimizer(
        torch.optim.Adam(ref.parameters(), lr=1e-2), model=ref, bytes_per_pack=BUCKET
    )
    opt = hdt.DistributedOptimizer(
        torch.optim.Adam(net.parameters(), lr=1e-2), model=net, bytes_per_pack=BUCKET,
        shard=stage,
    )
    assert isinstance(opt, torch.optim.Adam)
    for step in range(50):
        _step(ref, ref_opt, step)
        _step(net, opt, step)
        opt.wait_parameters()  # two optimizers' threads must not run collectives at once
    for a, b in zip(net.parameters(), ref.parameters(), strict=True):
        assert _rel(a.detach(), b.detach()) <= 1e-6
    full = opt.consolidated_state_dict()
    want = ref_opt.state_dict()
    assert sorted(full["state"]) == sorted(want["state"])
    for i, entry in want["state"].items():
        for key in ("exp_avg", "exp_avg_sq"):
            assert full["state"][i][key].shape == entry[key].shape
            assert _rel(full["state"][i][key], entry[key]) <= 1e-6
        assert float(full["state"][i]["step"]) == float(entry["step"]) == 50.0


@pytest.mark.parametrize("stage", ["optimizer", "gradients"])
def test_bf16_compression_sharded_equals_unsharded_with_it(stage: str) -> None:
    """Compressed, ZeRO-1's all-reduced gradients and ZeRO-2's reduce-scattered blocks
    are the unsharded optimizer's compressed averages (the same float32 sums rounded
    once), so the three train alike."""
    ref, net = _model(), _model()
    ref_opt = hdt.DistributedOptimizer(
        torch.optim.Adam(ref.parameters(), lr=1e-2), model=ref, bytes_per_pack=BUCKET,
        compression="bf16",
    )
    opt = hdt.DistributedOptimizer(
        torch.optim.Adam(net.parameters(), lr=1e-2), model=net, bytes_per_pack=BUCKET,
        shard=stage, compression="bf16",
    )
    plain = _model()
    plain_opt = hdt.DistributedOptimizer(
        torch.optim.Adam(plain.parameters(), lr=1e-2), model=plain, bytes_per_pack=BUCKET
    )
    for step in range(20):
        _step(ref, ref_opt, step)
        _step(net, opt, step)
        opt.wait_parameters()
        _step(plain, plain_opt, step)
    for a, b in zip(net.parameters(), ref.parameters(), strict=True):
        assert _rel(a.detach(), b.detach()) <= 1e-6
    same = [torch.equal(a, c) for a, c in zip(net.parameters(), plain.parameters(), strict=True)]
    if world().node_count > 1:  # compression is between nodes: it really was compressed
        assert not all(same)
    else:  # one node: nothing is compressed
        assert all(same)


@pytest.mark.parametrize("stage", ["optimizer", "gradients"])
def test_state_and_gradient_bytes_per_rank(stage: str) -> None:
    n = world().size
    ref, net = _model(), _model()
    ref_opt = hdt.DistributedOptimizer(
        torch.optim.Adam(ref.parameters()), model=ref, bytes_per_pack=BUCKET
    )
    opt = hdt.DistributedOptimizer(
        torch.optim.Adam(net.parameters()), model=net, bytes_per_pack=BUCKET, shard=stage
    )
    for step in range(2):
        _step(ref, ref_opt, step)
        _step(net, opt, step)
        opt.wait_parameters()
    full_state = _state_bytes(ref_opt)
    mine = _state_bytes(opt.local_optimizer)
    assert full_state > 0 and mine > 0
    assert mine <= full_state / n + BUCKET
    # gradients after a backward, before the step: what each rank holds
    for model, o in ((ref, ref_opt), (net, opt)):
        x, y = _batch(7)
        o.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        o.synchronize()
    full_grads = _grad_bytes(ref, [])
    held = _grad_bytes(net, [opt.shard_gradients()])
    if stage == "gradients":
        assert all(p.grad is None for p in net.parameters())
        assert held <= full_grads / n + BUCKET
    else:
        assert held >= full_grads  # ZeRO-1 keeps the full averaged gradients


@pytest.mark.parametrize("overlap", [True, False])
def test_sgd_groups_scheduler_and_accumulation_match(overlap: bool) -> None:
    def make(model, shard):
        p = list(model.parameters())
        sgd = torch.optim.SGD(
            [{"params": p[:2], "lr": 0.05}, {"params": p[2:]}], lr=0.1, momentum=0.9
        )
        return hdt.DistributedOptimizer(
            sgd, model=model, bytes_per_pack=BUCKET, shard=shard, backward_passes_per_step=2,
            overlap=overlap,
        )

    ref, net = _model(), _model()
    ref_opt, opt = make(ref, None), make(net, "gradients")
    scheds = [torch.optim.lr_scheduler.StepLR(o, step_size=2, gamma=0.5) for o in (ref_opt, opt)]
    for step in range(6):
        x, y = _batch(step)
        for model, o, s in ((ref, ref_opt, scheds[0]), (net, opt, scheds[1])):
            o.zero_grad()
            for xm, ym in zip(x.chunk(2), y.chunk(2), strict=True):
                torch.nn.functional.mse_loss(model(xm), ym).backward()
            o.step()
            s.step()
        opt.wait_parameters()
    for a, b in zip(net.parameters(), ref.parameters(), strict=True):
        assert _rel(a.detach(), b.detach()) <= 1e-6
    assert opt.param_groups[0]["lr"] == ref_opt.param_groups[0]["lr"] == 0.05 * 0.5**3


def test_state_dict_round_trip_and_mismatch_is_typed() -> None:
    net = _model()
    opt = hdt.DistributedOptimizer(
        torch.optim.Adam(net.parameters()), model=net, bytes_per_pack=BUCKET, shard="optimizer"
    )
    _step(net, opt, 0)
    sd = copy.deepcopy(opt.state_dict())  # torch's state_dict holds the live tensors
    assert sd["hpcdist_shard"]["world_size"] == world().size
    assert sd["hpcdist_shard"]["rank"] == world().rank
    before = [t.clone() for t in opt.local_optimizer.state[opt.local_optimizer.param_groups[0]
                                                             ["params"][0]].values()]
    _step(net, opt, 1)
    opt.load_state_dict(sd)
    after = list(opt.local_optimizer.state[opt.local_optimizer.param_groups[0]["params"][0]]
                 .values())
    for a, b in zip(before, after, strict=True):
        assert torch.equal(a, b)
    bad = dict(sd, hpcdist_shard=dict(sd["hpcdist_shard"], world_size=world().size + 1))
    with pytest.raises(ShardingError, match="world_size"):
        opt.load_state_dict(bad)


def test_bad_shard_values_are_typed_errors() -> None:
    net = _model()
    with pytest.raises(ShardingError, match="'optimizer'"):
        hdt.DistributedOptimizer(torch.optim.Adam(net.parameters()), shard="zero3")
    mixed = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Linear(2, 2).double())
    with pytest.raises(ShardingError, match="one dtype"):
        hdt.DistributedOptimizer(torch.optim.Adam(mixed.parameters()), shard="optimizer")
    opt = hdt.DistributedOptimizer(torch.optim.Adam(net.parameters()), shard="optimizer")
    with pytest.raises(ShardingError, match="nothing to broadcast"):
        hdt.broadcast_optimizer_state(opt, root=0)


def test_without_model_the_gather_completes_in_step() -> None:
    ref, net = _model(), _model()
    ref_opt = hdt.DistributedOptimizer(torch.optim.Adam(ref.parameters()), bytes_per_pack=BUCKET)
    opt = hdt.DistributedOptimizer(
        torch.optim.Adam(net.parameters()), bytes_per_pack=BUCKET, shard="gradients"
    )
    for step in range(3):
        _step(ref, ref_opt, step)
        _step(net, opt, step)
        for a, b in zip(net.parameters(), ref.parameters(), strict=True):  # no wait needed
            assert _rel(a.detach(), b.detach()) <= 1e-6
