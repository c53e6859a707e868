"""In-place MPI reductions of one fused buffer that give every rank the same bits.

:func:`reduce_calls` yields the buffer-mode MPI calls (for
:func:`hpcdist.collectives.mpi_backend.drive`) that reduce a NumPy buffer in
place across a communicator, in messages of at most ``bytes_per_pack``:

* integers, and floating SUM/MEAN on two ranks: ``Allreduce`` (exact, or
  commutative: ``a + b`` is ``b + a`` bit for bit);
* other floating reductions: ``Reduce`` to rank 0 and ``Bcast`` of its bits
  (MPI does not promise equal floating results on every rank otherwise);
* ``float16`` and ``bfloat16``: MPI has no reduction of them; SUM and MEAN
  run :func:`hpcdist.collectives.wire16.reduce_plan` (16 bits on the wire,
  summed in ``float32`` in rank order, rounded once; MEAN divided by
  ``divisor`` before the rounding), MIN and MAX reduce a ``float32`` copy
  (exact) and narrow it back;
* ``compression`` (``"bf16"``, ``"fp16"``): float32 SUM and MEAN take the
  same 16-bit path, the values rounded for transport.

MEAN is otherwise not divided here; the caller divides the sum.

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
from hpcdist.collectives.wire16 import compression_dtype, reduce_plan
from hpcdist.kernels.fold16 import is_half
from hpcdist.runtime import mpi


def message_ranges(total: int, itemsize: int, message_bytes: int) -> list[tuple[int, int]]:
    """Element ranges of ``total`` elements cut into messages of at most ``message_bytes``.

    ``message_bytes`` 0 (or less): one message. Example: ``message_ranges(10, 4, 16)``
    is ``[(0, 4), (4, 8), (8, 10)]``.
    """
    bytes_per_pack = message_bytes
    step = total if bytes_per_pack <= 0 else max(1, bytes_per_pack // itemsize)
    return [(lo, min(lo + step, total)) for lo in range(0, total, max(step, 1))]


def reduce_calls(
    comm: Any,
    buf: np.ndarray,
    op: ReduceOp,
    bytes_per_pack: int,
    compression: str | None = None,
    divisor: int = 0,
    source: np.ndarray | None = None,
    scale: int = 0,
) -> Plan:
    """The MPI calls that reduce ``buf`` (1-D, contiguous) in place with ``op``.

    MEAN is summed, except for 16-bit floats with a ``divisor`` (divided before
    the one rounding). ``scale`` > 0 divides the float32 result by it (on the
    compressed path segment by segment as it is widened: the same bits).
    ``source`` (``buf``'s length and dtype): the values to reduce, read from
    there by the compressed path (``buf`` only receives the result; other
    paths copy them into ``buf`` first).
    """
    size = comm.Get_size()
    wire = compression_dtype(compression)
    if wire is not None and summed_compressed(op, wire, buf.dtype) and size > 1 and buf.size:
        values, out = (buf, None) if source is None else (source, buf)
        yield from reduce_plan(comm, values, op, wire, wire, out=out, scale=scale)
        return buf
    if source is not None:
        buf[...] = source
    yield from _reduce_in_place(comm, buf, op, bytes_per_pack, divisor, size)
    if scale > 0:
        np.divide(buf, np.asarray(scale, dtype=buf.dtype), out=buf)
    return buf


def summed_compressed(op: ReduceOp, wire: np.dtype | None, dtype: np.dtype) -> bool:
    """Whether ``dtype`` values are reduced as 16-bit ``wire`` values (float32 SUM, MEAN)."""
    return wire is not None and dtype == np.float32 and op in (ReduceOp.SUM, ReduceOp.MEAN)


def _reduce_in_place(
    comm: Any, buf: np.ndarray, op: ReduceOp, bytes_per_pack: int, divisor: int, size: int
) -> Plan:
    MPI = mpi()
    mpi_op = MPI.MIN if op is ReduceOp.MIN else MPI.MAX if op is ReduceOp.MAX else MPI.SUM
    if size == 1 or buf.size == 0:
        if op is ReduceOp.MEAN and divisor > 1 and is_half(buf.dtype):
            yield from reduce_plan(comm, buf, op, buf.dtype, buf.dtype, divisor)
        return
    summed = op in (ReduceOp.SUM, ReduceOp.MEAN)
    if summed and is_half(buf.dtype):
        yield from reduce_plan(comm, buf, op, buf.dtype, buf.dtype, divisor)
        return
    work = buf.astype(np.float32) if is_half(buf.dtype) else buf
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
