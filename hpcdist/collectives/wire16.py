"""Reductions over MPI with 16-bit floats on the wire and float32 accumulation.

MPI has no bfloat16 (nor, portably, float16) reduction, and a float32
``MPI_Allreduce`` sends 4 bytes per element. :func:`reduce_plan` reduces a
1-D buffer across a communicator as a reduce-scatter and an all-gather over
point-to-point messages (``Isend``/``Irecv``, buffer mode, waited for as a
:data:`~hpcdist.collectives.mpi_backend.WAITALL` step):

1. the buffer is cut into one chunk per rank; every rank sends chunk ``j``
   to rank ``j`` as ``send_dtype`` (float32 values are rounded to it first:
   the *compressed* transport);
2. the owner of a chunk folds the ``size`` contributions in rank order in
   float32 (:func:`hpcdist.kernels.fold16.fold_rows16`; MEAN divides there)
   and rounds the result once to ``round_dtype``;
3. every owner sends its rounded chunk to every rank, which writes it into
   the result (widened, exactly, when the result is float32).

The three steps are pipelined over segments of each chunk (:data:`SEGMENT`
elements): while segment ``s + 1`` of the reduce-scatter is on the wire,
segment ``s`` is folded and its all-gather starts, and segment ``s - 1`` is
widened. The fold is element-wise, so the segments change no bit.

Every rank therefore holds bitwise the same result, and runs repeat it: the
fold order is the rank order whatever the MPI library. With a 16-bit
``send_dtype`` each rank sends ``2 (size - 1) / size`` bytes per element in
all, half of what a float32 reduce-scatter and all-gather send.

Example:
    >>> import numpy as np
    >>> from hpcdist.runtime import mpi
    >>> from hpcdist.collectives.mpi_backend import drive
    >>> from hpcdist.collectives.ops import ReduceOp
    >>> buf = np.float32([1.0, 2.0**-9 + 1.0])
    >>> plan = reduce_plan(mpi().COMM_SELF, buf, ReduceOp.SUM, BFLOAT16, BFLOAT16)
    >>> drive(mpi().COMM_SELF, plan, None, "demo")  # one rank: rounded, nothing sent
    array([1., 1.], dtype=float32)
"""

from __future__ import annotations

import threading
from typing import Any

import numpy as np

from hpcdist.arrays import BFLOAT16
from hpcdist.collectives.mpi_backend import WAITALL, Call, Plan
from hpcdist.collectives.ops import ReduceOp
from hpcdist.kernels.fold16 import MAX, MEAN, MIN, SUM, fold_rows16, is_half, narrow, widen

__all__ = [
    "BFLOAT16", "SEGMENT", "chunk_bounds", "compression_dtype", "reduce_plan", "segment_bounds",
]

#: Tags of the two phases' messages (the engine's communicator carries no other
#: point-to-point traffic of hpcdist's; the values spell "hd").
TAG_SCATTER = 0x6864
TAG_GATHER = 0x6865
_ALIGN = 32  # elements: chunks start on 64-byte boundaries of a 16-bit buffer
#: The pipeline's segment (elements of a chunk): 512 KiB of 16-bit values, about 4 ms
#: of a 1 Gbit/s link, far longer than casting and folding it.
SEGMENT = 256 * 1024
_CODES = {ReduceOp.SUM: SUM, ReduceOp.MEAN: MEAN, ReduceOp.MIN: MIN, ReduceOp.MAX: MAX}
_COMPRESSION = {"bf16": BFLOAT16, "fp16": np.dtype(np.float16)}


def compression_dtype(compression: str | None) -> np.dtype | None:
    """The wire dtype of a ``CommunicationOptions.compression`` value (``None``: none).

    Example: ``compression_dtype("bf16") == BFLOAT16``.
    """
    return None if compression is None else _COMPRESSION[compression]


def chunk_bounds(total: int, size: int) -> list[int]:
    """Element bounds of the ``size`` chunks of ``total`` elements (aligned, last shorter).

    Example: ``chunk_bounds(100, 2)`` is ``[0, 64, 100]``.
    """
    per = -(-total // size) if size else total
    per = -(-per // _ALIGN) * _ALIGN
    return [min(total, r * per) for r in range(size + 1)]


def _bytes(a: np.ndarray) -> np.ndarray:
    return a.view(np.uint8)


_scratch = threading.local()  # per thread: engines of other threads never share a buffer


def _buffer(slot: str, count: int, dtype: np.dtype) -> np.ndarray:
    """A scratch array of ``count`` elements, reused call after call (no page faults)."""
    nbytes = count * dtype.itemsize
    held = getattr(_scratch, slot, None)
    if held is None or held.nbytes < nbytes:
        held = np.empty(max(nbytes, 64), np.uint8)
        setattr(_scratch, slot, held)
    return held[:nbytes].view(dtype)


def segment_bounds(length: int, segment: int) -> list[tuple[int, int]]:
    """The pipeline segments of a chunk of ``length`` elements (``segment`` long, last shorter).

    Example: ``segment_bounds(5, 2)`` is ``[(0, 2), (2, 4), (4, 5)]``.
    """
    return [(a, min(a + segment, length)) for a in range(0, length, max(segment, 1))]


def reduce_plan(
    comm: Any,
    buf: np.ndarray,
    op: ReduceOp,
    send_dtype: np.dtype,
    round_dtype: np.dtype,
    divisor: int = 0,
    out: np.ndarray | None = None,
    segment: int = SEGMENT,
    scale: int = 0,
    bounds: list[int] | None = None,
) -> Plan:
    """The MPI calls that reduce ``buf`` (1-D contiguous: float32, float16 or bfloat16)
    across ``comm``, sending ``send_dtype`` and rounding once to ``round_dtype``.

    ``op`` MEAN divides by ``divisor`` in float32 before rounding (``divisor``
    0: MEAN is summed, the caller divides). The result goes to ``out`` (same
    length, ``buf``'s or ``round_dtype``; default ``buf`` itself) and is returned.
    ``segment`` is the pipeline's step in elements of a chunk (the bits do not
    depend on it). ``scale`` > 0 divides a float32 result by it after widening,
    segment by segment (the bits of dividing the whole result afterwards: a
    compressed MEAN). ``bounds`` (``size + 1`` element offsets): the chunks, and a
    *reduce-scatter*: no all-gather, ``out`` is this rank's chunk only (default: the
    aligned chunks of :func:`chunk_bounds`, and the whole result). Example: see the
    module docstring.
    """
    size, me = comm.Get_size(), comm.Get_rank()
    target = buf if out is None else out
    send_dtype, round_dtype = np.dtype(send_dtype), np.dtype(round_dtype)
    if not is_half(round_dtype):
        raise TypeError(f"reduce_plan: round_dtype is {round_dtype}; expected a 16-bit float")
    if segment <= 0:
        raise ValueError(f"reduce_plan: segment is {segment}; expected a positive element count")
    code = _CODES[op]
    if op is ReduceOp.MEAN and divisor <= 0:
        code = SUM
    total = buf.shape[0]
    cast = buf.dtype != send_dtype
    send = _buffer("send", total, send_dtype) if cast else buf
    scatter_only = bounds is not None
    if bounds is None:
        bounds = chunk_bounds(total, size)
    elif len(bounds) != size + 1 or bounds[0] != 0 or bounds[-1] != total:
        raise ValueError(f"reduce_plan: bounds {bounds} do not cut {total} elements in {size}")
    lo, hi = bounds[me], bounds[me + 1]
    longest = max(bounds[r + 1] - bounds[r] for r in range(size))
    recv = _buffer("recv", size * (hi - lo), send_dtype).reshape(size, hi - lo)
    if scatter_only:  # the result is this rank's chunk: ``target`` holds it alone
        target = target[lo:hi] if out is None else target
        if target.shape[0] != hi - lo:
            raise ValueError(f"reduce_plan: out has {target.shape[0]} elements; expected "
                             f"this rank's chunk of {hi - lo}")
        whole = target if target.dtype == round_dtype else _buffer("whole", hi - lo, round_dtype)
        mine = whole
    else:
        whole = target if target.dtype == round_dtype else _buffer("whole", total, round_dtype)
        mine = whole[lo:hi]
    widening = whole is not target
    divide = scale if scale > 0 and widening else 0  # (divided as widened: one pass)
    others = [(me + step) % size for step in range(1, size)]  # send to these ...
    sources = [(me - step) % size for step in range(1, size)]  # ... receive from these
    segments = segment_bounds(longest, -(-segment // _ALIGN) * _ALIGN)

    def part(rank: int, a: int, b: int) -> tuple[int, int]:  # segment [a, b) of rank's chunk
        return min(bounds[rank] + a, bounds[rank + 1]), min(bounds[rank] + b, bounds[rank + 1])

    def scatter(a: int, b: int) -> list[Any]:  # cast segment [a, b) of every chunk; send it
        for rank in range(size):
            x, y = part(rank, a, b)
            if y > x:
                if rank == me:  # this rank's own row of the fold
                    row = recv[me, x - lo : y - lo]
                    if cast:
                        narrow(buf[x:y], row)
                    else:
                        np.copyto(row, buf[x:y])
                elif cast:
                    narrow(buf[x:y], send[x:y])
        requests = []
        x, y = part(me, a, b)
        if y > x:
            requests += [comm.Irecv(_bytes(recv[src, x - lo : y - lo]), src, TAG_SCATTER)
                         for src in sources]  # fmt: skip
        for dst in others:
            x, y = part(dst, a, b)
            if y > x:
                requests.append(comm.Isend(_bytes(send[x:y]), dst, TAG_SCATTER))
        return requests

    def gather(a: int, b: int) -> list[Any]:  # fold segment [a, b) of this chunk; send it
        x, y = part(me, a, b)
        if y > x:
            fold_rows16(recv[:, x - lo : y - lo], mine[x - lo : y - lo], code, divisor)
        if scatter_only:
            if widening and y > x:
                widen(whole[x - lo : y - lo], target[x - lo : y - lo], divide)
            return []
        requests = []
        for src in sources:
            u, v = part(src, a, b)
            if v > u:
                requests.append(comm.Irecv(_bytes(whole[u:v]), src, TAG_GATHER))
        if y > x:
            requests += [comm.Isend(_bytes(whole[x:y]), dst, TAG_GATHER) for dst in others]
        return requests

    def widened(a: int, b: int) -> None:  # segment [a, b) of every chunk, into the target
        if scatter_only:
            return  # (widened as folded)
        for rank in range(size):
            x, y = part(rank, a, b)
            if y > x:
                widen(whole[x:y], target[x:y], divide)

    # The pipeline: segment s + 1's reduce-scatter is in flight while segment s is
    # folded and its all-gather starts; segment s - 1 is widened once it has arrived.
    pending = scatter(*segments[0]) if segments else []
    gathering: list[Any] = []
    for s, (a, b) in enumerate(segments):
        current = pending
        pending = scatter(*segments[s + 1]) if s + 1 < len(segments) else []
        if current:  # received, and sent: the all-gather may write where the sends read
            yield Call(WAITALL, (current,), label="the compressed reduce-scatter")
        previous = gathering
        gathering = gather(a, b)
        if previous:
            yield Call(WAITALL, (previous,), label="the compressed all-gather")
        if widening and s > 0:
            widened(*segments[s - 1])
    if gathering:
        yield Call(WAITALL, (gathering,), label="the compressed all-gather")
    if widening and segments:
        widened(*segments[-1])
    return target
