"""Allreduce of device arrays through pinned host memory and the host algorithms.

Applies to every device call (the device fallback at the end of the device
algorithms): the ``staged`` route (MPI not CUDA-aware, or SHM asked), and
calls on the NCCL routes with a wire dtype NCCL lacks (int16, uint16). Each
group is copied to a pinned host buffer kept per call shape, the host waits
for the copies, the engine's host allreduce reduces the pinned buffers in
place (so the host registry picks ``shm``, ``mpi``, ...), and the results
are copied back asynchronously; the next call that reuses a pinned buffer
first waits (an event) for the copy out of it. A device pointer never
reaches an MPI library that is not CUDA-aware.

Example: ``engine.allreduce([cupy_grad], "SUM")`` without NCCL or CUDA-aware MPI.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from hpcdist.collectives.device_path import wire_op
from hpcdist.collectives.options import CommunicationOptions
from hpcdist.collectives.registry import Where

if TYPE_CHECKING:
    from hpcdist.collectives.engine import Collectives
    from hpcdist.collectives.fusion import Layout


class DeviceStaged:
    """Pinned host copies, the host path, copies back."""

    name = "device-staged"
    route = "staged"

    def applies(self, where: Where) -> bool:
        """Every device call (the last device algorithm)."""
        return where.device

    def allreduce(
        self, engine: Collectives, items: Sequence[Any], layout: Layout, opts: CommunicationOptions
    ) -> list[Any]:
        """Stage each group through pinned host memory and the engine's host allreduce."""
        path = engine.device_path()
        call = path.prepare(items, layout)
        path.staged_reduce(call.srcs, call.flats, wire_op(layout.op), opts, call, layout.digest)
        return call.flats


ALGORITHM = DeviceStaged()
