"""hpcdist.horovod.torch on several ranks: every collective against a reference computed
from every rank's (deterministic) input, the autograd gradients Horovod defines, join,
process sets, the optimizer, SyncBatchNorm, and wrong arguments on one rank only."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

import hpcdist.horovod.torch as hvd
from hpcdist.errors import CollectiveMismatchError, HorovodMismatchError, ProcessSetError
from hpcdist.runtime import world

pytestmark = pytest.mark.mpi

DTYPES = [torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64, torch.float16,
          torch.bfloat16, torch.float32, torch.float64]


@pytest.fixture(autouse=True, scope="module")
def _init():
    hvd.init()
    yield


def _r() -> int:
    return hvd.rank()


def _n() -> int:
    return hvd.size()


def _value(rank: int, dtype: torch.dtype, shape=(2, 3)) -> torch.Tensor:
    base = torch.arange(int(np.prod(shape)), dtype=torch.float64).reshape(shape)
    return ((base + rank + 1) % 7 + 1).to(dtype)


def test_basics_match_the_runtime():
    w = world()
    assert hvd.is_initialized()
    assert (hvd.rank(), hvd.size()) == (w.rank, w.size)
    assert (hvd.local_rank(), hvd.local_size()) == (w.local_rank, w.local_size)
    assert (hvd.cross_rank(), hvd.cross_size()) == (w.node_index, w.node_count)
    assert hvd.is_homogeneous() == (len(set(w.comm.allgather(w.local_size))) == 1)
    assert hvd.mpi_built() and hvd.mpi_enabled() and hvd.mpi_threads_supported()
    assert not hvd.gloo_built() and not hvd.gloo_enabled()
    assert not hvd.rocm_built() and not hvd.ddl_built() and not hvd.ccl_built()
    assert isinstance(hvd.nccl_built(), bool) and isinstance(hvd.cuda_built(), bool)


@pytest.mark.parametrize("dtype", DTYPES)
def test_allreduce_every_dtype_and_op(dtype):
    values = [_value(r, dtype) for r in range(_n())]
    stack = torch.stack([v.double() for v in values])
    mine = values[_r()]
    assert torch.equal(hvd.allreduce(mine, op=hvd.Sum).double(),
                       stack.sum(0).to(dtype).double())
    assert torch.equal(hvd.allreduce(mine, op=hvd.Min), stack.min(0).values.to(dtype))
    assert torch.equal(hvd.allreduce(mine, op=hvd.Max), stack.max(0).values.to(dtype))
    prod = hvd.allreduce(mine, op=hvd.Product)
    assert torch.allclose(prod.double(), stack.prod(0).to(dtype).double(), rtol=2e-2)
    avg = hvd.allreduce(mine)  # Average: floats divide, integers floor-divide (as Horovod)
    if dtype.is_floating_point:
        tol = 1e-2 if dtype in (torch.float16, torch.bfloat16) else 1e-6
        assert torch.allclose(avg.double(), stack.mean(0), rtol=tol)
    else:
        assert torch.equal(avg, torch.div(stack.sum(0), _n(), rounding_mode="floor").to(dtype))
    assert avg.dtype == dtype


def test_bool_allreduce_min_max_and_refused_sum():
    mine = torch.tensor([True, _r() == 0, False])
    assert hvd.allreduce(mine, op=hvd.Max).tolist() == [True, True, False]
    assert hvd.allreduce(mine, op=hvd.Min).tolist() == [True, _n() == 1, False]
    with pytest.raises(HorovodMismatchError, match="bool"):
        hvd.allreduce(mine, op=hvd.Sum)


def test_scale_factors_average_argument_and_forms():
    x = torch.full((3,), float(_r() + 1))
    total = sum(range(1, _n() + 1))
    y = hvd.allreduce(x, op=hvd.Sum, prescale_factor=2.0, postscale_factor=0.5)
    assert y.tolist() == [float(total)] * 3
    assert hvd.allreduce(x, average=False).tolist() == [float(total)] * 3
    assert hvd.allreduce(x, average=True).tolist() == [total / _n()] * 3
    z = x.clone()
    assert hvd.allreduce_(z, op=hvd.Sum) is z and z.tolist() == [float(total)] * 3
    h = hvd.allreduce_async(x, op=hvd.Max, name="m")
    h2 = hvd.allreduce_async_(x.clone(), op=hvd.Min)
    assert hvd.synchronize(h).tolist() == [float(_n())] * 3
    hvd.synchronize(h2)
    assert hvd.poll(hvd.allreduce_async(x)) in (True, False)
    with pytest.raises(ValueError):
        hvd.allreduce(x, average=True, op=hvd.Sum)


def test_grouped_allreduce_all_forms():
    a, b = torch.full((2,), float(_r())), torch.full((3, 1), _r() + 1, dtype=torch.int32)
    s = sum(range(_n()))
    out = hvd.grouped_allreduce([a, b], op=hvd.Sum)
    assert out[0].tolist() == [float(s)] * 2 and out[1].flatten().tolist() == [s + _n()] * 3
    ins = [a.clone(), b.clone()]
    assert hvd.grouped_allreduce_(ins, op=hvd.Sum)[0] is ins[0]
    assert ins[1].flatten().tolist() == [s + _n()] * 3
    h = hvd.grouped_allreduce_async([a], op=hvd.Sum)
    assert hvd.synchronize(h)[0].tolist() == [float(s)] * 2
    c = [a.clone()]
    hvd.synchronize(hvd.grouped_allreduce_async_(c, op=hvd.Max))
    assert c[0].tolist() == [float(_n() - 1)] * 2


def test_adasum_matches_the_tree_rule():
    rng = np.random.default_rng(5)
    vecs = [rng.standard_normal(6) for _ in range(_n())]
    mine = torch.tensor(vecs[_r()])
    got = hvd.allreduce(mine, op=hvd.Adasum).numpy()

    def pair(a, b):
        d = a @ b
        return (1 - d / (2 * (a @ a))) * a + (1 - d / (2 * (b @ b))) * b

    level = vecs
    while len(level) > 1:
        level = [pair(level[i], level[i + 1]) for i in range(0, len(level) - 1, 2)] + (
            [level[-1]] if len(level) % 2 else [])
    np.testing.assert_allclose(got, level[0], rtol=1e-12)


@pytest.mark.parametrize("dtype", [*DTYPES, torch.bool])
def test_allgather_broadcast_alltoall_every_dtype(dtype):
    mine = _value(_r(), torch.float64, (_r() + 1, 2)).to(dtype)
    got = hvd.allgather(mine)
    want = torch.cat([_value(r, torch.float64, (r + 1, 2)).to(dtype) for r in range(_n())])
    assert got.dtype == dtype and torch.equal(got, want)
    root = _n() - 1
    b = hvd.broadcast(_value(_r(), dtype), root_rank=root)
    assert torch.equal(b, _value(root, dtype))
    splits = [1] * _n()
    out, received = hvd.alltoall(_value(_r(), torch.float64, (_n(), 2)).to(dtype), splits)
    want = torch.stack([_value(r, torch.float64, (_n(), 2)).to(dtype)[_r()]
                        for r in range(_n())])
    assert torch.equal(out, want) and received.tolist() == splits


def test_allgather_forms_and_gradient():
    x = torch.full((_r() + 1, 2), float(_r()), requires_grad=True)
    y = hvd.allgather(x)
    assert y.shape == (sum(range(1, _n() + 1)), 2)
    (y * (torch.arange(y.shape[0]).unsqueeze(1) + 1.0)).sum().backward()
    start = sum(range(1, _r() + 1))
    rows = torch.arange(start, start + _r() + 1, dtype=torch.float32).unsqueeze(1) + 1.0
    assert torch.equal(x.grad, (rows * _n()).expand(-1, 2))  # the sum over ranks
    assert hvd.synchronize(hvd.allgather_async(torch.tensor([_r()]))).tolist() == list(range(_n()))
    g = hvd.grouped_allgather([torch.tensor([_r()]), torch.ones(_r(), 3)])
    assert g[0].tolist() == list(range(_n())) and g[1].shape == (sum(range(_n())), 3)
    hg = hvd.synchronize(hvd.grouped_allgather_async([torch.tensor([_r()])]))
    assert hg[0].tolist() == list(range(_n()))


def test_broadcast_forms_and_gradient():
    x = torch.full((3,), float(_r()), requires_grad=True)
    y = hvd.broadcast(x, root_rank=0)
    assert y.tolist() == [0.0] * 3
    (y * 2).sum().backward()
    assert x.grad.tolist() == ([2.0 * _n()] * 3 if _r() == 0 else [0.0] * 3)
    z = torch.full((2,), float(_r()))
    assert hvd.broadcast_(z, 1 % _n()) is z and z.tolist() == [float(1 % _n())] * 2
    assert hvd.synchronize(hvd.broadcast_async(torch.tensor([_r()]), 0)).tolist() == [0]
    w = torch.tensor([_r()])
    hvd.synchronize(hvd.broadcast_async_(w, 0))
    assert w.tolist() == [0]


def test_alltoall_uneven_splits_and_gradient():
    # rank r sends j+1 rows to rank j: receives r+1 rows from every rank
    splits = torch.tensor([j + 1 for j in range(_n())], dtype=torch.int32)
    rows = int(splits.sum())
    x = (torch.arange(rows, dtype=torch.float64) + 100 * _r()).unsqueeze(1).repeat(1, 2)
    x.requires_grad_(True)
    out, received = hvd.alltoall(x, splits=splits)
    assert received.tolist() == [_r() + 1] * _n()
    start = sum(range(1, _r() + 1))
    want = torch.cat([torch.arange(start, start + _r() + 1, dtype=torch.float64) + 100 * r
                      for r in range(_n())])
    assert torch.equal(out[:, 0], want)
    (out * 3).sum().backward()
    assert torch.equal(x.grad, torch.full_like(x, 3.0))
    even, got = hvd.synchronize(hvd.alltoall_async(torch.arange(2 * _n())))
    assert got.tolist() == [2] * _n() and even.shape == (2 * _n(),)


def test_reducescatter_forms_and_gradient():
    rows = 2 * _n() + 1
    x = torch.arange(rows * 2, dtype=torch.float64).reshape(rows, 2) * (_r() + 1)
    x.requires_grad_(True)
    y = hvd.reducescatter(x, op=hvd.Sum)
    scale = sum(range(1, _n() + 1))
    bounds = np.cumsum([0] + [rows // _n() + (1 if r < rows % _n() else 0)
                              for r in range(_n())])
    ref = (torch.arange(rows * 2, dtype=torch.float64).reshape(rows, 2) * scale)
    assert torch.equal(y, ref[bounds[_r()]:bounds[_r() + 1]])
    y.sum().backward()
    assert torch.equal(x.grad, torch.ones_like(x))
    avg = hvd.reducescatter(torch.ones(_n(), 3))
    assert avg.tolist() == [[1.0] * 3]
    ints = hvd.reducescatter(torch.full((_n(),), 3, dtype=torch.int32))  # 3n // n
    assert ints.tolist() == [3]
    g = hvd.grouped_reducescatter([torch.ones(_n()), torch.ones(_n(), 2)], op=hvd.Sum)
    assert g[0].tolist() == [float(_n())] and g[1].tolist() == [[float(_n())] * 2]
    h = hvd.grouped_reducescatter_async([torch.ones(_n())], op=hvd.Sum)
    assert hvd.synchronize(h)[0].tolist() == [float(_n())]
    assert hvd.synchronize(hvd.reducescatter_async(torch.ones(_n()), op=hvd.Sum)).tolist() == [
        float(_n())]


def test_allreduce_gradient_is_the_allreduce_of_gradients():
    x = torch.ones(3, requires_grad=True)
    y = hvd.allreduce(x, op=hvd.Sum)
    (y * (_r() + 1)).sum().backward()
    assert x.grad.tolist() == [float(sum(range(1, _n() + 1)))] * 3
    a = torch.ones(2, requires_grad=True)
    out = hvd.grouped_allreduce([a, a * 2])
    (out[0].sum() + out[1].sum() * (_r() + 1)).backward()
    assert a.grad.tolist() == [1.0 + 2.0 * sum(range(1, _n() + 1)) / _n()] * 2


def test_barrier_and_join_contribute_zeros():
    hvd.barrier()
    # rank r takes part in r + 1 allreduces, then joins: the others see its zeros
    results = []
    for _ in range(_r() + 1):
        results.append(hvd.allreduce(torch.ones(2), op=hvd.Sum).tolist())
    last = hvd.join()
    assert last == _n() - 1
    for step, got in enumerate(results):
        assert got == [float(_n() - step)] * 2  # ranks >= step still had data
    assert hvd.allreduce(torch.ones(1), op=hvd.Sum).tolist() == [float(_n())]


def test_join_with_allgather_broadcast_and_alltoall():
    if _r() == 0:
        assert hvd.join() in range(_n())
        return
    g = hvd.allgather(torch.full((1, 2), float(_r())))
    assert g[:, 0].tolist() == [float(r) for r in range(1, _n())]  # rank 0: no rows
    b = hvd.broadcast(torch.full((2,), float(_r())), root_rank=1)
    assert b.tolist() == [1.0, 1.0]
    out, got = hvd.alltoall(torch.ones(_n(), 1), splits=[1] * _n())
    assert got.tolist() == [0] + [1] * (_n() - 1)
    hvd.join()


def test_wrong_arguments_on_one_rank_raise_on_every_rank():
    bad = _r() == _n() - 1
    cases = [
        lambda: hvd.allreduce(torch.ones(3 if bad else 2)),                       # shape
        lambda: hvd.allreduce(torch.ones(2, dtype=torch.float64 if bad else torch.float32)),
        lambda: hvd.allreduce(torch.ones(2), op=hvd.Max if bad else hvd.Sum),     # op
        lambda: hvd.broadcast(torch.ones(2), root_rank=1 % _n() if bad else 0),   # root
        lambda: hvd.allgather(torch.ones(2, 3 if bad else 2)),                    # trailing dim
        lambda: hvd.alltoall(torch.ones(_n()), splits=[_n()] * _n() if bad else None),
        lambda: hvd.allreduce("not a tensor" if bad else torch.ones(2)),          # type
        lambda: hvd.broadcast(torch.ones(2), root_rank=_n() if bad else 0),        # invalid root
        lambda: hvd.allreduce(torch.ones(2, dtype=torch.complex64) if bad else torch.ones(2)),
    ]
    if _n() == 1:
        cases = cases[5:]
    for case in cases:
        with pytest.raises(HorovodMismatchError) as info:
            case()
        assert isinstance(info.value, hvd.HorovodInternalError)
        assert isinstance(info.value, CollectiveMismatchError)
        assert f"rank {_n() - 1}" in str(info.value)
    assert hvd.allreduce(torch.ones(1), op=hvd.Sum).tolist() == [float(_n())]  # still usable


def test_objects_and_parameters():
    obj = hvd.broadcast_object({"rank": _r(), "list": [1, 2]}, root_rank=0)
    assert obj == {"rank": 0, "list": [1, 2]}
    assert hvd.allgather_object(("r", _r())) == [("r", r) for r in range(_n())]
    torch.manual_seed(_r())
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4))
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    gathered = hvd.allgather_object([p.detach().clone() for p in model.state_dict().values()])
    for other in gathered:
        assert all(torch.equal(a, b) for a, b in zip(other, gathered[0], strict=True))
    hvd.broadcast_parameters(list(model.named_parameters()), root_rank=0)
    opt = torch.optim.Adam(model.parameters(), lr=0.01 * (_r() + 1))
    if _r() == 0:
        model(torch.randn(5, 3)).sum().backward()
        opt.step()
    hvd.broadcast_optimizer_state(opt, root_rank=0)
    assert opt.param_groups[0]["lr"] == 0.01
    assert len(opt.state) == len(list(model.parameters()))


def _net():
    torch.manual_seed(3)
    return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))


def _batches(step):
    g = torch.Generator().manual_seed(step)
    return torch.randn(4 * _n(), 4, generator=g), torch.randn(4 * _n(), 2, generator=g)


@pytest.mark.parametrize("kw", [{}, {"op": hvd.Sum}, {"compression": hvd.Compression.fp16},
                                {"gradient_predivide_factor": 2.0, "num_groups": 2},
                                {"backward_passes_per_step": 2}])
def test_distributed_optimizer_equals_the_global_batch(kw):
    model, ref = _net(), _net()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   named_parameters=model.named_parameters(), **kw)
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1)
    passes = kw.get("backward_passes_per_step", 1)
    for step in range(3):
        x, y = _batches(step)
        opt.zero_grad()
        mine_x, mine_y = x[4 * _r():4 * _r() + 4], y[4 * _r():4 * _r() + 4]
        for cx, cy in zip(mine_x.chunk(passes), mine_y.chunk(passes), strict=True):
            torch.nn.functional.mse_loss(model(cx), cy, reduction="sum").backward()
        opt.step()
        ref_opt.zero_grad()
        loss = torch.nn.functional.mse_loss(ref(x), y, reduction="sum")
        (loss if kw.get("op") == hvd.Sum else loss / _n()).backward()
        ref_opt.step()
    tol = 5e-3 if "compression" in kw else 1e-5
    for p, q in zip(model.parameters(), ref.parameters(), strict=True):
        assert torch.allclose(p, q, atol=tol), kw


def test_distributed_optimizer_rejects_bad_arguments():
    model = _net()
    sgd = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(ValueError, match="Adasum"):
        hvd.DistributedOptimizer(sgd, op=hvd.Adasum)
    with pytest.raises(ValueError, match="unique"):
        hvd.DistributedOptimizer(sgd, named_parameters=[("a", p) for p in model.parameters()])
    with pytest.raises(ValueError, match="not in it"):
        hvd.DistributedOptimizer(sgd, named_parameters=list(model.named_parameters())[:1])
    with pytest.raises(ValueError, match="predivide"):
        hvd.DistributedOptimizer(sgd, op=hvd.Sum, gradient_predivide_factor=2.0)
    opt = hvd.DistributedOptimizer(copy.deepcopy(sgd))
    with opt.skip_synchronize():
        opt.step()


def test_sync_batch_norm_equals_batch_norm_over_the_global_batch():
    torch.manual_seed(11)
    x = torch.randn(3 * _n(), 4, 5, dtype=torch.float64)
    mine = x[3 * _r():3 * _r() + 3].clone().requires_grad_(True)
    full = x.clone().requires_grad_(True)
    sbn = hvd.SyncBatchNorm(4).double()
    bn = torch.nn.BatchNorm1d(4).double()
    with torch.no_grad():
        for m in (sbn, bn):
            m.weight.copy_(torch.linspace(0.5, 2.0, 4))
            m.bias.copy_(torch.linspace(-1.0, 1.0, 4))
    w = torch.randn(3 * _n(), 4, 5, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    y = sbn(mine)
    (y * w[3 * _r():3 * _r() + 3]).sum().backward()
    ref = bn(full)
    (ref * w).sum().backward()
    assert torch.allclose(y, ref[3 * _r():3 * _r() + 3], atol=1e-10)
    assert torch.allclose(mine.grad, full.grad[3 * _r():3 * _r() + 3], atol=1e-10)
    wgrad = hvd.allreduce(sbn.weight.grad, op=hvd.Sum)
    assert torch.allclose(wgrad, bn.weight.grad, atol=1e-10)
    assert torch.allclose(sbn.running_mean, bn.running_mean, atol=1e-12)
    assert torch.allclose(sbn.running_var, bn.running_var, atol=1e-12)
    sbn.eval()
    bn.eval()
    assert torch.allclose(sbn(x[:2]), bn(x[:2]), atol=1e-10)


def test_process_sets():
    if _n() < 2:
        pytest.skip("needs 2 ranks")  # never under the -n 2 / -n 4 runs
    # ranks 1..n-1, and (n=4) {1, 2}: with 2 virtual nodes of 2 ranks it crosses nodes
    upper = hvd.add_process_set(list(range(1, _n())))
    pair = hvd.add_process_set(hvd.ProcessSet([1, 2])) if _n() >= 4 else None
    assert upper.process_set_id is not None and upper.size() == _n() - 1
    assert upper.included() == (_r() >= 1)
    if upper.included():
        assert upper.rank() == _r() - 1
        got = hvd.allreduce(torch.tensor([float(_r())]), op=hvd.Sum, process_set=upper)
        assert got.tolist() == [float(sum(range(1, _n())))]
        assert hvd.allgather(torch.tensor([_r()]), process_set=upper).tolist() == list(
            range(1, _n()))
        assert hvd.broadcast(torch.tensor([_r()]), 0, process_set=upper).tolist() == [1]
        out, rec = hvd.alltoall(torch.arange(_n() - 1), process_set=upper)
        assert out.tolist() == [upper.rank()] * (_n() - 1)
        assert hvd.reducescatter(torch.ones(_n() - 1), op=hvd.Sum, process_set=upper).tolist() \
            == [float(_n() - 1)]
        hvd.barrier(process_set=upper)
        assert hvd.broadcast_object(_r(), root_rank=0, process_set=upper) == 1
        assert hvd.allgather_object(_r(), process_set=upper) == list(range(1, _n()))
    else:
        assert upper.rank() == -1
        with pytest.raises(ProcessSetError, match="not in process set"):
            hvd.allreduce(torch.ones(1), process_set=upper)
    if pair is not None and pair.included():
        got = hvd.allreduce(torch.tensor([float(_r())]), op=hvd.Sum, process_set=pair)
        assert got.tolist() == [3.0]
        nodes = hvd.allgather_object(hvd.cross_rank(), process_set=pair)
        assert (nodes[0] != nodes[1]) == (hvd.cross_size() == 2)  # 2 virtual nodes: crosses
        model, ref = _net(), _net()
        opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                       process_set=pair)
        x, y = _batches(0)
        part = (_r() - 1) * 2
        torch.nn.functional.mse_loss(model(x[part:part + 2]), y[part:part + 2],
                                     reduction="sum").backward()
        opt.step()
        torch.nn.functional.mse_loss(ref(x[:4]), y[:4], reduction="sum").div(2).backward()
        torch.optim.SGD(ref.parameters(), lr=0.1).step()
        for p, q in zip(model.parameters(), ref.parameters(), strict=True):
            assert torch.allclose(p, q, atol=1e-6)
    assert hvd.allreduce(torch.ones(1), op=hvd.Sum).tolist() == [float(_n())]
    with pytest.raises(ProcessSetError):
        hvd.add_process_set(list(range(1, _n())))  # the same ranks twice
    if pair is not None:
        assert hvd.remove_process_set(pair)
    assert hvd.remove_process_set(upper)
    assert not hvd.remove_process_set(upper)
    with pytest.raises(ProcessSetError, match="not added"):
        hvd.allreduce(torch.ones(1), process_set=upper)
    with pytest.raises(ProcessSetError):
        hvd.remove_process_set(hvd.global_process_set)


def test_join_with_distributed_optimizer_uneven_data():
    # rank r has r + 1 batches; after its last one it joins and contributes zero gradients
    def batch(step, rank):
        g = torch.Generator().manual_seed(1000 * step + rank)
        return torch.randn(3, 4, generator=g), torch.randn(3, 2, generator=g)

    model = _net()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   named_parameters=model.named_parameters())
    for step in range(_r() + 1):
        x, y = batch(step, _r())
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y, reduction="sum").backward()
        opt.step()
    last = hvd.join()
    assert last == _n() - 1
    hvd.broadcast_parameters(model.state_dict(), root_rank=last)
    ref = _net()
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1)
    for step in range(_n()):
        ref_opt.zero_grad()
        loss = sum(torch.nn.functional.mse_loss(ref(x), y, reduction="sum")
                   for x, y in (batch(step, r) for r in range(step, _n())))
        (loss / _n()).backward()  # Average over every rank, the joined ones adding zeros
        ref_opt.step()
    for p, q in zip(model.parameters(), ref.parameters(), strict=True):
        assert torch.allclose(p, q, atol=1e-6)


def test_timeline_merges_every_rank_into_one_trace():
    import json
    import tempfile

    w = world()
    base = tempfile.mkdtemp() if w.rank == 0 else None
    path = f"{w.comm.bcast(base, root=0)}/timeline.json"
    hvd.start_timeline(path)
    hvd.allreduce(torch.ones(4), name="tl")
    hvd.stop_timeline()
    with open(path) as f:
        trace = json.load(f)
    events = trace["traceEvents"]
    assert trace["otherData"]["hpcdist"]["ranks"] == list(range(_n()))
    assert {e["pid"] for e in events if e.get("name") == "allreduce"} == set(range(_n()))
