"""Buffer-mode MPI allreduce of each fused group (the host algorithm that always applies).

A group of one tensor is reduced straight from the caller's array into the
result buffer (``Allreduce(src, out)``) when the reduction is exact on MPI
(integers; floating SUM and MEAN on two ranks); every other group is packed
into the result buffer first and reduced in place
(:func:`hpcdist.collectives.mpi_reduce.reduce_calls`: ``Reduce`` + ``Bcast``
where MPI's floating results could differ between ranks). Messages are at most
``CommunicationOptions.mpi_message_bytes`` long (0: one message per group).
Result buffers come from the session's pool.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from hpcdist.collectives.mpi_backend import Call, Plan
from hpcdist.collectives.mpi_reduce import message_ranges, reduce_calls, summed_compressed
from hpcdist.collectives.ops import ReduceOp
from hpcdist.collectives.options import CommunicationOptions
from hpcdist.collectives.where import Where
from hpcdist.collectives.wire16 import compression_dtype, reduce_plan
from hpcdist.runtime import mpi

if TYPE_CHECKING:
    from hpcdist.collectives.fusion import Group, Layout
    from hpcdist.collectives.session import Session


def exact_in_place(group: Group, op: ReduceOp, size: int) -> bool:
    """Whether one ``Allreduce`` gives every rank the same bits for ``group``
    (integers; floating SUM and MEAN on two ranks, where ``a + b`` is ``b + a``)."""
    wire = group.wire
    if wire.kind in "iub":
        return True
    return size == 2 and op in (ReduceOp.SUM, ReduceOp.MEAN) and wire.kind == "f" and (
        wire.itemsize > 2
    )


def source_view(group: Group, items: Sequence[np.ndarray]) -> np.ndarray | None:
    """The group's only tensor as a flat wire-dtype view (``None`` for several tensors)."""
    if len(group.members) != 1:
        return None
    a = items[group.members[0][0]]
    return a.reshape(-1).view(group.wire)


def mpi_plan(
    session: Session,
    items: Sequence[np.ndarray],
    layout: Layout,
    opts: CommunicationOptions,
    check: Any,
) -> Plan:
    """The MPI calls of the allreduce (after the agreement check ``check``, if any)."""
    MPI = mpi()
    if check:
        yield from session.agreement(check)
    size, op = session.size, layout.op
    chunk = opts.mpi_message_bytes
    out = []
    for index, group in enumerate(layout.groups):
        buf = session.buffers.take(("mpi", layout.digest, index), group.total, group.wire)
        exact = exact_in_place(group, op, size) and not (
            opts.compression is not None and group.wire == np.float32
        )  # compressed groups take the 16-bit path of reduce_calls
        src = source_view(group, items) if exact else None
        if src is not None and group.total:
            mpi_op = MPI.MIN if op is ReduceOp.MIN else MPI.MAX if op is ReduceOp.MAX else MPI.SUM
            for lo, hi in message_ranges(group.total, group.wire.itemsize, chunk):
                yield Call("Allreduce", (src[lo:hi], buf[lo:hi], mpi_op))
        else:
            half = group.wire.itemsize == 2 and group.wire.kind in "fV"
            # a compressed group of one tensor is read from it (no copy into the buffer
            # first), and its MEAN divided as the result is widened
            compressed = summed_compressed(op, compression_dtype(opts.compression), group.wire)
            source = source_view(group, items) if compressed else None
            if source is None:
                session.pack_group(group, items, buf)
            scale = size if op is ReduceOp.MEAN and group.wire == np.float32 else 0
            yield from reduce_calls(
                session.comm, buf, op, chunk, opts.compression, size if half else 0,
                source, scale,
            )
            if half or scale:  # MEAN divided there (16-bit: in float32 before the one rounding)
                out.append(buf)
                continue
        if op is ReduceOp.MEAN and group.wire.kind == "f":
            np.divide(buf, np.asarray(size, dtype=group.wire), out=buf)
        out.append(buf)
    return out


class SlicedScatter:
    """A ``reduce_scatter`` that slices this rank's block out of the algorithm's allreduce
    (the bits are the allreduce's): for algorithms without a scatter of their own."""

    def reduce_scatter(
        self,
        session: Session,
        items: Sequence[np.ndarray],
        layout: Layout,
        opts: CommunicationOptions,
        bounds: Sequence[int],
    ) -> np.ndarray:
        """This rank's block of the allreduce of the one-tensor ``layout``."""
        full = self.allreduce(session, items, layout, opts)[0]  # type: ignore[attr-defined]
        block: np.ndarray = full[bounds[session.rank] : bounds[session.rank + 1]].copy()
        return block


def scatter_plan(
    session: Session,
    items: Sequence[np.ndarray],
    layout: Layout,
    opts: CommunicationOptions,
    bounds: Sequence[int],
    check: Any,
) -> Plan:
    """A compressed reduce-scatter of the one float32 tensor of ``layout``: only the
    reduce-scatter half of the compressed exchange (half its bytes), this rank's block."""
    if check:
        yield from session.agreement(check)
    group = layout.groups[0]
    wire, values = compression_dtype(opts.compression), source_view(group, items)
    assert wire is not None and values is not None  # (compressed one-tensor calls only)
    block = np.empty(bounds[session.rank + 1] - bounds[session.rank], group.wire)
    scale = session.size if layout.op is ReduceOp.MEAN else 0
    return (yield from reduce_plan(session.comm, values, layout.op, wire, wire, out=block,
                                   scale=scale, bounds=list(bounds)))


class MpiAllreduce(SlicedScatter):
    """Buffer-mode MPI on the communicator; applies to every host call."""

    name = "mpi"

    def applies(self, where: Where) -> bool:
        """Every host call: the fallback at the end of the registry."""
        return not where.device

    def reduce_scatter(
        self,
        session: Session,
        items: Sequence[np.ndarray],
        layout: Layout,
        opts: CommunicationOptions,
        bounds: Sequence[int],
    ) -> np.ndarray:
        """Compressed float32 SUM and MEAN: the compressed exchange's reduce-scatter half
        (16-bit values on the wire, float32 sums); other calls slice the allreduce."""
        group = layout.groups[0]
        wire = compression_dtype(opts.compression)
        if session.size == 1 or not summed_compressed(layout.op, wire, group.wire) or (
            len(group.members) != 1
        ):
            return super().reduce_scatter(session, items, layout, opts, bounds)
        what = session.describe(layout)
        block: np.ndarray = session.run_agreed(
            layout, opts, what,
            lambda check: scatter_plan(session, items, layout, opts, bounds, check),
        )
        return block

    def allreduce(
        self,
        session: Session,
        items: Sequence[np.ndarray],
        layout: Layout,
        opts: CommunicationOptions,
    ) -> list[np.ndarray]:
        """Agree on the call (a node barrier or a tiny MPI check), then reduce over MPI."""
        what = session.describe(layout)
        return session.run_agreed(
            layout, opts, what, lambda check: mpi_plan(session, items, layout, opts, check)
        )


ALGORITHM = MpiAllreduce()
