"""The small-message path: one node, one bucket of at most 4 KiB, no timeout.

The loss, the metrics, the end-of-data and preemption flags are each one
tiny allreduce per step, so their cost is the engine's fixed cost. This
path skips the plan machinery: it copies the tensor (or packs the tensors,
one compiled call) into this rank's slot, arrives at the node barrier with
the call's digest and waits (one compiled call, which also compares the
digests: the always-on agreement check), and folds all slots in rank order
into the result buffer (one compiled call on raw addresses, the kernels of
:func:`~hpcdist.kernels.reduce_slots`, so the bits are the ``shm`` path's).
A digest mismatch is reported as on the other paths.

Checked calls (a timeout in effect) take the ``shm`` path, which also
compares sequence numbers and sleeps while it waits. The ``shm`` algorithm
runs its unchecked one-bucket calls up to
:data:`~hpcdist.collectives.shm_backend.SMALL_BUCKET_BYTES` with this
algorithm's :meth:`SmallAllreduce.allreduce` too.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from hpcdist.collectives.fusion import addresses
from hpcdist.collectives.options import CommunicationImplementation as CI
from hpcdist.collectives.options import CommunicationOptions
from hpcdist.collectives.shm_backend import kernel_op
from hpcdist.collectives.where import Where
from hpcdist.kernels import pack_pieces
from hpcdist.kernels.cpu import fold_rows

if TYPE_CHECKING:
    from hpcdist.collectives.fusion import Layout
    from hpcdist.collectives.session import Session
    from hpcdist.collectives.shm import NodeWindow

#: Calls of at most this many bytes (all tensors together) take this path.
SMALL_BYTES = 4096


class SmallAllreduce:
    """Pack, barrier with digest, fold: three compiled calls and no generator."""

    name = "small"

    def __init__(self) -> None:
        # Per (layout digest, window): this rank's slot in each set, cut to the call's
        # length, and the fold's op code (looked up once, not per call).
        self._rows: dict[tuple[int, NodeWindow], tuple[tuple[np.ndarray, np.ndarray], int]] = {}

    def applies(self, where: Where) -> bool:
        """One node (backend SHM), no timeout, one dtype in one bucket, <= :data:`SMALL_BYTES`."""
        layout, window = where.layout, where.window
        return (
            not where.device
            and window is not None
            and layout is not None
            and where.options.timeout_seconds is None
            and layout.nbytes <= SMALL_BYTES
            and len(layout.groups) == 1
            and len(layout.groups[0].buckets) == 1
            and window.slot_bytes >= SMALL_BYTES
            and where.backend is CI.SHM
        )

    def allreduce(
        self,
        session: Session,
        items: Sequence[np.ndarray],
        layout: Layout,
        opts: CommunicationOptions,
    ) -> list[np.ndarray]:
        """The reduced buffer of the call's one group."""
        window = session.topology().window
        assert window is not None  # (applies: a window on this node)
        session.count_call(layout, opts, layout.text)
        group = layout.groups[0]
        wire, total = group.wire, group.total
        which = window.next_set()
        known = self._rows.get((layout.digest, window))
        if known is None:
            known = self._remember(window, layout)
        if len(group.members) == 1:  # one tensor: a plain copy into the slot
            a = items[group.members[0][0]]
            if a.ndim > 1 or a.dtype != wire:
                a = a.reshape(-1).view(wire)
            known[0][which][...] = a  # (a 0-d tensor broadcasts; 1/3 of np.copyto's cost)
        elif group.whole.tensor.size:
            whole = group.whole
            pack_pieces(
                window.slot_addresses[which][window.rank], addresses(items), whole.tensor,
                whole.src, whole.nbytes, whole.dst,
            )
        agreed, _ = window.sync(layout.digest, None)
        if not agreed:
            session.report_mismatch(window, layout.text)
        fused, address = session.buffers.take_with_address((layout.digest, 0), total, wire)
        fold_rows(
            window.slot_addresses[which][0], window.slot_bytes, window.size, total, address,
            known[1], session.size, wire.char,
        )
        return [fused]

    def _remember(
        self, window: NodeWindow, layout: Layout
    ) -> tuple[tuple[np.ndarray, np.ndarray], int]:
        group = layout.groups[0]
        wire, total = group.wire, group.total
        rows = (window.slots(0, wire)[window.rank][:total],
                window.slots(1, wire)[window.rank][:total])
        known = (rows, kernel_op(layout.op, wire, False))
        if len(self._rows) >= 256:
            self._rows.clear()
        self._rows[(layout.digest, window)] = known
        return known


ALGORITHM = SmallAllreduce()
