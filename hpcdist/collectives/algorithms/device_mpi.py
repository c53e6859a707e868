"""Allreduce of device arrays by a CUDA-aware MPI library, on device pointers.

Applies to device calls whose route is ``mpi-device``: MPI, RING, or AUTO
without NCCL, when the MPI library is CUDA-aware
(:func:`hpcdist.runtime.cuda_aware_support`). Each group is copied into its
result buffer on the caller's stream, the host waits for the stream (MPI
knows nothing of streams), and MPI reduces the buffer in place
(:func:`~hpcdist.collectives.mpi_reduce.reduce_calls`: ``Reduce`` + ``Bcast``
where MPI's floating results could differ between ranks).

Example: ``CommunicationOptions(implementation="mpi")`` on GPUs with CUDA-aware MPI.
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


class DeviceMpi:
    """CUDA-aware MPI on the device buffers."""

    name = "mpi-device"
    route = "mpi-device"

    def applies(self, where: Where) -> bool:
        """Device arrays on the ``mpi-device`` route."""
        return where.device and where.device_route == self.route

    def allreduce(
        self, engine: Collectives, items: Sequence[Any], layout: Layout, opts: CommunicationOptions
    ) -> list[Any]:
        """Agree on the call, then reduce each group's buffer in place with MPI."""
        path = engine.device_path()
        call = path.prepare(items, layout)
        path.agree(layout.text, opts)
        op = wire_op(layout.op)
        for src, flat in zip(call.srcs, call.flats, strict=True):
            if src is not flat:
                call.rt.copy(flat, src, call.stream)
            path.mpi_reduce(engine.comm, flat, op, opts, call.rt, call.stream)
        return call.flats


ALGORITHM = DeviceMpi()
