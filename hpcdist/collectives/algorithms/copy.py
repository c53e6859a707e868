"""A world of one rank: the results are copies (host or device arrays, any op).

Nothing to reduce with: each group is packed into a new buffer (host), or
its source copied into its result buffer on the caller's stream (device; a
group of several tensors was packed there already). NCCL asked for on one
rank still runs ``nccl``, which says why when NCCL is missing.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from hpcdist.collectives.options import CommunicationImplementation as CI
from hpcdist.collectives.options import CommunicationOptions
from hpcdist.collectives.where import Where

if TYPE_CHECKING:
    from hpcdist.collectives.fusion import Layout
    from hpcdist.collectives.session import Session


class Copy:
    """Copies: one rank."""

    name = "copy"

    def applies(self, where: Where) -> bool:
        """One rank (device calls: unless NCCL is asked for)."""
        return where.size == 1 and not (where.device and where.implementation is CI.NCCL)

    def allreduce(
        self, session: Session, items: Sequence[Any], layout: Layout, opts: CommunicationOptions
    ) -> list[Any]:
        """Each group packed (host) or copied (device) into its own buffer."""
        if not items or items[0].__class__ is np.ndarray:
            return [session.pack_group(group, items) for group in layout.groups]
        call = session.device_path().prepare(items, layout)
        for src, flat in zip(call.srcs, call.flats, strict=True):
            if src is not flat:
                call.rt.copy(flat, src, call.stream)
        return call.flats

    def reduce_scatter(
        self,
        session: Session,
        items: Sequence[np.ndarray],
        layout: Layout,
        opts: CommunicationOptions,
        bounds: Sequence[int],
    ) -> np.ndarray:
        """The whole tensor (this rank's block is all of it)."""
        return session.pack_group(layout.groups[0], items)


ALGORITHM = Copy()
