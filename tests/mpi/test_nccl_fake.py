"""NcclComm over real MPI ranks with the fake NCCL provider and fake GPU arrays.

Run under `mpirun -n 2` and `-n 4` (also with HPCDIST_VIRTUAL_NODES=2). Every rank builds
the inputs of every rank from (rank, dtype, salt), so it can check its result against a
NumPy computation of the whole communicator.
"""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest

from hpcdist.collectives import ReduceOp
from hpcdist.collectives import nccl as nccl_module
from hpcdist.collectives.nccl import (
    CREATING_OVER,
    NcclCallError,
    NcclComm,
    NcclUnavailableError,
    ranks_share_gpu,
    set_nccl_provider,
)
from hpcdist.runtime import mpi
from tests.support import fake_nccl
from tests.support.fake_gpu import fake

pytestmark = pytest.mark.mpi(min_size=2)

NCCL_DTYPES = ["int8", "uint8", "int32", "uint32", "int64", "uint64", "float16", "float32",
               "float64"]
REDUCE = {ReduceOp.SUM: np.add, ReduceOp.MIN: np.minimum, ReduceOp.MAX: np.maximum}
STREAM = 5


@pytest.fixture(autouse=True)
def provider():
    set_nccl_provider(fake_nccl)
    yield fake_nccl
    set_nccl_provider(None)


@pytest.fixture(scope="module", params=["world", "split"])
def setup(request):
    """``(NcclComm, world ranks of its members in its rank order)`` over COMM_WORLD or a split."""
    world = mpi().COMM_WORLD
    if request.param == "world":
        comm, members = world, list(range(world.Get_size()))
    else:
        color = world.Get_rank() % 2
        comm = world.Split(color, world.Get_rank())
        members = [r for r in range(world.Get_size()) if r % 2 == color]
    set_nccl_provider(fake_nccl)
    try:
        nc = NcclComm.create(comm, 0)
    finally:
        set_nccl_provider(None)
    yield nc, members
    nc.close()
    if comm is not world:
        comm.Free()


def _input(dtype: str, n: int, world_rank: int, salt: int) -> np.ndarray:
    values = np.random.default_rng([world_rank, salt]).integers(-20, 21, size=n)
    if np.dtype(dtype).kind == "u":
        values = np.abs(values)
    return values.astype(dtype)


def _reduce(arrays: list[np.ndarray], op: ReduceOp) -> np.ndarray:
    """NCCL's result: float16 reduced in float32 and rounded."""
    wide = [a.astype(np.float32) if a.dtype == np.float16 else a for a in arrays]
    return REDUCE[op].reduce(np.stack(wide)).astype(arrays[0].dtype)


def test_create_matches_the_mpi_communicator(setup):
    nc, members = setup
    world_rank = mpi().COMM_WORLD.Get_rank()
    assert nc.size == len(members) and members[nc.rank] == world_rank and nc.device == 0
    assert CREATING_OVER.get() is None


@pytest.mark.parametrize("form", ["bytes", "tuple"])  # CuPy >= 14 and CuPy 13
def test_the_unique_id_comes_from_rank_zero(monkeypatch, form):
    monkeypatch.setattr(fake_nccl, "ID_FORM", form)
    world = mpi().COMM_WORLD
    before = fake_nccl.calls["get_unique_id"]
    nc = NcclComm.create(world, 0)
    try:
        drawn = fake_nccl.calls["get_unique_id"] - before
        assert drawn == (1 if world.Get_rank() == 0 else 0)
        root_uid = np.zeros(128, np.int8)
        if world.Get_rank() == 0:
            drawn_id = fake_nccl.unique_ids[-1]
            root_uid[:] = (np.frombuffer(drawn_id, np.int8) if isinstance(drawn_id, bytes)
                           else np.array(drawn_id, np.int8))
        world.Bcast(root_uid, root=0)
        uid = nc.communicator.uid
        if form == "bytes":
            assert type(uid) is bytes and uid == root_uid.tobytes()
        else:
            assert uid == tuple(int(v) for v in root_uid)
            assert all(isinstance(v, int) for v in uid)
    finally:
        nc.close()


def test_ranks_on_one_gpu_are_refused_before_nccl_is_asked(monkeypatch):
    # NCCL itself would fail ("Duplicate GPU detected"): every rank raises the typed error
    world = mpi().COMM_WORLD
    monkeypatch.setattr(nccl_module, "_injected", None)
    monkeypatch.setattr(nccl_module, "nccl_provider", lambda: fake_nccl)
    monkeypatch.setattr(nccl_module, "device_identity", lambda device: "GPU-one-uuid")
    before = fake_nccl.calls["NcclCommunicator"]
    with pytest.raises(NcclUnavailableError, match="run on one GPU"):
        NcclComm.create(world, 0)
    assert fake_nccl.calls["NcclCommunicator"] == before
    assert ranks_share_gpu(world, "GPU-one-uuid") is True
    assert ranks_share_gpu(world, f"GPU-{world.Get_rank()}") is False
    assert ranks_share_gpu(world, None) is False  # unknown never matches


@pytest.mark.parametrize("dtype", NCCL_DTYPES)
def test_allreduce_every_dtype_and_op(setup, dtype):
    nc, members = setup
    for salt, op in enumerate(REDUCE):
        inputs = [_input(dtype, 13, r, salt) for r in members]
        recv = fake(np.zeros(13, dtype))
        nc.allreduce(fake(inputs[nc.rank]), recv, op, STREAM)
        np.testing.assert_array_equal(recv.get(), _reduce(inputs, op), err_msg=str(op))
    inputs = [_input(dtype, 7, r, 9).reshape(7, 1) for r in members]
    buf = fake(inputs[nc.rank])
    nc.allreduce(buf, buf, "sum", STREAM)  # in place, 2-D
    np.testing.assert_array_equal(buf.get(), _reduce(inputs, ReduceOp.SUM))


@pytest.mark.parametrize("dtype", ["int8", "uint64", "float16", "float32"])
def test_reduce_broadcast_reduce_scatter_allgather(setup, dtype):
    nc, members = setup
    root = nc.size - 1
    inputs = [_input(dtype, 11, r, 20) for r in members]
    recv = fake(np.zeros(11, dtype))
    nc.reduce(fake(inputs[nc.rank]), recv, ReduceOp.MAX, root, STREAM)
    if nc.rank == root:
        np.testing.assert_array_equal(recv.get(), _reduce(inputs, ReduceOp.MAX))

    buf = fake(inputs[nc.rank])
    nc.broadcast(buf, root, STREAM)
    np.testing.assert_array_equal(buf.get(), inputs[root])

    block = 5
    inputs = [_input(dtype, block * nc.size, r, 21) for r in members]
    recv = fake(np.zeros(block, dtype))
    nc.reduce_scatter(fake(inputs[nc.rank]), recv, "sum", STREAM)
    total = _reduce(inputs, ReduceOp.SUM)
    np.testing.assert_array_equal(recv.get(), total[nc.rank * block:(nc.rank + 1) * block])

    inputs = [_input(dtype, 3, r, 22) for r in members]
    recv = fake(np.zeros(3 * nc.size, dtype))
    nc.allgather(fake(inputs[nc.rank]), recv, STREAM)
    np.testing.assert_array_equal(recv.get(), np.concatenate(inputs))


def test_the_fake_refuses_disagreeing_unique_ids():
    world = mpi().COMM_WORLD
    uid = fake_nccl.get_unique_id()  # every rank its own: what a missing Bcast would give
    token = CREATING_OVER.set(world)
    try:
        with pytest.raises(fake_nccl.NcclError, match="another uid"):
            fake_nccl.NcclCommunicator(world.Get_size(), uid, world.Get_rank())
    finally:
        CREATING_OVER.reset(token)


def test_a_failing_rank_zero_fails_every_rank():
    class NoId:
        def __getattr__(self, name):
            return getattr(fake_nccl, name)

        def get_unique_id(self):
            raise fake_nccl.NcclError("injected")

    set_nccl_provider(NoId())
    world = mpi().COMM_WORLD
    expected = NcclCallError if world.Get_rank() == 0 else NcclUnavailableError
    with pytest.raises(expected, match="injected" if world.Get_rank() == 0 else r"rank\(s\) \[0\]"):
        NcclComm.create(world, 0)


@pytest.mark.skipif(importlib.util.find_spec("cupy") is not None, reason="CuPy is installed")
def test_ranks_without_nccl_fail_every_rank_instead_of_hanging():
    world = mpi().COMM_WORLD
    if world.Get_rank() % 2:
        set_nccl_provider(None)  # no CuPy here: these ranks cannot use NCCL
    with pytest.raises(NcclUnavailableError) as info:
        NcclComm.create(world, 0)
    if world.Get_rank() == 0:
        odd = list(range(1, world.Get_size(), 2))
        assert f"rank(s) {odd}" in str(info.value)
    else:
        assert "CuPy" in str(info.value)
