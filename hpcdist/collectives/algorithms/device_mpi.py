"""Allreduce of device arrays by a CUDA-aware MPI library, on device pointers.

For device calls asking for MPI or RING, or AUTO without NCCL, when the MPI
library is CUDA-aware (:func:`hpcdist.runtime.cuda_aware_support`). Each
group is copied into its result buffer on the caller's stream, the host
waits for the stream (MPI knows nothing of streams), and MPI reduces the
buffer in place (:func:`~hpcdist.collectives.mpi_reduce.reduce_calls`:
``Reduce`` + ``Bcast`` where MPI's floating results could differ between ranks).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from hpcdist.collectives.device_path import wire_op
from hpcdist.collectives.options import CommunicationImplementation as CI
from hpcdist.collectives.options import CommunicationOptions
from hpcdist.collectives.where import Where

if TYPE_CHECKING:
    from hpcdist.collectives.fusion import Layout
    from hpcdist.collectives.session import Session


class DeviceMpi:
    """CUDA-aware MPI on the device buffers."""

    name = "mpi-device"

    def applies(self, where: Where) -> bool:
        """Device arrays, CUDA-aware MPI, and MPI or RING asked (or AUTO without NCCL)."""
        asked = where.implementation
        return (
            where.device
            and where.cuda_aware
            and where.size > 1
            and (asked in (CI.MPI, CI.RING) or (asked is CI.AUTO and not where.nccl))
        )

    def allreduce(
        self, session: Session, items: Sequence[Any], layout: Layout, opts: CommunicationOptions
    ) -> list[Any]:
        """Agree on the call, then reduce each group's buffer in place with MPI."""
        path = session.device_path()
        call = path.prepare(items, layout)
        path.agree(layout.text, opts)
        op = wire_op(layout.op)
        for src, flat in zip(call.srcs, call.flats, strict=True):
            if src is not flat:
                call.rt.copy(flat, src, call.stream)
            path.mpi_reduce(session.comm, flat, op, opts, call.rt, call.stream)
        return call.flats


ALGORITHM = DeviceMpi()
