"""Under ``mpirun -n 2`` (``make gpu-contract``): the real ``cupy.cuda.nccl.get_unique_id()``
travels through hpcdist's id exchange (:func:`hpcdist.collectives.nccl.share_unique_id`,
the one ``NcclComm.create`` uses) as ``NcclCommunicator`` documents it: ``bytes`` of
128, equal on every rank, equal to what rank 0 drew. Runs without a GPU."""

from __future__ import annotations

import numpy as np
import pytest

from hpcdist.collectives.nccl import ranks_share_gpu, share_unique_id
from hpcdist.runtime import mpi

real = pytest.importorskip("cupy.cuda.nccl", reason="CuPy with NCCL is the gpu extra")

pytestmark = pytest.mark.mpi(min_size=2)


def test_the_real_unique_id_reaches_every_rank_as_bytes():
    world = mpi().COMM_WORLD
    drawn = real.get_unique_id() if world.Get_rank() == 0 else None
    uid = share_unique_id(world, drawn)
    assert type(uid) is bytes and len(uid) == 128
    everyone = np.zeros((world.Get_size(), 128), np.uint8)
    world.Allgather(np.frombuffer(uid, np.uint8).copy(), everyone)
    assert (everyone == everyone[0]).all()
    root_drawn = world.bcast(drawn, root=0)  # (pickled here only to check the buffer path)
    assert uid == root_drawn
    # what the real communicator takes: its argument checks accept it (no GPU: NCCL fails later)
    with pytest.raises(real.NcclError):
        real.NcclCommunicator(1, uid, 0)


def test_every_rank_learns_that_ranks_share_a_gpu():
    world = mpi().COMM_WORLD
    assert ranks_share_gpu(world, "GPU-3f2a") is True
    assert ranks_share_gpu(world, f"GPU-{world.Get_rank()}") is False
