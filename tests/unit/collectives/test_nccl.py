"""The NCCL backend in one process: maps, availability, errors, the fake provider, local groups."""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest

from hpcdist.collectives import ReduceOp
from hpcdist.collectives import nccl as nc
from hpcdist.collectives.nccl import (
    CREATING_OVER,
    LocalNcclGroup,
    NcclCallError,
    NcclComm,
    NcclUnavailableError,
    nccl_available,
    nccl_provider,
    set_nccl_provider,
)
from hpcdist.errors import HpcdistError
from hpcdist.runtime import mpi
from tests.support import fake_nccl
from tests.support.fake_gpu import FakeGpuArray, fake

NCCL_DTYPES = ["int8", "uint8", "int32", "uint32", "int64", "uint64", "float16", "float32",
               "float64"]
REDUCE = {ReduceOp.SUM: np.add, ReduceOp.MIN: np.minimum, ReduceOp.MAX: np.maximum}


@pytest.fixture
def provider():
    set_nccl_provider(fake_nccl)
    yield fake_nccl
    set_nccl_provider(None)


@pytest.fixture
def comm(provider):
    c = NcclComm.create(mpi().COMM_SELF, 0)
    yield c
    c.close()


def _sample(dtype: str, n: int, seed: int) -> np.ndarray:
    values = np.random.default_rng(seed).integers(-40, 41, size=n)
    if np.dtype(dtype).kind == "u":
        values = np.abs(values)
    return values.astype(dtype)


# ---- maps and availability ----

def test_dtype_and_op_maps_name_cupy_constants():
    assert {str(d) for d in nc.NCCL_DTYPE_NAMES} == {*NCCL_DTYPES, "bfloat16"}
    for dtype, name in nc.NCCL_DTYPE_NAMES.items():
        assert name == f"NCCL_{dtype.name.upper()}"
        assert fake_nccl.DTYPES[getattr(fake_nccl, name)] == dtype
    assert nc.NCCL_OP_NAMES == {ReduceOp.SUM: "NCCL_SUM", ReduceOp.MIN: "NCCL_MIN",
                                ReduceOp.MAX: "NCCL_MAX"}
    # CuPy's values (cupy_backends/cuda/libs/nccl.pxd), which the fake copies
    assert (fake_nccl.NCCL_SUM, fake_nccl.NCCL_MAX, fake_nccl.NCCL_MIN) == (0, 2, 3)
    assert (fake_nccl.NCCL_FLOAT16, fake_nccl.NCCL_FLOAT64, fake_nccl.NCCL_BFLOAT16) == (6, 8, 9)


@pytest.mark.skipif(importlib.util.find_spec("cupy") is not None, reason="CuPy is installed")
def test_unavailable_without_cupy_says_so():
    set_nccl_provider(None)
    ok, reason = nccl_available()
    assert ok is False
    assert "CuPy" in reason
    with pytest.raises(NcclUnavailableError) as info:
        nccl_provider()
    assert isinstance(info.value, HpcdistError) and isinstance(info.value, RuntimeError)
    text = str(info.value)
    assert "CuPy is not installed" in text and "CommunicationImplementation" in text
    with pytest.raises(NcclUnavailableError):
        NcclComm.create(mpi().COMM_SELF, 0)
    with pytest.raises(NcclUnavailableError):
        LocalNcclGroup([0, 1])


def test_injected_provider_is_available_and_reverts(provider):
    ok, line = nccl_available()
    assert ok and line == "NCCL 2.21.5 via tests.support.fake_nccl"
    assert nccl_provider() is fake_nccl
    set_nccl_provider(None)
    try:
        assert nccl_provider() is not fake_nccl
    except NcclUnavailableError:
        pass


def test_set_provider_refuses_an_incomplete_module():
    with pytest.raises(TypeError, match="get_unique_id"):
        set_nccl_provider(object())


# ---- one rank with the fake provider ----

def test_create_on_a_world_of_one(comm):
    assert (comm.rank, comm.size, comm.device) == (0, 1, 0)
    assert comm.communicator.uid == fake_nccl.unique_ids[-1]
    assert CREATING_OVER.get() is None
    assert comm.supports("float16") and comm.supports(np.uint64)
    assert not any(comm.supports(d) for d in ("int16", "uint16", "complex64", "bool", "nonsense"))


@pytest.mark.parametrize("dtype", NCCL_DTYPES)
def test_every_call_on_one_rank_copies(comm, dtype):
    x = _sample(dtype, 7, 1)
    for op in REDUCE:
        out = fake(np.zeros_like(x))
        comm.allreduce(fake(x), out, op, 3)
        np.testing.assert_array_equal(out.get(), x)
    out = fake(np.zeros_like(x))
    comm.reduce(fake(x), out, "max", 0, 3)
    np.testing.assert_array_equal(out.get(), x)
    buf = fake(x)
    comm.broadcast(buf, 0, 3)
    np.testing.assert_array_equal(buf.get(), x)
    out = fake(np.zeros_like(x))
    comm.reduce_scatter(fake(x), out, ReduceOp.SUM, 3)
    np.testing.assert_array_equal(out.get(), x)
    out = fake(np.zeros_like(x))
    comm.allgather(fake(x), out, 3)
    np.testing.assert_array_equal(out.get(), x)


def test_in_place_and_empty(comm):
    x = fake(np.arange(5.0))
    comm.allreduce(x, x, "sum", 0)
    np.testing.assert_array_equal(x.get(), np.arange(5.0))
    before = fake_nccl.calls["allReduce"]
    empty = fake(np.zeros(0, np.float32))
    comm.allreduce(empty, empty, "sum", 0)  # nothing to move: NCCL is not called
    assert fake_nccl.calls["allReduce"] == before


def test_refusals_name_what_was_expected(comm):
    x, y = fake(np.ones(4, np.float32)), fake(np.ones(4, np.float32))
    with pytest.raises(ValueError, match="MEAN"):
        comm.allreduce(x, y, ReduceOp.MEAN, 0)
    with pytest.raises(TypeError, match="stream.ptr"):
        comm.allreduce(x, y, "sum", None)
    with pytest.raises(TypeError, match="int16 has no NCCL type"):
        comm.allreduce(fake(np.ones(4, np.int16)), fake(np.ones(4, np.int16)), "sum", 0)
    with pytest.raises(TypeError, match="device array"):
        comm.allreduce(np.ones(4, np.float32), y, "sum", 0)
    with pytest.raises(TypeError, match="float32 but recv is float64"):
        comm.allreduce(x, fake(np.ones(4)), "sum", 0)
    with pytest.raises(ValueError, match="recv has 3 elements; expected 4"):
        comm.allreduce(x, fake(np.ones(3, np.float32)), "sum", 0)
    with pytest.raises(ValueError, match="send has 4 elements; expected 8"):
        comm.reduce_scatter(x, fake(np.ones(8, np.float32)), "sum", 0)
    with pytest.raises(ValueError, match="recv has 3 elements; expected 4"):
        comm.allgather(x, fake(np.ones(3, np.float32)), 0)
    with pytest.raises(ValueError, match="expected a rank in 0..0"):
        comm.broadcast(x, 1, 0)
    with pytest.raises(ValueError, match="on GPU 1; expected GPU 0"):
        comm.allreduce(x, fake(np.ones(4, np.float32), device=1), "sum", 0)
    with pytest.raises(ValueError, match="C-contiguous"):
        comm.broadcast(fake(np.ones((2, 3), np.float32)).T, 0, 0)


def test_provider_errors_are_wrapped_with_context(comm, monkeypatch):
    def boom(*args):
        raise fake_nccl.NcclError("NCCL_ERROR_INVALID_USAGE: injected")

    monkeypatch.setattr(comm.communicator, "allGather", boom)
    with pytest.raises(NcclCallError) as info:
        comm.allgather(fake(np.ones(6, np.int32)), fake(np.ones(6, np.int32)), 0)
    text = str(info.value)
    for part in ("allgather", "rank 0 of 1", "int32", "count 6", "injected"):
        assert part in text
    assert isinstance(info.value.__cause__, fake_nccl.NcclError)


def test_close_is_idempotent_and_final(provider):
    c = NcclComm.create(mpi().COMM_SELF, 0)
    c.close()
    c.close()
    assert c.communicator is None and "closed" in repr(c)
    with pytest.raises(RuntimeError, match="closed"):
        c.broadcast(fake(np.ones(2)), 0, 0)


def test_fake_refuses_creation_outside_create_and_non_int_streams(comm):
    with pytest.raises(fake_nccl.NcclError, match="CREATING_OVER"):
        fake_nccl.NcclCommunicator(1, fake_nccl.get_unique_id(), 0)
    x = fake(np.ones(2, np.float32))
    ptr = x.__cuda_array_interface__["data"][0]
    with pytest.raises(TypeError, match="stream"):
        comm.communicator.allReduce(ptr, ptr, 2, fake_nccl.NCCL_FLOAT32, fake_nccl.NCCL_SUM,
                                    object())


# ---- LocalNcclGroup on three fake devices ----

@pytest.mark.parametrize("dtype", NCCL_DTYPES)
@pytest.mark.parametrize("op", list(REDUCE))
def test_local_group_allreduce_matches_numpy(provider, dtype, op):
    group = LocalNcclGroup([0, 1, 2])
    try:
        host = [_sample(dtype, 11, seed) for seed in range(3)]
        sends = [fake(h, device=d) for d, h in enumerate(host)]
        recvs = [fake(np.zeros_like(h), device=d) for d, h in enumerate(host)]
        group.allreduce(sends, recvs, op, [10, 11, 12])
        wide = [h.astype(np.float32) if h.dtype == np.float16 else h for h in host]
        expected = REDUCE[op].reduce(np.stack(wide)).astype(dtype)
        for d, r in enumerate(recvs):
            np.testing.assert_array_equal(r.get(), expected)
            np.testing.assert_array_equal(sends[d].get(), host[d])  # inputs untouched
    finally:
        group.close()


def test_local_group_in_place_and_broadcast(provider):
    group = LocalNcclGroup([2, 0, 5])
    try:
        host = [np.arange(6.0) * (i + 1) for i in range(3)]
        bufs = [fake(h, device=d) for h, d in zip(host, [2, 0, 5], strict=True)]
        group.allreduce(bufs, bufs, "sum", [0, 0, 0])
        for b in bufs:
            np.testing.assert_array_equal(b.get(), np.arange(6.0) * 6)
        bufs = [fake(h, device=d) for h, d in zip(host, [2, 0, 5], strict=True)]
        group.broadcast(bufs, 1, [1, 2, 3])
        for b in bufs:
            np.testing.assert_array_equal(b.get(), host[1])
    finally:
        group.close()


def test_local_group_refusals(provider):
    with pytest.raises(ValueError, match="distinct"):
        LocalNcclGroup([0, 0])
    group = LocalNcclGroup([0, 1])
    xs = [fake(np.ones(3), device=0), fake(np.ones(3), device=1)]
    with pytest.raises(ValueError, match="expected 2 of each"):
        group.allreduce(xs[:1], xs[:1], "sum", [0])
    with pytest.raises(ValueError, match="GPU 0; expected GPU 1"):
        group.allreduce([xs[0], xs[0]], xs, "sum", [0, 0])
    with pytest.raises(ValueError, match="elements; expected 3"):
        group.broadcast([xs[0], fake(np.ones(4), device=1)], 0, [0, 0])
    with pytest.raises(ValueError, match="root_index"):
        group.broadcast(xs, 2, [0, 0])
    group.close()
    with pytest.raises(RuntimeError, match="closed"):
        group.broadcast(xs, 0, [0, 0])


def test_local_group_wraps_errors_and_closes_the_group(provider, monkeypatch):
    group = LocalNcclGroup([0, 1])
    try:
        def boom(*args):
            raise fake_nccl.NcclError("injected")

        monkeypatch.setattr(group._comms[1], "allReduce", boom)
        xs = [fake(np.ones(3, np.float32), device=d) for d in (0, 1)]
        with pytest.raises(NcclCallError, match="failed at device 1") as info:
            group.allreduce(xs, xs, "sum", [0, 0])
        assert isinstance(info.value.__cause__, fake_nccl.NcclError)
        assert getattr(fake_nccl._state, "depth", 0) == 0  # groupEnd was still called
    finally:
        group.close()


def test_fake_group_refuses_calls_outside_a_group(provider):
    comms = fake_nccl.NcclCommunicator.initAll([0, 1])
    x = FakeGpuArray.from_host(np.ones(2, np.float32))
    ptr = x.__cuda_array_interface__["data"][0]
    with pytest.raises(fake_nccl.NcclError, match="outside"):
        comms[0].allReduce(ptr, ptr, 2, fake_nccl.NCCL_FLOAT32, fake_nccl.NCCL_SUM, 0)
