"""The collectives engine in one process: a world of one, and a fake peer for the MPI paths."""

from __future__ import annotations

import sys
import time
import types

import numpy as np
import pytest

from hpcdist.collectives import Collectives, CommunicationOptions, ReduceOp
from hpcdist.collectives.session import Topology
from hpcdist.errors import CollectiveTimeoutError, HpcdistError
from hpcdist.runtime import mpi, world

DTYPES = ["bool", "int8", "uint8", "int32", "int64", "float16", "float32", "float64", "complex64"]
SHAPES = [(), (0,), (1,), (7,), (3, 4), (2, 0, 3)]


def _valid(dtype: str, op: ReduceOp) -> bool:
    kind = np.dtype(dtype).kind
    if kind == "b":
        return op in (ReduceOp.MIN, ReduceOp.MAX)
    if kind == "c":
        return op in (ReduceOp.SUM, ReduceOp.MEAN)
    return True


def _sample(dtype: str, shape: tuple[int, ...], seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    values = rng.integers(-9, 10, size=shape)
    if np.dtype(dtype).kind == "b":
        return values > 0
    if np.dtype(dtype).kind == "u":
        values = np.abs(values)
    return values.astype(dtype)


class NoTrafficComm:
    """A one-rank communicator that fails on any MPI call."""

    def Get_rank(self):
        return 0

    def Get_size(self):
        return 1

    def __getattr__(self, name):
        raise AssertionError(f"a world of one must not call MPI ({name})")


class FakeRequest:
    def __init__(self, comm):
        self.comm = comm

    def Test(self):
        self.comm.tests += 1
        return self.comm.released

    def Wait(self):
        if not self.comm.released:
            raise AssertionError("Wait() on a request that can never complete")


class FakePeerComm:
    """Rank 0 of 2: records calls, moves no data; nonblocking calls finish once released."""

    def __init__(self, released=True):
        self.calls: list[str] = []
        self.args: list[tuple] = []
        self.released = released
        self.tests = 0

    def Get_rank(self):
        return 0

    def Get_size(self):
        return 2

    def __getattr__(self, name):
        if not name[:1].isupper():
            raise AttributeError(name)

        def call(*args):
            self.calls.append(name)
            self.args.append(args)
            if name.startswith("I") and name[1].islower():
                return FakeRequest(self)
            return None

        return call


def _over_fake(comm, options=None) -> Collectives:
    """An engine on a fake 2-rank communicator, told it has one rank per node (the MPI path)."""
    c = Collectives(comm, options)
    c.session.assume_topology(
        Topology(nodes=2, largest_node=1, window=None, leaders=None, node_rank=0)
    )
    return c


@pytest.fixture(params=["default", "self", "no-traffic"])
def single(request):
    if request.param == "default":
        return Collectives()
    if request.param == "self":
        return Collectives(mpi().COMM_SELF)
    return Collectives(NoTrafficComm())


# -- a world of one ------------------------------------------------------------


def test_world_of_one_describes_itself():
    c = Collectives()
    assert (c.rank, c.size) == (0, 1)
    assert c.comm is world().comm
    assert c.options == CommunicationOptions()
    opts = CommunicationOptions(timeout_seconds=5)
    assert Collectives(mpi().COMM_SELF, opts).options is opts
    assert "size=1" in repr(c)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("op", list(ReduceOp))
def test_world_of_one_allreduce_returns_new_equal_arrays(single, dtype, op):
    if not _valid(dtype, op):
        with pytest.raises(TypeError, match=op.name):
            single.allreduce([_sample(dtype, (3,))], op)
        return
    inputs = [_sample(dtype, shape, seed=i) for i, shape in enumerate(SHAPES)]
    before = [a.copy() for a in inputs]
    out = single.allreduce(inputs, op.name.lower())
    assert isinstance(out, list) and len(out) == len(inputs)
    for a, b, r in zip(inputs, before, out, strict=True):
        np.testing.assert_array_equal(a, b)
        assert isinstance(r, np.ndarray) and r.shape == a.shape
        assert not np.shares_memory(r, a)
        if op is ReduceOp.MEAN and a.dtype.kind in "iu":
            assert r.dtype == np.float64  # divide_mean's dtype for integers
        else:
            assert r.dtype == a.dtype
        np.testing.assert_array_equal(r, a)


def test_world_of_one_allgather_and_broadcast(single):
    x = _sample("float32", (2, 3))
    g = single.allgather(x, axis=1)
    np.testing.assert_array_equal(g, x)
    assert not np.shares_memory(g, x)
    scalar = single.allgather(np.float16(2.5))
    assert scalar.shape == (1,) and scalar.dtype == np.float16 and scalar[0] == 2.5
    np.testing.assert_array_equal(single.allgather(x, axis=-1), x)
    items = [np.arange(4), np.float64(3.0), np.zeros((0, 2), np.int8)]
    out = single.broadcast(items, root=0)
    for a, r in zip(items, out, strict=True):
        assert r.dtype == np.asarray(a).dtype and r.shape == np.shape(a)
        np.testing.assert_array_equal(r, a)
        assert not np.shares_memory(r, np.asarray(a))
    single.barrier()
    single.barrier(CommunicationOptions(timeout_seconds=1))


def test_allreduce_of_an_empty_list_is_empty(single):
    assert single.allreduce([], "SUM") == []
    assert single.broadcast([]) == []


def test_array_likes_become_arrays(single):
    out = single.allreduce([[1, 2], 3.5, np.float32(1.5)], "MAX")
    np.testing.assert_array_equal(out[0], [1, 2])
    assert out[1].shape == () and out[1] == 3.5
    assert out[2].dtype == np.float32


def test_bad_arguments_raise_clear_errors(single):
    with pytest.raises(TypeError, match="list of arrays"):
        single.allreduce(np.ones(3), "SUM")
    with pytest.raises(ValueError, match="SUM, MEAN, MIN, MAX"):
        single.allreduce([np.ones(3)], "avg")
    with pytest.raises(TypeError, match="boolean"):
        single.allreduce([np.ones(3, bool)], "SUM")
    with pytest.raises(TypeError, match="complex"):
        single.allreduce([np.ones(3, np.complex64)], "MAX")
    with pytest.raises(TypeError, match="dtype object"):
        single.allreduce([np.array([None, 1], dtype=object)], "SUM")
    with pytest.raises(TypeError, match="not supported"):
        single.allreduce([np.ones(2, np.longdouble)], "SUM")
    with pytest.raises(ValueError, match="axis is 2"):
        single.allgather(np.ones((2, 3)), axis=2)
    with pytest.raises(ValueError, match="axis is -2"):
        single.allgather(np.float32(1.0), axis=-2)
    with pytest.raises(TypeError, match="axis"):
        single.allgather(np.ones(3), axis=0.0)
    with pytest.raises(ValueError, match="0 <= root < 1"):
        single.broadcast([np.ones(2)], root=1)
    with pytest.raises(TypeError, match="root"):
        single.broadcast([np.ones(2)], root=True)
    with pytest.raises(TypeError, match="CommunicationOptions"):
        single.allreduce([np.ones(2)], "SUM", options={"timeout_seconds": 1})


def test_constructor_checks_its_arguments():
    with pytest.raises(TypeError, match="communicator"):
        Collectives(comm="world")
    with pytest.raises(TypeError, match="CommunicationOptions"):
        Collectives(mpi().COMM_SELF, options=30)


# -- GPU arrays are staged through the host and come back on their device --------------


class FakeDevice:
    current = 0

    def __init__(self, index):
        self.id = index

    def __enter__(self):
        self.saved, FakeDevice.current = FakeDevice.current, self.id
        return self

    def __exit__(self, *exc):
        FakeDevice.current = self.saved


class FakeGPUArray:
    """Host memory posing as a CuPy array (``type(x).__module__`` starts with ``cupy``)."""

    __module__ = "cupy.fake"

    def __init__(self, host, device):
        self.host = np.array(host, copy=True)
        self.device = FakeDevice(device)
        self.shape, self.dtype = self.host.shape, self.host.dtype

    def get(self):
        return self.host.copy()


def test_gpu_inputs_come_back_as_gpu_arrays_on_their_device(monkeypatch):
    fake = types.ModuleType("cupy")
    fake.cuda = types.SimpleNamespace(Device=FakeDevice)
    fake.array = lambda x, copy=True: FakeGPUArray(np.asarray(x), FakeDevice.current)
    monkeypatch.setitem(sys.modules, "cupy", fake)
    c = Collectives(NoTrafficComm())
    inputs = [FakeGPUArray(np.arange(3.0), 1), np.ones(2, np.int32)]
    out = c.allreduce(inputs, "SUM")
    assert isinstance(out[0], FakeGPUArray) and out[0].device.id == 1
    np.testing.assert_array_equal(out[0].host, [0.0, 1.0, 2.0])
    assert isinstance(out[1], np.ndarray)
    gathered = c.allgather(FakeGPUArray(np.ones((2, 2)), 3))
    assert isinstance(gathered, FakeGPUArray) and gathered.device.id == 3
    (sent,) = c.broadcast([FakeGPUArray(np.arange(2), 0)])
    assert isinstance(sent, FakeGPUArray)


# -- the MPI paths against a fake peer -------------------------------------------------


def test_blocking_mode_checks_metadata_then_uses_blocking_calls():
    comm = FakePeerComm()
    c = _over_fake(comm)
    out = c.allreduce([np.arange(5.0), np.arange(3)], "MAX")
    # One nonblocking metadata check, then floats via Reduce + Bcast, integers via Allreduce.
    assert comm.calls == ["Iallreduce", "Reduce", "Bcast", "Allreduce"]
    np.testing.assert_array_equal(out[0], np.arange(5.0))  # the fake peer adds nothing
    comm.calls.clear()
    # A floating sum over two ranks is commutative, so Allreduce gives both the same bits.
    c.allreduce([np.arange(5.0), np.arange(3)], "SUM")
    assert comm.calls == ["Iallreduce", "Allreduce", "Allreduce"]
    comm.calls.clear()
    c.broadcast([np.ones(3), np.ones(2, np.int8)], root=1)
    assert comm.calls == ["Iallreduce", "Bcast"]  # every dtype in one byte buffer
    comm.calls.clear()
    c.barrier()
    assert comm.calls == ["Iallreduce"]


def test_float16_travels_as_float16_and_is_summed_in_float32_by_its_owner():
    comm = FakePeerComm()
    out = _over_fake(comm).allreduce([np.ones(100, np.float16)], "MEAN")
    # reduce-scatter then all-gather of 16-bit values (hpcdist.collectives.wire16):
    # rank 0 owns elements 0-63, sends 64-99 (72 bytes), then sends its 64 (128 bytes)
    assert comm.calls == ["Iallreduce", "Irecv", "Isend", "Irecv", "Isend"]
    assert [comm.args[i][0].nbytes for i in (1, 2, 3, 4)] == [128, 72, 72, 128]
    assert out[0].dtype == np.float16 and out[0].shape == (100,)


def test_mpi_message_bytes_splits_the_fused_buffer():
    comm = FakePeerComm()
    c = _over_fake(comm, CommunicationOptions(mpi_message_bytes=16))
    c.allreduce([np.ones(3), np.ones(2)], "MAX")  # 5 float64 = 40 bytes -> 3 messages
    assert comm.calls == ["Iallreduce"] + ["Reduce", "Bcast"] * 3
    assert [len(a[1]) for a in comm.args[1::2]] == [2, 2, 1]


def test_bytes_per_pack_is_the_bucket_size_not_the_mpi_message_size():
    comm = FakePeerComm()
    c = _over_fake(comm, CommunicationOptions(bytes_per_pack=16))
    c.allreduce([np.ones(3), np.ones(2)], "MAX")
    assert comm.calls == ["Iallreduce", "Reduce", "Bcast"]  # one message for the group


def test_timeout_mode_uses_nonblocking_calls():
    comm = FakePeerComm()
    c = _over_fake(comm)
    tensors = [np.ones(4, np.float32), np.ones(2, np.int64)]
    c.allreduce(tensors, "MIN", CommunicationOptions(timeout_seconds=5))
    assert comm.calls == ["Iallreduce", "Ireduce", "Ibcast", "Iallreduce"]
    comm.calls.clear()
    c.broadcast(tensors, options=CommunicationOptions(timeout_seconds=5))
    c.barrier(CommunicationOptions(timeout_seconds=5))
    assert comm.calls == ["Iallreduce", "Ibcast", "Iallreduce"]


def test_timeout_raises_keeps_the_request_and_blocks_new_calls():
    comm = FakePeerComm(released=False)
    c = _over_fake(comm, CommunicationOptions(timeout_seconds=60))
    x = np.arange(5, dtype=np.float32)
    start = time.monotonic()
    with pytest.raises(CollectiveTimeoutError) as info:
        c.allreduce([x], "MAX", CommunicationOptions(timeout_seconds=0.2))
    elapsed = time.monotonic() - start
    err = info.value
    assert isinstance(err, TimeoutError) and isinstance(err, HpcdistError)
    assert 0.2 <= elapsed < 2.0
    message = str(err)
    assert message.startswith("allreduce(op=MAX, [float32(5,)]")
    assert "0.2 s" in message and "abort" in message.lower()
    # The waiting rank sleeps between tests (50 us up to 10 ms) instead of spinning.
    assert comm.tests < 200
    pending = err.request
    assert pending is not None and not pending.done and not pending.Test()
    # A new collective would be matched against the pending one: refused, no MPI call.
    calls = len(comm.calls)
    with pytest.raises(CollectiveTimeoutError, match="still pending"):
        c.barrier()
    assert len(comm.calls) == calls
    comm.released = True  # the late rank joins
    result = pending.Wait()
    assert pending.done and pending.Test()
    np.testing.assert_array_equal(result[0], x)
    assert comm.calls[calls:] == ["Ireduce", "Ibcast"]  # the rest ran nonblocking
    c.barrier()  # the engine works again


def test_pending_collective_progresses_with_test():
    comm = FakePeerComm(released=False)
    c = _over_fake(comm, CommunicationOptions(timeout_seconds=0.05))
    with pytest.raises(CollectiveTimeoutError) as info:
        c.broadcast([np.arange(3)])
    comm.released = True
    assert info.value.request.Test()
    assert info.value.request.result[0].tolist() == [0, 1, 2]
    assert "done=True" in repr(info.value.request)
