"""AUTO's MPI band: on one node of two ranks, sizes where the MPI library wins.

Where a message fits in about the L3 cache, two ranks' ``MPI_Allreduce`` can
beat the shared window's reduce-scatter, which streams every byte through
memory twice; below and above that band the window is as fast or faster.
:data:`hpcdist.collectives.choice.MPI_BAND` holds the band, derived from
``hpcdist bench strategy`` results (the figures: ``docs/performance.md``);
``HPCDIST_MPI_BAND=lo:hi`` (bytes; ``0:0`` turns it off) replaces it.

Only calls whose reduction MPI does exactly (integers, floating SUM and MEAN
on two ranks: ``a + b`` is ``b + a`` bit for bit) and whose one group is one
tensor run here, straight from the caller's array into the result buffer:
every rank gets the same bits, and the same bits as ``shm``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from hpcdist.collectives import choice
from hpcdist.collectives.algorithms.mpi import ALGORITHM as MPI_ALGORITHM
from hpcdist.collectives.algorithms.mpi import SlicedScatter, exact_in_place, source_view
from hpcdist.collectives.ops import ReduceOp
from hpcdist.collectives.options import CommunicationImplementation as CI
from hpcdist.collectives.options import CommunicationOptions
from hpcdist.collectives.where import Where
from hpcdist.runtime import mpi

if TYPE_CHECKING:
    from hpcdist.collectives.fusion import Layout
    from hpcdist.collectives.session import Session


class MpiBand(SlicedScatter):
    """MPI, under AUTO, for one exact tensor in the measured size band on one 2-rank node."""

    name = "mpi-direct"

    def applies(self, where: Where) -> bool:
        """AUTO, one node of two ranks, one exact group of one tensor, size in the band."""
        if where.device or not where.auto or where.size != 2 or where.backend is not CI.SHM:
            return False
        layout = where.layout
        lo, hi = choice.mpi_band()
        if layout is None or not lo <= layout.nbytes < hi or len(layout.groups) != 1:
            return False
        group = layout.groups[0]
        return len(group.members) == 1 and exact_in_place(group, layout.op, where.size)

    def allreduce(
        self,
        session: Session,
        items: Sequence[np.ndarray],
        layout: Layout,
        opts: CommunicationOptions,
    ) -> list[np.ndarray]:
        """Node barrier comparing digests, then ``Allreduce(src, out)``.

        Unchecked calls do it in two direct calls; checked ones (a timeout) run
        the ``mpi`` algorithm's plan, with sequence numbers and deadlines.
        """
        if opts.timeout_seconds is not None or opts.mpi_message_bytes:
            return MPI_ALGORITHM.allreduce(session, items, layout, opts)
        _agree_on_node(session, layout, opts)
        group = layout.groups[0]
        out = session.buffers.take(("mpi", layout.digest, 0), group.total, group.wire)
        session.comm.Allreduce(source_view(group, items), out, mpi().SUM)
        if layout.op is ReduceOp.MEAN and group.wire.kind == "f":
            np.divide(out, np.asarray(session.size, dtype=group.wire), out=out)
        return [out]

    def reduce_scatter(
        self,
        session: Session,
        items: Sequence[np.ndarray],
        layout: Layout,
        opts: CommunicationOptions,
        bounds: Sequence[int],
    ) -> np.ndarray:
        """Node barrier comparing digests, then ``Reduce_scatter``: half the bytes of the
        allreduce, and its bits (two ranks: ``a + b`` is ``b + a``). Checked calls
        slice the checked allreduce, as the other MPI algorithms do."""
        if opts.timeout_seconds is not None or opts.mpi_message_bytes:
            return SlicedScatter.reduce_scatter(self, session, items, layout, opts, bounds)
        _agree_on_node(session, layout, opts)
        group = layout.groups[0]
        counts = [bounds[r + 1] - bounds[r] for r in range(session.size)]
        block = np.empty(counts[session.rank], group.wire)
        session.comm.Reduce_scatter(source_view(group, items), block, counts, mpi().SUM)
        if layout.op is ReduceOp.MEAN and group.wire.kind == "f":
            np.divide(block, np.asarray(session.size, dtype=group.wire), out=block)
        return block


def _agree_on_node(session: Session, layout: Layout, opts: CommunicationOptions) -> None:
    """Count the call, then a node barrier comparing digests (every rank raises on a
    mismatch): what an unchecked call agrees on before its direct MPI call."""
    window = session.topology().window
    assert window is not None  # (applies: backend SHM, a window on this node)
    session.count_call(layout, opts, layout.text)
    agreed, _ = window.sync(layout.digest, None)
    if not agreed:
        session.report_mismatch(window, layout.text)


ALGORITHM = MpiBand()
