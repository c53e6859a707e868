"""hpcdist.torch on several ranks: N ranks on 1/N of each global batch == 1 process on it."""

from __future__ import annotations

import copy

import pytest
import torch

import hpcdist.torch as hdt
from hpcdist.errors import CollectiveMismatchError
from hpcdist.runtime import world

pytestmark = pytest.mark.mpi

GLOBAL_BATCH = 24
STEPS = 4


def _model() -> torch.nn.Module:
    torch.manual_seed(1)
    return torch.nn.Sequential(
        torch.nn.Linear(5, 16), torch.nn.Tanh(), torch.nn.Linear(16, 8), torch.nn.Tanh(),
        torch.nn.Linear(8, 3),
    ).double()


def _data(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(100 + step)
    x = torch.randn(GLOBAL_BATCH, 5, generator=g, dtype=torch.float64)
    y = torch.randn(GLOBAL_BATCH, 3, generator=g, dtype=torch.float64)
    return x, y


def _shard(t: torch.Tensor, rank: int, size: int) -> torch.Tensor:
    per = t.shape[0] // size
    return t[rank * per : (rank + 1) * per]


def _optimizer(model: torch.nn.Module, kind: str) -> torch.optim.Optimizer:
    params = list(model.parameters())
    if kind == "sgd":
        groups = [{"params": params[:2], "lr": 0.05}, {"params": params[2:]}]
        return torch.optim.SGD(groups, lr=0.1, momentum=0.9)
    return torch.optim.Adam(params, lr=0.01)


def _train(model, opt, rank, size, passes, scaler=None):
    for step in range(STEPS):
        x, y = _data(step)
        x, y = _shard(x, rank, size), _shard(y, rank, size)
        opt.zero_grad()
        for xm, ym in zip(x.chunk(passes), y.chunk(passes), strict=True):
            loss = torch.nn.functional.mse_loss(model(xm), ym)
            (scaler.scale(loss) if scaler else loss).backward()
        if scaler:
            scaler.step(opt)
            scaler.update()
        else:
            opt.step()


@pytest.mark.parametrize("kind", ["sgd", "adam"])
@pytest.mark.parametrize("passes", [1, 2])
@pytest.mark.parametrize("overlap", [True, False])
def test_equivalence_with_one_process(kind, passes, overlap) -> None:
    w = world()
    reference = _model()
    _train(reference, _optimizer(reference, kind), 0, 1, passes)
    model = _model()
    opt = hdt.DistributedOptimizer(
        _optimizer(model, kind), model=model, bytes_per_pack=256,
        backward_passes_per_step=passes, overlap=overlap,
    )
    assert len(opt._hd._buckets) > 1  # several buckets, started while backward runs
    _train(model, opt, w.rank, w.size, passes)
    for p, q in zip(model.parameters(), reference.parameters(), strict=True):
        assert torch.allclose(p, q, rtol=0, atol=1e-9), (p - q).abs().max()


def test_grad_scaler_equivalence_and_agreed_skips() -> None:
    w = world()
    reference = _model()
    _train(reference, _optimizer(reference, "sgd"), 0, 1, 1)
    model = _model()
    opt = hdt.DistributedOptimizer(_optimizer(model, "sgd"), model=model, bytes_per_pack=256)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**10)
    _train(model, opt, w.rank, w.size, 1, scaler)
    for p, q in zip(model.parameters(), reference.parameters(), strict=True):
        assert torch.allclose(p, q, rtol=0, atol=1e-9)
    # An inf on rank 0 only: every rank skips the step and halves the scale.
    before = [p.detach().clone() for p in model.parameters()]
    opt.zero_grad()
    x, y = _data(9)
    loss = torch.nn.functional.mse_loss(model(x), y)
    if w.rank == 0:
        loss = loss * float("inf")
    scaler.scale(loss).backward()
    scale = scaler.get_scale()
    scaler.step(opt)
    scaler.update()
    assert scaler.get_scale() == scale / 2
    for p, b in zip(model.parameters(), before, strict=True):
        assert torch.equal(p, b)


def test_broadcast_parameters_and_optimizer_state() -> None:
    w = world()
    torch.manual_seed(w.rank)  # a different start on every rank
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4)).double()
    model[1].running_mean.fill_(float(w.rank))
    opt = torch.optim.Adam(model.parameters(), lr=0.1)
    if w.rank == 0:  # only the root has optimizer state
        model(torch.randn(8, 3, dtype=torch.float64)).sum().backward()
        opt.step()
    hdt.broadcast_parameters(model, root=0)
    hdt.broadcast_optimizer_state(opt, root=0)
    state = [t.detach().clone() for t in model.state_dict().values()]
    state += [v.clone() for s in opt.state.values() for v in s.values()]
    gathered = w.comm.allgather([t.numpy() for t in state])
    assert len(state) == 7 + 4 * 3  # 4 params + 3 BatchNorm buffers; Adam: step, m, v per param
    for theirs in gathered:
        for a, b in zip(theirs, gathered[0], strict=True):
            assert (a == b).all()
    assert not model[1].running_mean.eq(1.0).any()  # rank 1 filled it with 1.0


def test_state_dict_round_trip_and_zero_grad() -> None:
    w = world()
    model = _model()
    opt = hdt.DistributedOptimizer(torch.optim.Adam(model.parameters(), lr=0.01), model=model)
    _train(model, opt, w.rank, w.size, 1)
    saved = copy.deepcopy(opt.state_dict())
    twin = copy.deepcopy(model)
    twin_opt = hdt.DistributedOptimizer(torch.optim.Adam(twin.parameters(), lr=0.5), model=twin)
    twin_opt.load_state_dict(saved)
    assert twin_opt.param_groups[0]["lr"] == 0.01
    for o, m in ((opt, model), (twin_opt, twin)):
        o.zero_grad()
        assert all(p.grad is None for p in m.parameters())
        x, y = _data(7)
        x, y = _shard(x, w.rank, w.size), _shard(y, w.rank, w.size)
        torch.nn.functional.mse_loss(m(x), y).backward()
        o.step()
    for p, q in zip(model.parameters(), twin.parameters(), strict=True):
        assert torch.equal(p, q)


def test_mismatched_shapes_across_ranks_raise_on_every_rank() -> None:
    w = world()
    with pytest.raises(CollectiveMismatchError):
        hdt.allreduce(torch.ones(3 + w.rank), "SUM")
    assert hdt.allreduce(torch.ones(2), "SUM").tolist() == [float(w.size)] * 2


def test_strategy_api_takes_tensors_across_ranks() -> None:
    import hpcdist as hd

    w = world()
    s = hd.MultiWorkerMirroredStrategy()
    x = torch.full((2,), float(w.rank + 1))
    total = s.reduce("SUM", x, axis=None)
    expected = float(sum(range(1, w.size + 1)))
    assert isinstance(total, torch.Tensor) and total.tolist() == [expected] * 2

    def fn():
        ctx = hd.get_replica_context()
        return ctx.all_reduce("MEAN", {"x": x}), ctx.all_gather(x[:1], axis=0)

    mean, gathered = s.run(fn)
    assert isinstance(mean["x"], torch.Tensor) and mean["x"].tolist() == [expected / w.size] * 2
    assert gathered.tolist() == [float(r + 1) for r in range(w.size)]
    model = _model()
    opt = hdt.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), strategy=s)
    x, y = _data(0)
    xs, ys = _shard(x, w.rank, w.size), _shard(y, w.rank, w.size)
    torch.nn.functional.mse_loss(model(xs), ys).backward()
    opt.step()
    reference = _model()
    torch.nn.functional.mse_loss(reference(x), y).backward()
    torch.optim.SGD(reference.parameters(), lr=0.1).step()
    for p, q in zip(model.parameters(), reference.parameters(), strict=True):
        assert torch.allclose(p, q, rtol=0, atol=1e-9)
