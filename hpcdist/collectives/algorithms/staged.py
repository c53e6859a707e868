"""Allreduce of device arrays through pinned host memory and the host algorithms.

The device fallback: every device call no algorithm before it took (MPI not
CUDA-aware, SHM asked, or a wire dtype NCCL lacks: int16, uint16). Each
group is copied to a pinned host buffer kept per call shape, the host waits
for the copies, the engine's host allreduce reduces the pinned buffers in
place (so the host algorithms run), and the results are copied back
asynchronously; the next call that reuses a pinned buffer first waits (an
event) for the copy out of it. A device pointer never reaches an MPI library
that is not CUDA-aware.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from hpcdist.collectives.device_path import wire_op
from hpcdist.collectives.options import CommunicationOptions
from hpcdist.collectives.where import Where

if TYPE_CHECKING:
    from hpcdist.collectives.fusion import Layout
    from hpcdist.collectives.session import Session


class Staged:
    """Pinned host copies, the host path, copies back."""

    name = "staged"

    def applies(self, where: Where) -> bool:
        """Every device call (the last device algorithm)."""
        return where.device

    def allreduce(
        self, session: Session, items: Sequence[Any], layout: Layout, opts: CommunicationOptions
    ) -> list[Any]:
        """Stage each group through pinned host memory and the engine's host allreduce."""
        path = session.device_path()
        call = path.prepare(items, layout)
        path.staged_reduce(call.srcs, call.flats, wire_op(layout.op), opts, call, layout.digest)
        return call.flats


ALGORITHM = Staged()
