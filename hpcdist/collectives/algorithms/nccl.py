"""NCCL allreduce of device arrays over all ranks of the engine's communicator.

Applies to device calls whose route is ``nccl`` (AUTO with NCCL available,
or ``CommunicationOptions(implementation="nccl")``) when NCCL has every
group's wire dtype (not int16/uint16: those calls are staged). The ranks
first agree on the call (:meth:`~hpcdist.collectives.device_path.DevicePath.agree`),
then each group is one ``ncclAllReduce`` on the caller's stream, with no
host synchronisation. NCCL's ring gives every rank the same bits.

Example: ``engine.allreduce([cupy_grad], "SUM")`` on ranks with NCCL runs here.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from hpcdist.collectives.device_path import wire_op
from hpcdist.collectives.nccl import NCCL_DTYPE_NAMES
from hpcdist.collectives.options import CommunicationOptions
from hpcdist.collectives.registry import Where

if TYPE_CHECKING:
    from hpcdist.collectives.engine import Collectives
    from hpcdist.collectives.fusion import Layout


def nccl_dtypes(where: Where) -> bool:
    """Whether NCCL has the wire dtype of every group of the call.

    Example: ``nccl_dtypes(where)`` is ``False`` for an int16 tensor.
    """
    return all(g.wire in NCCL_DTYPE_NAMES for g in where.layout.groups)


class NcclAllreduce:
    """One NCCL allreduce per group over the whole communicator."""

    name = "nccl"
    route = "nccl"

    def applies(self, where: Where) -> bool:
        """Device arrays on the ``nccl`` route, every wire dtype one NCCL has."""
        return where.device and where.device_route == self.route and nccl_dtypes(where)

    def allreduce(
        self, engine: Collectives, items: Sequence[Any], layout: Layout, opts: CommunicationOptions
    ) -> list[Any]:
        """Agree on the call, then ``ncclAllReduce`` each group into its result buffer."""
        path = engine.device_path()
        call = path.prepare(items, layout)
        path.agree(layout.text, opts)
        comm = path.nccl_comm("world", call.gpu)
        op = wire_op(layout.op)
        for src, flat in zip(call.srcs, call.flats, strict=True):
            comm.allreduce(src, flat, op, call.stream)
        return call.flats


ALGORITHM = NcclAllreduce()
