"""hpcdist.runtime.messages over real MPI: send/recv, and the receiver's checks of each message.

Run under ``mpirun -n 2`` and ``-n 4``: rank 0 sends to every other rank on a Dup of
COMM_WORLD, the others receive and check.
"""

from __future__ import annotations

import numpy as np
import pytest

from hpcdist.errors import MessageSizeError, MessageTruncatedError, UnknownMessageTypeError
from hpcdist.runtime import messages as M
from hpcdist.runtime import mpi

pytestmark = [pytest.mark.mpi(min_size=2), pytest.mark.timeout(60)]

MPI = mpi()
TAG = 300


@pytest.fixture
def comm():
    c = MPI.COMM_WORLD.Dup()
    yield c
    c.Barrier()
    c.Free()


def test_typed_message_round_trip_to_every_rank(comm):
    rank, size = comm.Get_rank(), comm.Get_size()
    value = {"w": np.arange(6, dtype=np.float32).reshape(2, 3), "name": "x", "n": [1, None]}
    if rank == 0:
        for dest in range(1, size):
            M.send(
                comm, dest, TAG, M.new_header(5, request=dest, args=(dest,)), M.encode_value(value)
            )
        return
    head, data = M.recv(comm, 0, TAG, types={5})
    assert (head.type, head.request, head.args[0], head.length) == (5, rank, rank, data.nbytes)
    out = M.decode_value(data)
    assert out["name"] == "x" and out["n"] == [1, None]
    np.testing.assert_array_equal(out["w"], value["w"])


def test_message_without_payload(comm):
    if comm.Get_rank() == 0:
        for dest in range(1, comm.Get_size()):
            M.send(comm, dest, TAG, M.new_header(2))
        return
    head, data = M.recv(comm, 0, TAG, types={2})
    assert head.length == 0 and data.nbytes == 0


def test_receiver_refuses_oversized_unknown_and_truncated_messages(comm):
    rank, size = comm.Get_rank(), comm.Get_size()
    big = np.zeros(64, np.uint8)
    if rank == 0:
        for dest in range(1, size):
            # 1. over the receiver's limit: refused from the header, the payload never allocated
            M.send(comm, dest, TAG, M.new_header(1), big)
            # 2. a type the receiver does not know
            M.send(comm, dest, TAG, M.new_header(7))
            # 3. a header announcing more than the payload carries
            h = M.new_header(1, length=100)
            comm.Send([h, MPI.INT64_T], dest, TAG)
            comm.Send([big, MPI.BYTE], dest, TAG + 1)
        return
    with pytest.raises(MessageSizeError, match="announces 64 payload bytes; the limit is 32"):
        M.recv(comm, 0, TAG, types={1}, limit=32)
    comm.Recv([np.empty(64, np.uint8), MPI.BYTE], 0, TAG + 1)  # drop the refused payload
    with pytest.raises(UnknownMessageTypeError, match="type 7"):
        M.recv(comm, 0, TAG, types={1})
    with pytest.raises(MessageTruncatedError, match="announced 100 payload bytes but carried 64"):
        M.recv(comm, 0, TAG, types={1})
