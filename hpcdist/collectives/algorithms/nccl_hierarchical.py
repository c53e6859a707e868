"""Hierarchical allreduce of device arrays: NCCL in each node, MPI between node leaders.

Applies to device calls whose route is ``hierarchical``
(``CommunicationOptions(implementation="hierarchical")`` with NCCL, several
nodes) when NCCL has every group's wire dtype. Per group: NCCL reduce to
node rank 0, MPI allreduce among the node leaders (device pointers when MPI
is CUDA-aware, else through pinned host memory), NCCL broadcast in the node.

Example: ``CommunicationOptions(implementation="hierarchical")`` on GPU nodes.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from hpcdist.collectives.algorithms.nccl import nccl_dtypes
from hpcdist.collectives.device_path import wire_op
from hpcdist.collectives.options import CommunicationOptions
from hpcdist.collectives.registry import Where

if TYPE_CHECKING:
    from hpcdist.collectives.engine import Collectives
    from hpcdist.collectives.fusion import Layout


class NcclHierarchical:
    """NCCL reduce in the node, MPI among leaders, NCCL broadcast in the node."""

    name = "nccl-hierarchical"
    route = "hierarchical"

    def applies(self, where: Where) -> bool:
        """Device arrays on the ``hierarchical`` route, every wire dtype one NCCL has."""
        return where.device and where.device_route == self.route and nccl_dtypes(where)

    def allreduce(
        self, engine: Collectives, items: Sequence[Any], layout: Layout, opts: CommunicationOptions
    ) -> list[Any]:
        """Agree on the call, then node reduce, leaders' MPI reduction, node broadcast."""
        path = engine.device_path()
        call = path.prepare(items, layout)
        path.agree(layout.text, opts)
        rt, stream = call.rt, call.stream
        top = engine.topology()
        node = path.nccl_comm("node", call.gpu) if top.node.Get_size() > 1 else None
        op = wire_op(layout.op)
        for src, flat in zip(call.srcs, call.flats, strict=True):
            if node is not None:
                node.reduce(src, flat, op, 0, stream)
            elif src is not flat:
                rt.copy(flat, src, stream)
            if top.leaders is not None:
                if path.cuda_aware:
                    path.mpi_reduce(top.leaders, flat, op, opts, rt, stream)
                else:
                    path.staged_reduce(
                        [flat], [flat], op, opts, call, ("leaders", layout.digest), leaders=True
                    )
            if node is not None:
                node.broadcast(flat, 0, stream)
        return call.flats


ALGORITHM = NcclHierarchical()
