"""The MPI plans of the operations that need no fusion: allgather, broadcast.

Each is a generator of :class:`~hpcdist.collectives.mpi_backend.Call` run by
:meth:`hpcdist.collectives.session.Session.run_agreed` (``check``: the
agreement to run first over MPI, or falsy when a node barrier did it).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import numpy as np

from hpcdist.collectives.metadata import describe_arrays, signature_hash
from hpcdist.collectives.mpi_backend import Call, Plan
from hpcdist.collectives.options import CommunicationOptions
from hpcdist.collectives.session import SimpleLayout, mode

if TYPE_CHECKING:
    from hpcdist.collectives.session import Session

ALIGN = 16  # byte alignment of each tensor in a broadcast buffer


def aligned_bytes(nbytes: int) -> np.ndarray:
    """A new uint8 buffer of ``nbytes`` whose start is 8-byte aligned."""
    return np.empty(max(1, -(-nbytes // 8)), np.float64).view(np.uint8)[:nbytes]


def allgather_plan(session: Session, moved: np.ndarray, check: Any) -> Plan:
    """Gather ``moved`` (the gathered axis first) from every rank, in rank order."""
    MPI = session.mpi
    if check:
        yield from session.agreement(check)
    rows = np.zeros(session.size, dtype=np.int64)
    yield Call("Allgather", (np.array([moved.shape[0]], np.int64), rows))
    rest = moved.shape[1:]
    row_bytes = math.prod(rest) * moved.dtype.itemsize
    out = np.empty((int(rows.sum()), *rest), dtype=moved.dtype)
    counts = [int(r) * row_bytes for r in rows]
    if sum(counts):
        displs = [0, *np.cumsum(counts)[:-1].tolist()]
        send = moved.reshape(-1).view(np.uint8)
        recv = out.reshape(-1).view(np.uint8)
        yield Call("Allgatherv", ([send, MPI.BYTE], [recv, (counts, displs), MPI.BYTE]))
    return out


def allgather_list_plan(
    session: Session, moved: list[np.ndarray], layout: SimpleLayout, check: Any
) -> Plan:
    """Gather every tensor of ``moved`` in one ``Allgather`` of row counts and one
    ``Allgatherv`` of all bytes; the results are views of one pooled buffer."""
    MPI, size, rank, pool = session.mpi, session.size, session.rank, session.buffers
    if check:
        yield from session.agreement(check)
    count = len(moved)
    rows = np.zeros((size, count), dtype=np.int64)
    yield Call("Allgather", (np.array([m.shape[0] for m in moved], np.int64), rows))
    row_bytes = [math.prod(m.shape[1:]) * m.dtype.itemsize for m in moved]
    sizes = rows * np.array(row_bytes, np.int64)  # bytes of [rank, tensor]
    counts = sizes.sum(axis=1).tolist()
    total = int(sum(counts))
    # Results, tensor after tensor, in one pooled buffer (8-byte aligned starts).
    starts, end = [], 0
    for t in range(count):
        starts.append(end)
        end += -(-int(sizes[:, t].sum()) // 8) * 8
    key = ("allgather_list", layout.digest, end, rows.tobytes())
    result = pool.take(key, max(end, 1), np.dtype(np.uint8))
    if total:
        send = pool.take((*key, "send"), max(counts[rank], 1), np.dtype(np.uint8))
        lo = 0
        for m in moved:
            send[lo : lo + m.nbytes] = m.reshape(-1).view(np.uint8)
            lo += m.nbytes
        recv = pool.take((*key, "recv"), max(total, 1), np.dtype(np.uint8))
        displs = [0, *np.cumsum(counts)[:-1].tolist()]
        mine = [send[: counts[rank]], MPI.BYTE]
        yield Call("Allgatherv", (mine, [recv[:total], (counts, displs), MPI.BYTE]))
        for r in range(size):  # rank r's block holds its tensors one after another
            src = displs[r]
            for t in range(count):
                n = int(sizes[r, t])
                dst = starts[t] + int(sizes[:r, t].sum())
                result[dst : dst + n] = recv[src : src + n]
                src += n
    out = []
    for t, m in enumerate(moved):
        n = int(sizes[:, t].sum())
        piece = result[starts[t] : starts[t] + n].view(m.dtype)
        out.append(piece.reshape((int(rows[:, t].sum()), *m.shape[1:])))
    return out


def broadcast_layout(
    items: list[np.ndarray], root: int, opts: CommunicationOptions
) -> SimpleLayout:
    """The signature of a broadcast of ``items`` and the offset of each in one buffer."""
    offsets = []
    total = 0
    for a in items:
        offsets.append(total)
        total += -(-a.nbytes // ALIGN) * ALIGN
    text = (
        f"broadcast(root={root}, {describe_arrays(items)}, {mode(opts)}, "
        f"mpi_message_bytes={opts.mpi_message_bytes})"
    )
    return SimpleLayout(text, signature_hash(text), offsets=tuple(offsets), total=total)


def broadcast_plan(
    session: Session,
    items: list[np.ndarray],
    root: int,
    layout: SimpleLayout,
    opts: CommunicationOptions,
    check: Any,
) -> Plan:
    """Rank ``root``'s ``items`` to every rank: one buffer, ``Bcast`` in message-sized steps."""
    if check:
        yield from session.agreement(check)
    buf = aligned_bytes(layout.total)
    views = [
        buf[o : o + a.nbytes].view(a.dtype).reshape(a.shape)
        for a, o in zip(items, layout.offsets, strict=True)
    ]
    if session.rank == root:
        for view, a in zip(views, items, strict=True):
            np.copyto(view, a)
    step = opts.mpi_message_bytes or max(layout.total, 1)
    for lo in range(0, layout.total, step):
        hi = min(lo + step, layout.total)
        yield Call("Bcast", (buf[lo:hi], root))
    return views
