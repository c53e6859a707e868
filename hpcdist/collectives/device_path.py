"""The device (GPU) half of a session: NCCL communicators, pinned buffers, staging.

The engine hands a call here when its tensors are device arrays (CuPy, or
any array type with a registered :class:`~hpcdist.runtime.device.DeviceRuntime`).
An allreduce packs each dtype group into one flat device buffer (one kernel
launch), the device algorithm the registry picks (:mod:`hpcdist.collectives.registry`)
reduces the buffers through this class's services (:meth:`DevicePath.prepare`,
:meth:`DevicePath.nccl_comm`, :meth:`DevicePath.agree`,
:meth:`DevicePath.mpi_reduce`, :meth:`DevicePath.staged_reduce`), and the
results are views of them, on the inputs' GPU. Broadcast, allgather and
reduce_scatter take the transport the registry picks for the same facts.

Stream order: all work of a call is enqueued on the caller's current stream
of that GPU, after the kernels that produced the inputs and before whatever
the caller enqueues next, so NCCL calls need no host synchronisation at all.
The host waits on the stream exactly where MPI (which knows nothing of
streams) is about to read device or pinned memory: after the pack kernel
(``mpi-device``), after the device-to-host copy (``staged``), after the NCCL
reduce on a node leader (``hierarchical``). Copies back from a pinned buffer
are asynchronous; the next call that reuses that buffer first waits for them
(an event, no host wait). A device pointer never reaches an MPI library that
is not CUDA-aware.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np

from hpcdist.collectives.metadata import check_dtype, describe_arrays, signature_hash
from hpcdist.collectives.mpi_backend import Call, Plan, drive
from hpcdist.collectives.mpi_reduce import reduce_calls
from hpcdist.collectives.nccl import NcclComm, ranks_share_gpu
from hpcdist.collectives.ops import ReduceOp
from hpcdist.collectives.options import CommunicationImplementation as CI
from hpcdist.collectives.options import CommunicationOptions
from hpcdist.runtime import cuda_aware_support
from hpcdist.runtime.device import (
    DeviceArrayError,
    DeviceRuntime,
    device_arrays,
    is_c_contiguous,
    is_device_array,
    runtime_for,
)

if TYPE_CHECKING:
    from hpcdist.collectives.fusion import Layout

def has_device_arrays(tensors: Any) -> bool:
    """Whether a list or tuple of tensors holds at least one device array."""
    if not isinstance(tensors, (list, tuple)):
        return False
    for t in tensors:
        if type(t) is not np.ndarray and is_device_array(t):
            return True
    return False


def _on_gpu(method: Any) -> Any:
    """Run a :class:`DevicePath` method with the GPU of its first device array current, so
    events, default streams and NCCL calls belong to that GPU."""

    @functools.wraps(method)
    def wrapper(self: DevicePath, tensors: Any, *args: Any) -> Any:
        listed = tensors if isinstance(tensors, (list, tuple)) else [tensors]
        first = next((t for t in listed if is_device_array(t)), None)
        if first is None:
            return method(self, tensors, *args)
        rt = runtime_for(first)
        with rt.activate(rt.device_id(first)):
            return method(self, tensors, *args)

    return wrapper


def wire_op(op: ReduceOp) -> ReduceOp:
    """The op the wire runs: MEAN is a SUM (divided afterwards)."""
    return ReduceOp.SUM if op is ReduceOp.MEAN else op


class DeviceCall(NamedTuple):
    """What a device algorithm works with (:meth:`DevicePath.prepare`)."""

    rt: DeviceRuntime  # the arrays' runtime (CuPy's, or a test's fake)
    gpu: int  # the GPU the call runs on
    stream: int  # the caller's current stream there: all work is enqueued on it
    srcs: list[Any]  # per group: what it is reduced from (a tensor's view or the packed flat)
    flats: list[Any]  # per group: the flat device buffer the result goes into


class DevicePath:
    """The device-array half of one session: its NCCL communicators and pinned buffers.

    ``session``: the :class:`~hpcdist.collectives.session.Session` it belongs to
    (its communicator, topology, agreement and host operations).
    """

    PINNED_LIMIT = 64  # pinned buffers kept (one per call shape and group)

    def __init__(self, session: Any) -> None:
        self._session = session
        self.cuda_aware = session.size > 1 and cuda_aware_support() is True
        self._nccl: dict[tuple[str, int], Any] = {}
        self._pinned: dict[Any, tuple[np.ndarray, Any]] = {}
        self._shared: bool | None = None  # two ranks on one GPU (see shares_gpu)

    def _routed(self, route: str) -> str:
        self._session.last_device_route = route
        return route

    def shares_gpu(self, rt: DeviceRuntime, gpu: int) -> bool:
        """Whether two ranks run on one GPU (NCCL refuses it; this rank's is ``gpu``):
        gathered once, collectively."""
        if self._shared is None:
            self._shared = ranks_share_gpu(self._session.comm, rt.device_identity(gpu))
        return self._shared

    def nccl_comm(self, scope: str, device: int) -> Any:
        """The NCCL communicator of ``scope`` ("world" or "node") on GPU ``device``, made
        (collectively) on first use."""
        key = (scope, device)
        comm = self._nccl.get(key)
        if comm is None:
            mpi_comm = self._session.comm if scope == "world" else self._session.topology().node
            comm = self._nccl[key] = NcclComm.create(mpi_comm, device)
        return comm

    def _pinned_for(self, key: Any, nbytes: int, rt: DeviceRuntime, stream: int) -> np.ndarray:
        """A pinned buffer of ``nbytes`` for ``key``; later work on ``stream`` first waits for
        the last copy out of it."""
        held = self._pinned.get(key)
        if held is None or held[0].nbytes < nbytes:
            # Buffers dropped here may still be read by a copy in flight: wait for it first.
            dropped = list(self._pinned.values()) if len(self._pinned) >= self.PINNED_LIMIT else []
            if held is not None:
                dropped.append(held)
            pending = [event for _, event in dropped if event is not None]
            for event in pending:
                rt.wait(stream, event)
            if pending:
                rt.synchronize(stream)
            if len(self._pinned) >= self.PINNED_LIMIT:
                self._pinned.clear()
            held = (rt.pinned(nbytes), None)
            self._pinned[key] = held
        buf, event = held
        if event is not None:
            rt.wait(stream, event)
        return buf[:nbytes]

    def _released(self, key: Any, rt: DeviceRuntime, stream: int) -> None:
        buf, _ = self._pinned[key]
        self._pinned[key] = (buf, rt.record(stream))

    def agree(self, text: str, opts: CommunicationOptions) -> None:
        """Every rank checks that the others run the call ``text`` (checked mode: also its
        sequence number, with the timeout's deadline); raises the mismatch error if not."""
        session = self._session
        if session.size == 1:
            return
        layout = session.call_layout(("device", text), text)

        def plan(check: Any) -> Any:
            if check:
                yield from session.agreement(check)

        session.run_agreed(layout, opts, text, plan)

    def _device_to_mpi(self) -> None:
        """Refuse to hand a device pointer to an MPI library not known to be CUDA-aware."""
        if not self.cuda_aware:
            raise RuntimeError(
                "internal error: a device buffer was about to be passed to an MPI library that "
                "is not CUDA-aware (it would crash); please report this"
            )

    def mpi_reduce(
        self, comm: Any, flat: Any, op: ReduceOp, opts: CommunicationOptions,
        rt: DeviceRuntime, stream: int,
    ) -> None:
        """Reduce device buffer ``flat`` in place with CUDA-aware MPI on ``comm``
        (refused, an internal error, when MPI is not CUDA-aware)."""
        self._device_to_mpi()
        work = flat
        if np.dtype(flat.dtype) == np.float16:  # MPI has no half type
            work = rt.astype(flat, np.dtype(np.float32), stream)
        rt.synchronize(stream)
        drive(comm, reduce_calls(comm, work, op, opts.mpi_message_bytes), opts.timeout_seconds,
              "allreduce (CUDA-aware MPI)")
        if work is not flat:
            rt.copy(flat, rt.astype(work, np.dtype(np.float16), stream), stream)

    def staged_reduce(
        self, srcs: list[Any], flats: list[Any], op: ReduceOp, opts: CommunicationOptions,
        call: DeviceCall, key: Any, leaders: bool = False,
    ) -> None:
        """Reduce ``srcs`` into ``flats`` through pinned host memory: the engine's host
        allreduce (``leaders``: MPI among the node leaders instead)."""
        rt, stream = call.rt, call.stream
        hosts = []
        for i, (src, flat) in enumerate(zip(srcs, flats, strict=True)):
            nbytes = flat.size * np.dtype(flat.dtype).itemsize
            host = self._pinned_for((key, i), nbytes, rt, stream).view(flat.dtype)
            rt.to_host(host, src, stream)
            hosts.append(host)
        rt.synchronize(stream)  # MPI reads the pinned buffers next
        if leaders:
            comm = self._session.topology().leaders
            for host in hosts:
                drive(comm, reduce_calls(comm, host, op, opts.mpi_message_bytes),
                      opts.timeout_seconds, "allreduce among node leaders (staged)")
        else:
            host_opts = opts if opts.implementation is not CI.NCCL else CommunicationOptions(
                opts.bytes_per_pack, opts.timeout_seconds, CI.AUTO, opts.mpi_message_bytes)
            self._session.host.allreduce(hosts, op, host_opts, out=hosts)
        for i, (flat, host) in enumerate(zip(flats, hosts, strict=True)):
            rt.from_host(flat, host, stream)
            self._released((key, i), rt, stream)

    # -- the interface of the device algorithms ------------------------------------------
    def prepare(self, items: Sequence[Any], layout: Layout) -> DeviceCall:
        """The call's GPU, runtime and stream, and each group's source and result buffer.

        A group of one tensor is read in place (its source is a view of the
        tensor); the tensors of a larger group are packed (one kernel) into
        its result buffer, which is then also its source.
        """
        first = items[0]
        rt = runtime_for(first)
        gpu = rt.device_id(first)
        stream = rt.current_stream(gpu)
        srcs, flats = [], []
        for group in layout.groups:
            flat = rt.empty(group.total, group.wire, gpu)
            members = [rt.view(items[index], group.wire) for index, _, _ in group.members]
            if len(members) == 1:
                srcs.append(members[0])  # read in place: no packing copy
            else:
                rt.pack(members, flat, stream)
                srcs.append(flat)
            flats.append(flat)
        return DeviceCall(rt, gpu, stream, srcs, flats)

    # -- allreduce -----------------------------------------------------------------------
    @_on_gpu
    def allreduce(
        self, tensors: Sequence[Any], op: ReduceOp, opts: CommunicationOptions, out: Any,
        choose: Callable[[Layout, Any], Any],
    ) -> tuple[Any, list[Any]]:
        """The algorithm ``choose(layout, device_array)`` picks (the registry's) reduces the call's
        groups; returns it and the results (copied into ``out`` when given)."""
        session = self._session
        items, rt, _, stream = self._on_device(tensors, "allreduce")
        key = ("device-allreduce", op, opts, *[(t.shape, np.dtype(t.dtype)) for t in items])
        layout = session.fused_layout(key, items, op, opts)
        algorithm = choose(layout, items[0])
        flats = algorithm.allreduce(session, items, layout, opts)
        self._routed(algorithm.name)
        return algorithm, self._unfuse(layout, flats, op, rt, stream, out)

    def _unfuse(
        self, layout: Layout, flats: list[Any], op: ReduceOp, rt: DeviceRuntime, stream: int,
        out: Any,
    ) -> list[Any]:
        size = self._session.size
        results: list[Any] = [None] * len(layout.shapes)
        for group, flat in zip(layout.groups, flats, strict=True):
            if op is ReduceOp.MEAN and group.wire.kind in "iu":
                flat = rt.divide(flat, size, stream)  # a new float64 buffer
                dtype, ratio = np.dtype(np.float64), 1
            else:
                if op is ReduceOp.MEAN and size > 1:
                    flat = rt.divide(flat, size, stream)
                dtype, ratio = group.dtype, group.dtype.itemsize // group.wire.itemsize
            typed = rt.view(flat, dtype) if dtype != np.dtype(flat.dtype) else flat
            for index, first, count in group.members:
                lo = first // ratio
                piece = rt.slice(typed, lo, lo + count // ratio)
                results[index] = rt.view(piece, dtype, layout.shapes[index])
        if out is None:
            return results
        targets = list(out)
        if len(targets) != len(results):
            raise ValueError(f"out has {len(targets)} arrays for {len(results)} tensors")
        for i, (target, result) in enumerate(zip(targets, results, strict=True)):
            if not is_device_array(target) or target.shape != result.shape or np.dtype(
                target.dtype
            ) != np.dtype(result.dtype):
                raise ValueError(
                    f"out[{i}] must be a device array of shape {result.shape} and dtype "
                    f"{result.dtype}; got {type(target).__name__}"
                )
            if not is_c_contiguous(target):  # a flat copy would scatter it wrongly
                raise DeviceArrayError(
                    f"out[{i}] of shape {tuple(target.shape)} is not C-contiguous; pass a "
                    "contiguous out array (cupy.ascontiguousarray), or no out= and copy the "
                    "result into the view yourself"
                )
            rt.copy(target, result, stream)
        return targets

    def _on_device(
        self, tensors: Sequence[Any], operation: str
    ) -> tuple[list[Any], DeviceRuntime, int, int]:
        """The tensors all on one GPU (host arrays copied there), its runtime, GPU and stream."""
        first = next(t for t in tensors if type(t) is not np.ndarray and is_device_array(t))
        rt, gpu = device_arrays([first], operation)
        stream = rt.current_stream(gpu)
        items = [
            t if is_device_array(t) else rt.to_device(np.asarray(t), gpu, stream) for t in tensors
        ]
        device_arrays(items, operation)
        for i, t in enumerate(items):
            check_dtype(np.dtype(t.dtype), operation, i)
        return items, rt, gpu, stream

    # -- broadcast -----------------------------------------------------------------------
    @_on_gpu
    def broadcast(
        self, tensors: Sequence[Any], root: int, opts: CommunicationOptions, route: str
    ) -> list:
        """The engine's broadcast for device arrays on transport ``route``: one flat byte
        buffer, one call (``hierarchical`` broadcasts with NCCL over all ranks)."""
        session = self._session
        items, rt, gpu, stream = self._on_device(tensors, "broadcast")
        sizes = [t.size * np.dtype(t.dtype).itemsize for t in items]
        flat = rt.empty(sum(sizes), np.dtype(np.uint8), gpu)
        rt.pack([rt.view(t, np.dtype(np.uint8)) for t in items], flat, stream)
        route = self._routed("nccl" if route == "hierarchical" else route)
        text = f"broadcast(root={root}, {describe_arrays(items)}, device)"
        if route == "staged":
            host = self._pinned_for(("bcast", signature_hash(text)), flat.size, rt, stream)
            rt.to_host(host, flat, stream)
            rt.synchronize(stream)
            (got,) = session.host.broadcast([host], root, opts)
            rt.from_host(flat, got, stream)
            self._released(("bcast", signature_hash(text)), rt, stream)
        elif route != "copy":
            self.agree(text, opts)
            if route == "nccl":
                self.nccl_comm("world", gpu).broadcast(flat, root, stream)
            else:
                self._device_to_mpi()
                rt.synchronize(stream)
                drive(session.comm, iter_bcast(flat, root), opts.timeout_seconds, text)
        out, lo = [], 0
        for t, n in zip(items, sizes, strict=True):
            piece = rt.slice(flat, lo, lo + n)
            out.append(rt.view(piece, np.dtype(t.dtype), tuple(t.shape)))
            lo += n
        return out

    # -- allgather and reduce_scatter ----------------------------------------------------
    @_on_gpu
    def allgather(self, tensor: Any, axis: int, opts: CommunicationOptions, route: str) -> Any:
        """The engine's allgather for a device array: NCCL (transport ``route``) when every
        rank has the same shape and ``axis`` is 0, else through pinned host memory."""
        session = self._session
        (x,), rt, gpu, stream = self._on_device([tensor], "allgather")
        self._routed(route)
        shape = tuple(x.shape) or (1,)
        if route == "copy":
            copied = rt.empty(x.size, np.dtype(x.dtype), gpu)
            rt.copy(copied, rt.view(x, np.dtype(x.dtype)), stream)
            return rt.view(copied, np.dtype(x.dtype), shape)
        if route == "nccl" and axis in (0, -len(shape)) and self._same_shapes(shape, opts):
            comm = self.nccl_comm("world", gpu)
            if comm.supports(np.dtype(x.dtype)):
                text = f"allgather(axis=0, {describe_arrays([x])}, device)"
                self.agree(text, opts)
                send = rt.view(x, np.dtype(x.dtype))
                recv = rt.empty(send.size * session.size, np.dtype(x.dtype), gpu)
                comm.allgather(send, recv, stream)
                return rt.view(recv, np.dtype(x.dtype), (shape[0] * session.size, *shape[1:]))
        self._routed("staged")
        host = self._to_pinned_copy("allgather", x, rt, stream)
        out = rt.to_device(session.host.allgather(host, axis, opts), gpu, stream)
        self._released("allgather", rt, stream)
        return out

    @_on_gpu
    def reduce_scatter(
        self, tensor: Any, op: ReduceOp, opts: CommunicationOptions, route: str
    ) -> Any:
        """The engine's reduce_scatter for a device array: NCCL (transport ``route``) when
        the rows split evenly (and the dtype is NCCL's), else through pinned host memory."""
        session = self._session
        (x,), rt, gpu, stream = self._on_device([tensor], "reduce_scatter")
        self._routed(route)
        even = x.ndim > 0 and x.shape[0] % session.size == 0
        dtype = np.dtype(x.dtype)
        if route == "nccl" and even and dtype.kind in "iuf":
            comm = self.nccl_comm("world", gpu)
            if comm.supports(dtype):
                text = f"reduce_scatter(op={op.name}, {describe_arrays([x])}, device)"
                self.agree(text, opts)
                send = rt.view(x, dtype)
                recv = rt.empty(send.size // session.size, dtype, gpu)
                comm.reduce_scatter(send, recv, wire_op(op), stream)
                if op is ReduceOp.MEAN:
                    recv = rt.divide(recv, session.size, stream)
                block = (x.shape[0] // session.size, *x.shape[1:])
                return rt.view(recv, np.dtype(recv.dtype), block)
        self._routed("staged")
        host = self._to_pinned_copy("reduce_scatter", x, rt, stream)
        out = rt.to_device(session.host.reduce_scatter(host, op, opts), gpu, stream)
        self._released("reduce_scatter", rt, stream)
        return out

    def _to_pinned_copy(self, key: str, x: Any, rt: DeviceRuntime, stream: int) -> np.ndarray:
        """A host copy of ``x`` (its shape) in the pinned buffer kept for ``key``, stream done.

        Release it with :meth:`_released` once the copy of the result is enqueued (the
        result may be a view of the buffer: the next call's copy in waits for it)."""
        dtype = np.dtype(x.dtype)
        host = self._pinned_for(key, x.size * dtype.itemsize, rt, stream).view(dtype)
        rt.to_host(host, x, stream)
        rt.synchronize(stream)
        return host.reshape(tuple(x.shape))

    def _same_shapes(self, shape: tuple[int, ...], opts: CommunicationOptions) -> bool:
        """Whether every rank passes ``shape`` (one small host allreduce)."""
        mine = np.array([shape[0], -shape[0]], np.int64)
        (both,) = self._session.host.allreduce([mine], ReduceOp.MAX, CommunicationOptions(
            0, opts.timeout_seconds, CI.AUTO))
        return int(both[0]) == -int(both[1])

    def close(self) -> None:
        """Destroy the NCCL communicators and drop the pinned buffers."""
        for comm in self._nccl.values():
            comm.close()
        self._nccl.clear()
        self._pinned.clear()


def iter_bcast(flat: Any, root: int) -> Plan:
    """The MPI plan of broadcasting device buffer ``flat`` (CUDA-aware MPI)."""
    yield Call("Bcast", (flat, root))
