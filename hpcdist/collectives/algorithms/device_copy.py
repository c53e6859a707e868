"""Device arrays in a world of one rank (AUTO): the results are copies on the GPU.

Applies to device calls whose route (:func:`~hpcdist.collectives.device_path.choose_route`)
is ``copy``: nothing to reduce with, so each group's source is copied into
its result buffer (a group of several tensors was packed there already).

Example: ``Collectives(COMM_SELF).allreduce([cupy.ones(3)], "SUM")`` runs here.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from hpcdist.collectives.options import CommunicationOptions
from hpcdist.collectives.registry import Where

if TYPE_CHECKING:
    from hpcdist.collectives.engine import Collectives
    from hpcdist.collectives.fusion import Layout


class DeviceCopy:
    """Copies on the device: a world of one rank."""

    name = "device-copy"
    route = "copy"

    def applies(self, where: Where) -> bool:
        """Device arrays on the ``copy`` route."""
        return where.device and where.device_route == self.route

    def allreduce(
        self, engine: Collectives, items: Sequence[Any], layout: Layout, opts: CommunicationOptions
    ) -> list[Any]:
        """Each group's source copied into its result buffer, on the caller's stream."""
        call = engine.device_path().prepare(items, layout)
        for src, flat in zip(call.srcs, call.flats, strict=True):
            if src is not flat:
                call.rt.copy(flat, src, call.stream)
        return call.flats


ALGORITHM = DeviceCopy()
