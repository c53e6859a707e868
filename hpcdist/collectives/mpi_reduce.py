"""In-place MPI reductions of one fused buffer that give every rank the same bits.

:func:`reduce_calls` yields the buffer-mode MPI calls (for
:func:`hpcdist.collectives.mpi_backend.drive`) that reduce a NumPy buffer in
place across a communicator, in messages of at most ``bytes_per_pack``:

* integers, and floating SUM/MEAN on two ranks: ``Allreduce`` (exact, or
  commutative: ``a + b`` is ``b + a`` bit for bit);
* other floating reductions: ``Reduce`` to rank 0 and ``Bcast`` of its bits
  (MPI does not promise equal floating results on every rank otherwise);
* ``float16``: MPI has no half type, so the buffer is reduced in ``float32``
  and rounded once.

MEAN is not divided here; the caller divides the sum.

Example:
    >>> import numpy as np
    >>> from hpcdist.runtime import mpi
    >>> from hpcdist.collectives.mpi_backend import drive
    >>> from hpcdist.collectives.ops import ReduceOp
    >>> buf = np.ones(3, np.float32)
    >>> _ = drive(mpi().COMM_SELF, reduce_calls(mpi().COMM_SELF, buf, ReduceOp.SUM, 0), None, "x")
    >>> buf
    array([1., 1., 1.], dtype=float32)
"""

from __future__ import annotations

from typing import Any

import numpy as np

from hpcdist.collectives.mpi_backend import Call, Plan
from hpcdist.collectives.ops import ReduceOp
from hpcdist.runtime import mpi


def message_ranges(total: int, itemsize: int, message_bytes: int) -> list[tuple[int, int]]:
    """Element ranges of ``total`` elements cut into messages of at most ``message_bytes``.

    ``message_bytes`` 0 (or less): one message. Example: ``message_ranges(10, 4, 16)``
    is ``[(0, 4), (4, 8), (8, 10)]``.
    """
    bytes_per_pack = message_bytes
    step = total if bytes_per_pack <= 0 else max(1, bytes_per_pack // itemsize)
    return [(lo, min(lo + step, total)) for lo in range(0, total, max(step, 1))]


def reduce_calls(comm: Any, buf: np.ndarray, op: ReduceOp, bytes_per_pack: int) -> Plan:
    """The MPI calls that reduce ``buf`` (1-D, contiguous) in place with ``op`` (MEAN as SUM)."""
    MPI = mpi()
    mpi_op = MPI.MIN if op is ReduceOp.MIN else MPI.MAX if op is ReduceOp.MAX else MPI.SUM
    size = comm.Get_size()
    if size == 1 or buf.size == 0:
        return buf
    work = buf.astype(np.float32) if buf.dtype == np.float16 else buf
    exact = work.dtype.kind in "iub" or (size == 2 and op in (ReduceOp.SUM, ReduceOp.MEAN))
    for lo, hi in message_ranges(work.size, work.dtype.itemsize, bytes_per_pack):
        part = work[lo:hi]
        if exact:
            yield Call("Allreduce", (MPI.IN_PLACE, part, mpi_op))
            continue
        if comm.Get_rank() == 0:
            yield Call("Reduce", (MPI.IN_PLACE, part, mpi_op, 0))
        else:
            yield Call("Reduce", (part, None, mpi_op, 0))
        yield Call("Bcast", (part, 0))
    if work is not buf:
        buf[...] = work  # rounded once, identically on every rank (same float32 bits)
    return buf
