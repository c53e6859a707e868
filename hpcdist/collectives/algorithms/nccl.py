"""NCCL allreduce of device arrays over all ranks of the communicator.

For device calls asking for NCCL, or AUTO (or HIERARCHICAL on one node)
when NCCL is usable, and NCCL has every group's wire dtype (not int16/uint16:
those calls are staged). The ranks first agree on the call
(:meth:`~hpcdist.collectives.device_path.DevicePath.agree`), then each group
is one ``ncclAllReduce`` on the caller's stream, with no host
synchronisation. NCCL's ring gives every rank the same bits.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from hpcdist.collectives.device_path import wire_op
from hpcdist.collectives.nccl import NCCL_DTYPE_NAMES
from hpcdist.collectives.options import CommunicationImplementation as CI
from hpcdist.collectives.options import CommunicationOptions
from hpcdist.collectives.where import Where

if TYPE_CHECKING:
    from hpcdist.collectives.fusion import Layout
    from hpcdist.collectives.session import Session


def nccl_dtypes(where: Where) -> bool:
    """Whether NCCL has the wire dtype of every group of the call (``True`` without a layout)."""
    layout = where.layout
    return layout is None or all(g.wire in NCCL_DTYPE_NAMES for g in layout.groups)


class NcclAllreduce:
    """One NCCL allreduce per group over the whole communicator."""

    name = "nccl"

    def applies(self, where: Where) -> bool:
        """Device arrays; NCCL asked, or usable and AUTO (HIERARCHICAL on one node) asked."""
        if not where.device or not nccl_dtypes(where):
            return False
        asked = where.implementation
        if asked is CI.NCCL:
            return True
        return where.nccl and (
            asked is CI.AUTO or (asked is CI.HIERARCHICAL and where.nodes == 1)
        )

    def allreduce(
        self, session: Session, items: Sequence[Any], layout: Layout, opts: CommunicationOptions
    ) -> list[Any]:
        """Agree on the call, then ``ncclAllReduce`` each group into its result buffer."""
        path = session.device_path()
        call = path.prepare(items, layout)
        path.agree(layout.text, opts)
        comm = path.nccl_comm("world", call.gpu)
        op = wire_op(layout.op)
        for src, flat in zip(call.srcs, call.flats, strict=True):
            comm.allreduce(src, flat, op, call.stream)
        return call.flats


ALGORITHM = NcclAllreduce()
