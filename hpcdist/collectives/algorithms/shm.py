"""Allreduce through the node's shared window (:mod:`hpcdist.collectives.shm_backend`).

Applies when the backend is ``SHM`` (every rank on one node, and AUTO, SHM or
HIERARCHICAL asked). Every element is folded in rank order in one place: every rank gets
the same bits, run after run. An unchecked call of one bucket that every rank folds
whole (at most :data:`~hpcdist.collectives.shm_backend.SMALL_BUCKET_BYTES`) takes the
``small`` algorithm's three compiled calls instead of the plan: the same copies,
barrier and fold kernel, so the same bits, without the plan's generator.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from hpcdist.collectives.algorithms.mpi import SlicedScatter
from hpcdist.collectives.algorithms.small import ALGORITHM as SMALL
from hpcdist.collectives.options import CommunicationImplementation as CI
from hpcdist.collectives.options import CommunicationOptions
from hpcdist.collectives.shm_backend import (
    SMALL_BUCKET_BYTES,
    MpiStep,
    allreduce_plan,
    blocked_reduce_scatter_plan,
    reduce_scatter_plan,
)
from hpcdist.collectives.where import Where

if TYPE_CHECKING:
    from hpcdist.collectives.fusion import Layout
    from hpcdist.collectives.session import Session


def node_allreduce(
    session: Session,
    items: Sequence[np.ndarray],
    layout: Layout,
    opts: CommunicationOptions,
    hierarchical: bool,
) -> list[np.ndarray]:
    """Run :func:`~hpcdist.collectives.shm_backend.allreduce_plan` on the session's window.

    Across nodes the plan starts with the MPI agreement check.
    """
    top = session.topology(opts.timeout_seconds)
    assert top.window is not None  # (applies: a window on this node)
    what = session.describe(layout)
    sig = session.count_call(layout, opts, what)
    agreed = layout if sig is None else sig
    single = top.nodes == 1
    check = None if single else MpiStep(session.comm, session.agreement(agreed))
    plan = allreduce_plan(
        top.window, layout, list(items), session.size, top.leaders, hierarchical, check,
        session.buffers, agreed.digest, opts.compression,
    )
    return session.run_on_node(top.window, plan, opts, agreed.text, what, sig)


class ShmAllreduce(SlicedScatter):
    """The node's shared window, for ranks on one node."""

    name = "shm"

    def applies(self, where: Where) -> bool:
        """When the backend is SHM (one node with a shared window)."""
        return not where.device and where.backend is CI.SHM and where.window is not None

    def allreduce(
        self,
        session: Session,
        items: Sequence[np.ndarray],
        layout: Layout,
        opts: CommunicationOptions,
    ) -> list[np.ndarray]:
        """Pack into the slots, fold in rank order (see the backend module)."""
        group = layout.groups[0]
        if (
            opts.timeout_seconds is None
            and len(layout.groups) == 1
            and len(group.buckets) == 1
            and group.total * group.wire.itemsize <= SMALL_BUCKET_BYTES
        ):  # one bucket every rank folds whole: what the plan does, without it
            return SMALL.allreduce(session, items, layout, opts)
        return node_allreduce(session, items, layout, opts, hierarchical=False)

    def reduce_scatter(
        self,
        session: Session,
        items: Sequence[np.ndarray],
        layout: Layout,
        opts: CommunicationOptions,
        bounds: Sequence[int],
    ) -> np.ndarray:
        """Each rank folds only its own block in the window: the whole tensor in one
        slot when it fits, else in rounds of one slot (a chunk of every block each)."""
        top = session.topology(opts.timeout_seconds)
        group = layout.groups[0]
        window = top.window
        if window is None or top.nodes != 1:
            return super().reduce_scatter(session, items, layout, opts, bounds)
        what = session.describe(layout)
        sig = session.count_call(layout, opts, what)
        agreed = layout if sig is None else sig
        fits = group.total * group.wire.itemsize <= window.slot_bytes
        make = reduce_scatter_plan if fits else blocked_reduce_scatter_plan
        plan = make(window, layout, items[0], list(bounds), session.size, agreed.digest)
        result: np.ndarray = session.run_on_node(window, plan, opts, agreed.text, what, sig)
        return result


ALGORITHM = ShmAllreduce()
