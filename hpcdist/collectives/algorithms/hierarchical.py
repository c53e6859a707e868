"""Hierarchical allreduce: reduce in each node, MPI between the node leaders, spread back.

Host arrays: for the ``HIERARCHICAL`` backend (several nodes, some with more
than one rank): the node's shared window reduces, the leaders' sum runs in
a fixed order and its bits are broadcast through each node's window, so
every rank gets the same bits.

Device arrays: for HIERARCHICAL asked on several nodes with NCCL usable and
every group's wire dtype one NCCL has. Per group: NCCL reduce to node rank
0, MPI allreduce among the node leaders (device pointers when MPI is
CUDA-aware, else through pinned host memory), NCCL broadcast in the node.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from hpcdist.collectives.algorithms.mpi import SlicedScatter
from hpcdist.collectives.algorithms.nccl import nccl_dtypes
from hpcdist.collectives.algorithms.shm import node_allreduce
from hpcdist.collectives.device_path import wire_op
from hpcdist.collectives.options import CommunicationImplementation as CI
from hpcdist.collectives.options import CommunicationOptions
from hpcdist.collectives.where import Where

if TYPE_CHECKING:
    from hpcdist.collectives.fusion import Layout
    from hpcdist.collectives.session import Session


class HierarchicalAllreduce(SlicedScatter):
    """In the nodes (shared windows, or NCCL on GPUs), MPI between node leaders."""

    name = "hierarchical"

    def applies(self, where: Where) -> bool:
        """Several nodes; host: the HIERARCHICAL backend and a window on this node; device:
        HIERARCHICAL asked, NCCL usable with every wire dtype."""
        if where.nodes < 2:
            return False
        if where.device:
            return (
                where.implementation is CI.HIERARCHICAL and where.nccl and nccl_dtypes(where)
            )
        return where.backend is CI.HIERARCHICAL and where.window is not None

    def allreduce(
        self, session: Session, items: Sequence[Any], layout: Layout, opts: CommunicationOptions
    ) -> list[Any]:
        """Node reduction, the leaders' MPI reduction, node broadcast."""
        if not items or items[0].__class__ is np.ndarray:
            return node_allreduce(session, items, layout, opts, hierarchical=True)
        return _device_allreduce(session, items, layout, opts)


def _device_allreduce(
    session: Session, items: Sequence[Any], layout: Layout, opts: CommunicationOptions
) -> list[Any]:
    path = session.device_path()
    call = path.prepare(items, layout)
    path.agree(layout.text, opts)
    rt, stream = call.rt, call.stream
    top = session.topology()
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


ALGORITHM = HierarchicalAllreduce()
