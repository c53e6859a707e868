"""Two ranks on one GPU, run as ``mpirun -n 2 python -m pytest --with-mpi -m mpi tests/gpu``
with ``CUDA_VISIBLE_DEVICES=0`` (``tools/gpu-run.sh``; one process deselects these tests).

NCCL refuses a communicator with the same GPU twice, so AUTO must learn that the ranks share
their GPU and stage through host memory; an explicit NCCL request fails with a typed error on
every rank. Several tensors per call go through hpcdist's pack kernel (its bucket table
cached per layout), so this also runs the Numba kernels on the device.
"""

from __future__ import annotations

import numpy as np
import pytest

from hpcdist.collectives import Collectives, CommunicationOptions
from hpcdist.collectives.nccl import NcclUnavailableError
from hpcdist.runtime import mpi

pytestmark = [pytest.mark.mpi(min_size=2), pytest.mark.numba_cuda]


@pytest.fixture
def world():
    comm = mpi().COMM_WORLD.Dup()
    yield comm
    comm.Free()


def _inputs(cp, rank):
    return [cp.full((64, 3), rank + 1, cp.float32), cp.arange(10, dtype=cp.int64) * (rank + 1),
            cp.full(5, rank + 1, cp.float16), cp.ones(7, cp.float32) * rank]


def test_auto_stages_when_ranks_share_a_gpu(cp, world, monkeypatch):
    monkeypatch.setenv("HPCDIST_CUDA_AWARE_MPI", "0")
    monkeypatch.delenv("HPCDIST_COLLECTIVES", raising=False)
    size, rank = world.Get_size(), world.Get_rank()
    engine = Collectives(world)
    weights = sum(range(1, size + 1))
    for _ in range(3):  # the same layout again: the cached table
        out = engine.allreduce(_inputs(cp, rank), "SUM")
        assert engine.last_device_route == "staged"
    cp.cuda.get_current_stream().synchronize()
    np.testing.assert_array_equal(out[0].get(), np.full((64, 3), weights, np.float32))
    np.testing.assert_array_equal(out[1].get(), np.arange(10) * weights)
    np.testing.assert_array_equal(out[2].get(), np.full(5, weights, np.float16))
    np.testing.assert_array_equal(out[3].get(), np.full(7, sum(range(size)), np.float32))
    mean = engine.allreduce(_inputs(cp, rank), "MEAN")
    np.testing.assert_allclose(mean[0].get(), weights / size)
    assert mean[1].dtype == np.float64 and type(mean[1]) is cp.ndarray
    (b,) = engine.broadcast([cp.full(4, rank, cp.int32)], root=size - 1)
    assert engine.last_device_route == "staged"
    np.testing.assert_array_equal(b.get(), [size - 1] * 4)
    gathered = engine.allgather(cp.full((2, 3), rank, cp.float32))
    np.testing.assert_array_equal(gathered.get()[::2, 0], np.arange(size))
    engine.close()


def test_explicit_nccl_fails_on_every_rank_with_the_reason(cp, world, nccl_ok, monkeypatch):
    monkeypatch.delenv("HPCDIST_COLLECTIVES", raising=False)
    engine = Collectives(world, CommunicationOptions(implementation="NCCL"))
    with pytest.raises(NcclUnavailableError, match="run on one GPU"):
        engine.allreduce([cp.ones(8, cp.float32)], "SUM")
    engine.close()


def test_multi_worker_strategy_trains_its_reduction_on_the_staged_route(cp, monkeypatch):
    import hpcdist as hd

    monkeypatch.setenv("HPCDIST_ALLOW_SHARED_GPUS", "1")
    monkeypatch.setenv("HPCDIST_CUDA_AWARE_MPI", "0")
    strategy = hd.MultiWorkerMirroredStrategy()
    size = strategy.num_replicas_in_sync

    def step():
        ctx = hd.get_replica_context()
        r = ctx.replica_id_in_sync_group
        return ctx.all_reduce(hd.ReduceOp.SUM, [cp.full(1000, r + 1, cp.float32),
                                                cp.arange(4, dtype=cp.int32)])

    summed = strategy.run(step)
    assert strategy.extended._collectives.last_device_route == "staged"
    np.testing.assert_array_equal(summed[0].get(), np.full(1000, size * (size + 1) / 2))
    np.testing.assert_array_equal(summed[1].get(), np.arange(4) * size)
