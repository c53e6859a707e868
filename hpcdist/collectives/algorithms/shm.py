"""Allreduce through the node's shared window (:mod:`hpcdist.collectives.shm_backend`).

Applies when the route is ``SHM`` (every rank on one node, and AUTO or SHM
asked). Every element is folded in rank order in one place: every rank gets
the same bits, run after run.

Example: ``CommunicationOptions(implementation="shm")`` forces it on one node.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from hpcdist.collectives.algorithms.mpi import block_by_allreduce
from hpcdist.collectives.options import CommunicationImplementation as CI
from hpcdist.collectives.options import CommunicationOptions
from hpcdist.collectives.registry import Where
from hpcdist.collectives.shm_backend import MpiStep, allreduce_plan, reduce_scatter_plan

if TYPE_CHECKING:
    from hpcdist.collectives.engine import Collectives
    from hpcdist.collectives.fusion import Layout


def node_allreduce(
    engine: Collectives,
    items: Sequence[np.ndarray],
    layout: Layout,
    opts: CommunicationOptions,
    hierarchical: bool,
) -> list[np.ndarray]:
    """Run :func:`~hpcdist.collectives.shm_backend.allreduce_plan` on the engine's window.

    Across nodes the plan starts with the MPI agreement check. Example: see
    :class:`ShmAllreduce`.
    """
    top = engine.topology(opts.timeout_seconds)
    assert top.window is not None  # (applies: a window on this node)
    what = engine.describe(layout)
    sig = engine.count_call(layout, opts, what)
    agreed = layout if sig is None else sig
    single = top.nodes == 1
    check = None if single else MpiStep(engine.comm, engine.agreement(agreed))
    plan = allreduce_plan(
        top.window, layout, list(items), engine.size, top.leaders, hierarchical, check,
        engine.buffers, agreed.digest, opts.compression,
    )
    return engine.run_on_node(top.window, plan, opts, agreed.text, what, sig)


class ShmAllreduce:
    """The node's shared window, for ranks on one node."""

    name = "shm"

    def applies(self, where: Where) -> bool:
        """When the route is SHM (one node with a shared window)."""
        return not where.device and where.route is CI.SHM and where.topology.window is not None

    def allreduce(
        self,
        engine: Collectives,
        items: Sequence[np.ndarray],
        layout: Layout,
        opts: CommunicationOptions,
    ) -> list[np.ndarray]:
        """Pack into the slots, fold in rank order (see the backend module)."""
        return node_allreduce(engine, items, layout, opts, hierarchical=False)

    def reduce_scatter(
        self,
        engine: Collectives,
        items: Sequence[np.ndarray],
        layout: Layout,
        opts: CommunicationOptions,
        bounds: Sequence[int],
    ) -> np.ndarray:
        """Each rank folds only its own block in the window, when the tensor fits one
        slot; else this rank's block of the window's allreduce."""
        top = engine.topology(opts.timeout_seconds)
        group = layout.groups[0]
        window = top.window
        if window is None or top.nodes != 1 or group.total * group.wire.itemsize > (
            window.slot_bytes
        ):
            return block_by_allreduce(self, engine, items, layout, opts, bounds)
        what = engine.describe(layout)
        sig = engine.count_call(layout, opts, what)
        agreed = layout if sig is None else sig
        plan = reduce_scatter_plan(
            window, layout, items[0], list(bounds), engine.size, agreed.digest
        )
        result: np.ndarray = engine.run_on_node(window, plan, opts, agreed.text, what, sig)
        return result


ALGORITHM = ShmAllreduce()
