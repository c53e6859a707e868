"""Hierarchical allreduce: shared window in each node, MPI between the node leaders.

Applies when the route is ``HIERARCHICAL`` (several nodes, some with more
than one rank). The leaders' sum runs in a fixed order and its bits are
broadcast through each node's window, so every rank gets the same bits.

Example: ``CommunicationOptions(implementation="hierarchical")``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from hpcdist.collectives.algorithms.mpi import block_by_allreduce
from hpcdist.collectives.algorithms.shm import node_allreduce
from hpcdist.collectives.options import CommunicationImplementation as CI
from hpcdist.collectives.options import CommunicationOptions
from hpcdist.collectives.registry import Where

if TYPE_CHECKING:
    from hpcdist.collectives.engine import Collectives
    from hpcdist.collectives.fusion import Layout


class HierarchicalAllreduce:
    """Node windows plus MPI between node leaders."""

    name = "hierarchical"

    def applies(self, where: Where) -> bool:
        """When the route is HIERARCHICAL (several nodes, a window on this one)."""
        top = where.topology
        return (
            not where.device
            and where.route is CI.HIERARCHICAL
            and top.nodes > 1
            and top.window is not None
        )

    def allreduce(
        self,
        engine: Collectives,
        items: Sequence[np.ndarray],
        layout: Layout,
        opts: CommunicationOptions,
    ) -> list[np.ndarray]:
        """Reduce-scatter in the node, leaders' MPI reduction, spread through the window."""
        return node_allreduce(engine, items, layout, opts, hierarchical=True)

    def reduce_scatter(
        self,
        engine: Collectives,
        items: Sequence[np.ndarray],
        layout: Layout,
        opts: CommunicationOptions,
        bounds: Sequence[int],
    ) -> np.ndarray:
        """This rank's block of the hierarchical allreduce."""
        return block_by_allreduce(self, engine, items, layout, opts, bounds)


ALGORITHM = HierarchicalAllreduce()
