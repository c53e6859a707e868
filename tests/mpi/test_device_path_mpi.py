"""The engine's device path across ranks, on the fake GPU array (host memory behind
``__cuda_array_interface__``): pinned staging, CUDA-aware MPI, and NCCL / hierarchical
through the fake NCCL provider. A spy communicator records whether a device array was
ever handed to MPI."""

from __future__ import annotations

import numpy as np
import pytest

from hpcdist.collectives import Collectives, CommunicationOptions
from hpcdist.runtime import mpi
from hpcdist.runtime.device import is_device_array
from tests.support.fake_gpu import RUNTIME, FakeGpuArray, fake

MPI = mpi()
pytestmark = pytest.mark.mpi(min_size=2)


class SpyComm:
    """An mpi4py communicator that records the MPI calls given a device array."""

    def __init__(self, comm):
        self._comm = comm
        self.device_calls: list[str] = []

    def __getattr__(self, name):
        attr = getattr(self._comm, name)
        if not callable(attr) or not name[:1].isupper():
            return attr

        def call(*args, **kwargs):
            stack = list(args)
            while stack:
                a = stack.pop()
                if isinstance(a, (list, tuple)):
                    stack.extend(a)
                elif is_device_array(a):
                    self.device_calls.append(name)
            return attr(*args, **kwargs)

        return call


@pytest.fixture
def spy(monkeypatch):
    comm = MPI.COMM_WORLD.Dup()
    yield SpyComm(comm)
    comm.Free()


def _inputs(rank):
    rng = np.random.default_rng(100 + rank)
    return [
        rng.normal(size=(4, 3)).astype(np.float32),
        rng.integers(-50, 50, size=7).astype(np.int16),
        rng.normal(size=5).astype(np.float64),
        rng.normal(size=3).astype(np.float16),
        (rng.normal(size=2) + 1j).astype(np.complex128),
        rng.integers(0, 9, size=4).astype(np.int32),
    ]


def _everyone(size):
    return [_inputs(r) for r in range(size)]


def _expected(op, size):
    everyone = _everyone(size)
    out = []
    for parts in zip(*everyone, strict=True):
        stack = np.stack(parts)
        if op == "SUM":
            want = stack.sum(axis=0, dtype=np.float32 if parts[0].dtype == np.float16 else None)
            want = want.astype(parts[0].dtype)
        elif op == "MEAN":
            want = stack.astype(np.float64).mean(axis=0) if parts[0].dtype.kind == "i" else (
                (stack.astype(np.float32).sum(0) / size).astype(np.float16)
                if parts[0].dtype == np.float16 else stack.sum(axis=0) / size
            )
        elif op == "MAX":
            want = stack.max(axis=0)
        else:
            want = stack.min(axis=0)
        out.append(want)
    return out


def _check(out, want):
    for o, w in zip(out, want, strict=True):
        assert isinstance(o, FakeGpuArray)
        assert o.dtype == w.dtype and o.shape == w.shape
        tol = 2e-3 if w.dtype == np.float16 else 1e-6
        np.testing.assert_allclose(o.get(), w, rtol=tol, atol=tol)


@pytest.mark.parametrize("implementation", ["AUTO", "MPI", "SHM", "HIERARCHICAL"])
@pytest.mark.parametrize("op", ["SUM", "MEAN", "MAX"])
def test_staged_without_cuda_aware_mpi_never_gives_mpi_a_device_pointer(
    spy, monkeypatch, implementation, op
):
    monkeypatch.setenv("HPCDIST_CUDA_AWARE_MPI", "0")
    engine = Collectives(spy, CommunicationOptions(implementation=implementation))
    inputs = _inputs(spy.Get_rank())
    if op == "MAX":
        inputs = [x for x in inputs if x.dtype.kind != "c"]
    before = RUNTIME.calls["to_host"]
    out = engine.allreduce([fake(x) for x in inputs], op)
    assert engine.last_device_route == "staged"
    assert engine.last_algorithm == "staged"  # the registry's device fallback
    assert RUNTIME.calls["to_host"] > before  # it went through host memory
    want = _expected(op, spy.Get_size())
    if op == "MAX":
        want = [w for w in want if w.dtype.kind != "c"]
    _check(out, want)
    assert spy.device_calls == []
    engine.close()


def test_staging_reuses_its_pinned_buffers(spy, monkeypatch):
    monkeypatch.setenv("HPCDIST_CUDA_AWARE_MPI", "0")
    engine = Collectives(spy)
    x = fake(np.ones(1000, np.float32))
    engine.allreduce([x], "SUM")
    pinned = RUNTIME.calls["pinned"]
    waits = RUNTIME.calls["wait"]
    for _ in range(3):
        (y,) = engine.allreduce([x], "SUM")
    assert RUNTIME.calls["pinned"] == pinned  # no new pinned memory per step
    assert RUNTIME.calls["wait"] == waits + 3  # each reuse waits for the last copy out
    np.testing.assert_array_equal(y.get(), np.full(1000, spy.Get_size(), np.float32))
    engine.close()


def test_staged_allgather_and_reduce_scatter_reuse_their_pinned_buffers(spy, monkeypatch):
    monkeypatch.setenv("HPCDIST_CUDA_AWARE_MPI", "0")
    engine = Collectives(spy, CommunicationOptions(implementation="MPI"))
    rank, size = spy.Get_rank(), spy.Get_size()
    x = np.arange(2 * size, dtype=np.float64) + rank
    engine.allgather(fake(x))
    engine.reduce_scatter(fake(x), "SUM")
    pinned, waits = RUNTIME.calls["pinned"], RUNTIME.calls["wait"]
    for _ in range(3):
        gathered = engine.allgather(fake(x))
        block = engine.reduce_scatter(fake(x), "SUM")
    assert engine.last_device_route == "staged"
    assert RUNTIME.calls["pinned"] == pinned  # no new pinned memory per call
    assert RUNTIME.calls["wait"] == waits + 6  # each reuse waits for the copy out of it
    want = np.concatenate([np.arange(2 * size, dtype=np.float64) + r for r in range(size)])
    np.testing.assert_array_equal(gathered.get(), want)
    total = sum(np.arange(2 * size, dtype=np.float64) + r for r in range(size))
    np.testing.assert_array_equal(block.get(), total[2 * rank : 2 * rank + 2])
    engine.close()


@pytest.mark.parametrize("op", ["SUM", "MEAN", "MIN"])
def test_cuda_aware_mpi_gets_device_buffers(spy, monkeypatch, op):
    monkeypatch.setenv("HPCDIST_CUDA_AWARE_MPI", "1")
    engine = Collectives(spy, CommunicationOptions(implementation="MPI"))
    inputs = [x for x in _inputs(spy.Get_rank()) if x.dtype.kind != "c" or op != "MIN"]
    before = RUNTIME.calls["to_host"]
    out = engine.allreduce([fake(x) for x in inputs], op)
    assert engine.last_device_route == "mpi-device"
    assert engine.last_algorithm == "mpi-device"
    assert RUNTIME.calls["to_host"] == before  # nothing staged
    assert "Allreduce" in spy.device_calls or "Reduce" in spy.device_calls
    want = [w for w in _expected(op, spy.Get_size()) if w.dtype.kind != "c" or op != "MIN"]
    _check(out, want)
    engine.close()


@pytest.mark.parametrize("aware", ["0", "1"])
def test_broadcast_allgather_reduce_scatter(spy, monkeypatch, aware):
    monkeypatch.setenv("HPCDIST_CUDA_AWARE_MPI", aware)
    engine = Collectives(spy, CommunicationOptions(implementation="MPI"))
    rank, size = spy.Get_rank(), spy.Get_size()
    mine = [np.full((2, 3), rank, np.float32), np.arange(rank + 1, dtype=np.int64)]
    root_values = [np.full((2, 3), size - 1, np.float32), np.arange(size, dtype=np.int64)]
    shaped = [mine[0], np.zeros(size, np.int64)]
    out = engine.broadcast([fake(x) for x in (shaped if rank != size - 1 else root_values)],
                           root=size - 1)
    np.testing.assert_array_equal(out[0].get(), root_values[0])
    np.testing.assert_array_equal(out[1].get(), root_values[1])
    gathered = engine.allgather(fake(mine[1]))  # uneven rows
    want = np.concatenate([np.arange(r + 1) for r in range(size)])
    np.testing.assert_array_equal(gathered.get(), want)
    block = engine.reduce_scatter(fake(np.arange(2 * size + 1, dtype=np.float64)), "SUM")
    bounds = np.array_split(np.arange(2 * size + 1, dtype=np.float64) * size, size)[rank]
    np.testing.assert_array_equal(block.get(), bounds)
    if aware == "0":
        assert spy.device_calls == []
    engine.close()


def test_mismatched_device_calls_raise_on_every_rank(spy, monkeypatch):
    from hpcdist.errors import CollectiveMismatchError

    monkeypatch.setenv("HPCDIST_CUDA_AWARE_MPI", "1")
    engine = Collectives(spy, CommunicationOptions(implementation="MPI"))
    n = 3 if spy.Get_rank() == 0 else 4
    with pytest.raises(CollectiveMismatchError, match="float32"):
        engine.allreduce([fake(np.ones(n, np.float32))], "SUM")
    engine.close()


@pytest.fixture
def fake_nccl_provider():
    from hpcdist.collectives.nccl import set_nccl_provider
    from tests.support import fake_nccl

    set_nccl_provider(fake_nccl)
    yield fake_nccl
    set_nccl_provider(None)


def _nccl_inputs(rank):
    return [x for x in _inputs(rank) if x.dtype != np.int16]


@pytest.mark.parametrize("implementation", ["AUTO", "NCCL", "HIERARCHICAL"])
@pytest.mark.parametrize("op", ["SUM", "MEAN", "MAX"])
def test_nccl_routes(spy, monkeypatch, fake_nccl_provider, implementation, op):
    monkeypatch.setenv("HPCDIST_CUDA_AWARE_MPI", "0")
    engine = Collectives(spy, CommunicationOptions(implementation=implementation))
    inputs = [x for x in _nccl_inputs(spy.Get_rank()) if op != "MAX" or x.dtype.kind != "c"]
    before = dict(fake_nccl_provider.calls)
    out = engine.allreduce([fake(x) for x in inputs], op)
    nodes = engine.session.topology().nodes
    expected_route = "hierarchical" if implementation == "HIERARCHICAL" and nodes > 1 else "nccl"
    assert engine.last_device_route == expected_route
    assert engine.last_algorithm == expected_route  # (one set of names)
    used = {k for k, v in fake_nccl_provider.calls.items() if v > before.get(k, 0)}
    if expected_route == "nccl":
        assert "allReduce" in used
    else:
        assert {"reduce", "bcast"} & used or "broadcast" in used
    want = [
        w for i, w in enumerate(_expected(op, spy.Get_size()))
        if i != 1 and (op != "MAX" or w.dtype.kind != "c")  # [1] is the int16 tensor
    ]
    _check(out, want)
    assert spy.device_calls == []  # NCCL, and staged MPI between leaders: never MPI on device
    engine.close()


def test_dtype_nccl_lacks_is_staged(spy, monkeypatch, fake_nccl_provider):
    monkeypatch.setenv("HPCDIST_CUDA_AWARE_MPI", "0")
    engine = Collectives(spy)
    (out,) = engine.allreduce([fake(np.full(3, 2, np.int16))], "SUM")
    assert engine.last_device_route == "staged"
    assert engine.last_algorithm == "staged"  # nccl does not apply to int16
    np.testing.assert_array_equal(out.get(), np.full(3, 2 * spy.Get_size(), np.int16))
    engine.close()


def test_nccl_gather_scatter_broadcast(spy, fake_nccl_provider):
    engine = Collectives(spy, CommunicationOptions(implementation="NCCL"))
    rank, size = spy.Get_rank(), spy.Get_size()
    g = engine.allgather(fake(np.full((2, 2), rank, np.float32)))
    assert engine.last_device_route == "nccl"
    np.testing.assert_array_equal(g.get(), np.repeat(np.arange(size, dtype=np.float32), 2)[:, None]
                                  * np.ones((1, 2), np.float32))
    rs = engine.reduce_scatter(fake(np.arange(3 * size, dtype=np.int32)), "MEAN")
    assert engine.last_device_route == "nccl" and rs.dtype == np.float64
    np.testing.assert_array_equal(rs.get(), np.arange(3 * rank, 3 * rank + 3, dtype=np.float64))
    (b,) = engine.broadcast([fake(np.full(4, rank, np.int64))], root=1)
    np.testing.assert_array_equal(b.get(), np.ones(4, np.int64))
    uneven = engine.allgather(fake(np.arange(rank + 1, dtype=np.float32)))
    assert engine.last_device_route == "staged"
    assert uneven.shape == (size * (size + 1) // 2,)
    engine.close()


@pytest.mark.parametrize("implementation", ["AUTO", "HIERARCHICAL"])
def test_ranks_sharing_one_gpu_take_the_staged_route(spy, monkeypatch, fake_nccl_provider,
                                                     implementation):
    # NCCL refuses one GPU twice in a communicator ("Duplicate GPU detected"): the ranks
    # learn once (their GPUs' UUIDs, allgathered) that they share a GPU, and AUTO stages.
    monkeypatch.setenv("HPCDIST_CUDA_AWARE_MPI", "0")
    monkeypatch.setattr(type(RUNTIME), "device_identity", lambda self, device=None: "GPU-0-uuid")
    engine = Collectives(spy, CommunicationOptions(implementation=implementation))
    before = dict(fake_nccl_provider.calls)
    for _ in range(2):
        out = engine.allreduce([fake(x) for x in _nccl_inputs(spy.Get_rank())], "SUM")
        assert engine.last_device_route == "staged"
    want = [w for i, w in enumerate(_expected("SUM", spy.Get_size())) if i != 1]
    _check(out, want)
    assert fake_nccl_provider.calls == before  # NCCL never asked
    (b,) = engine.broadcast([fake(np.full(4, spy.Get_rank(), np.int64))], root=0)
    assert engine.last_device_route == "staged" and b.get().tolist() == [0] * 4
    engine.close()


def test_a_strided_out_array_is_refused_not_corrupted(spy, monkeypatch):
    from hpcdist.runtime.device import DeviceArrayError

    monkeypatch.setenv("HPCDIST_CUDA_AWARE_MPI", "0")
    engine = Collectives(spy)
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    base = np.zeros((3, 2), np.float32)
    target = FakeGpuArray(base).T  # shape (2, 3), strided
    with pytest.raises(DeviceArrayError, match="not C-contiguous"):
        engine.allreduce([fake(x)], "SUM", out=[target])
    assert not base.any()  # nothing written through the strided view
    engine.close()
