"""The engine's path for device (GPU) arrays: NCCL, CUDA-aware MPI, pinned staging.

:class:`~hpcdist.collectives.engine.Collectives` hands a call here when its
tensors are device arrays (CuPy, or any array type with a registered
:class:`~hpcdist.runtime.device.DeviceRuntime`). A call packs each dtype
group into one flat device buffer (one kernel launch), reduces the buffers by
one *route*, and returns views of them, on the inputs' GPU:

* ``copy``: a world of one rank (AUTO): copies only.
* ``nccl``: NCCL over all ranks of the communicator (through ``cupy.cuda.nccl``).
* ``mpi-device``: MPI with device pointers, when the MPI library is CUDA-aware.
* ``staged``: copy to pinned host memory, the host path (MPI or shared
  memory, as asked), copy back. Used whenever MPI is not CUDA-aware: a device
  pointer never reaches such an MPI library.
* ``hierarchical``: NCCL reduce to node rank 0, MPI among node leaders
  (device pointers when CUDA-aware, else staged), NCCL broadcast in the node.

Which route (:func:`choose_route`), from ``CommunicationOptions.implementation``:
AUTO is ``nccl`` when NCCL is available, else ``mpi-device`` or ``staged``;
NCCL is ``nccl`` (even on one rank); MPI/RING are ``mpi-device`` or
``staged``; SHM is ``staged``; HIERARCHICAL is ``hierarchical`` (``staged``
without NCCL). Groups of a dtype NCCL lacks (int16, uint16) are staged.

Stream order: all work of a call is enqueued on the caller's current stream
of that GPU, after the kernels that produced the inputs and before whatever
the caller enqueues next, so NCCL calls need no host synchronisation at all.
The host waits on the stream exactly where MPI (which knows nothing of
streams) is about to read device or pinned memory: after the pack kernel
(``mpi-device``), after the device-to-host copy (``staged``), after the NCCL
reduce on a node leader (``hierarchical``). Copies back from a pinned buffer
are asynchronous; the next call that reuses that buffer first waits for them
(an event, no host wait).

Example (needs a GPU)::

    c = Collectives()
    grads = c.allreduce([cupy.ones(3), cupy.zeros(2)], "SUM")   # CuPy results
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import numpy as np

from hpcdist.collectives import choice
from hpcdist.collectives.metadata import describe_arrays, signature_hash
from hpcdist.collectives.mpi_backend import drive
from hpcdist.collectives.mpi_reduce import reduce_calls
from hpcdist.collectives.nccl import NCCL_DTYPE_NAMES, NcclComm, nccl_available
from hpcdist.collectives.ops import ReduceOp
from hpcdist.collectives.options import CommunicationImplementation as CI
from hpcdist.collectives.options import CommunicationOptions
from hpcdist.runtime.device import DeviceRuntime, device_arrays, is_device_array, runtime_for

ROUTES = ("copy", "nccl", "mpi-device", "staged", "hierarchical")


def choose_route(asked: CI, size: int, nccl_ok: bool, cuda_aware: bool) -> str:
    """The route of a device call (see the module docstring).

    Example:
        >>> choose_route(CI.AUTO, size=4, nccl_ok=False, cuda_aware=False)
        'staged'
        >>> choose_route(CI.NCCL, size=1, nccl_ok=True, cuda_aware=False)
        'nccl'
    """
    if asked is CI.AUTO:
        asked = choice.env_implementation()
    if asked is CI.NCCL:
        return "nccl"
    if size == 1:
        return "copy"
    if asked is CI.HIERARCHICAL:
        return "hierarchical" if nccl_ok else "staged"
    if asked is CI.AUTO and nccl_ok:
        return "nccl"
    if asked in (CI.AUTO, CI.MPI, CI.RING):
        return "mpi-device" if cuda_aware else "staged"
    return "staged"


def has_device_arrays(tensors: Any) -> bool:
    """Whether a list or tuple of tensors holds at least one device array.

    Example: ``has_device_arrays([np.ones(2)])`` is ``False``.
    """
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


def _wire_op(op: ReduceOp) -> ReduceOp:
    return ReduceOp.SUM if op is ReduceOp.MEAN else op


class DevicePath:
    """The device-array half of one engine: its NCCL communicators and pinned buffers.

    Example: built by the engine on its first call on device arrays.
    """

    PINNED_LIMIT = 64  # pinned buffers kept (one per call shape and group)

    def __init__(self, engine: Any) -> None:
        from hpcdist.runtime import cuda_aware_support

        self._engine = engine
        self.cuda_aware = engine.size > 1 and cuda_aware_support() is True
        self._nccl: dict[tuple[str, int], Any] = {}
        self._pinned: dict[Any, tuple[np.ndarray, Any]] = {}
        self.last_route: str | None = None

    # -- helpers -------------------------------------------------------------------------
    def _route(self, opts: CommunicationOptions, rt: DeviceRuntime) -> str:
        asked = opts.implementation
        wants = asked in (CI.AUTO, CI.HIERARCHICAL) and self._engine.size > 1
        nccl_ok = wants and nccl_available()[0]
        route = choose_route(asked, self._engine.size, nccl_ok, self.cuda_aware)
        if route == "hierarchical" and self._engine.topology(opts.timeout_seconds).nodes == 1:
            route = "nccl"  # one node: the node's NCCL communicator is the whole one
        self.last_route = route
        self._engine.last_device_route = route
        return route

    def _comm(self, scope: str, device: int) -> Any:
        """The NCCL communicator of ``scope`` ("world" or "node") on GPU ``device``."""
        key = (scope, device)
        comm = self._nccl.get(key)
        if comm is None:
            mpi_comm = self._engine.comm if scope == "world" else self._engine.topology().node
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

    def _agree(self, text: str, opts: CommunicationOptions) -> None:
        """Every rank checks that the others run the same call (checked mode: also its
        sequence number, with the timeout's deadline); raises the mismatch error if not."""
        engine = self._engine
        if engine.size == 1:
            return
        layout = engine.call_layout(("device", text), text)

        def plan(check: Any) -> Any:
            if check:
                yield from engine.agreement(check)

        engine.run_agreed(layout, opts, text, plan)

    def _device_to_mpi(self) -> None:
        """Refuse to hand a device pointer to an MPI library not known to be CUDA-aware."""
        if not self.cuda_aware:
            raise RuntimeError(
                "internal error: a device buffer was about to be passed to an MPI library that "
                "is not CUDA-aware (it would crash); please report this"
            )

    def _mpi_reduce(self, comm: Any, flat: Any, op: ReduceOp, opts: Any, rt: Any, stream: int):
        """Reduce device buffer ``flat`` in place with CUDA-aware MPI (the stream is idle)."""
        self._device_to_mpi()
        work = flat
        if np.dtype(flat.dtype) == np.float16:  # MPI has no half type
            work = rt.astype(flat, np.dtype(np.float32), stream)
        rt.synchronize(stream)
        drive(comm, reduce_calls(comm, work, op, opts.mpi_message_bytes), opts.timeout_seconds,
              "allreduce (CUDA-aware MPI)")
        if work is not flat:
            rt.copy(flat, rt.astype(work, np.dtype(np.float16), stream), stream)

    def _staged_reduce(
        self, comm_engine: Any, srcs: list[Any], flats: list[Any], op: ReduceOp, opts: Any,
        rt: Any, stream: int, key: Any,
    ) -> None:
        """Reduce device buffers ``srcs`` into ``flats`` through pinned host memory."""
        hosts = []
        for i, (src, flat) in enumerate(zip(srcs, flats, strict=True)):
            nbytes = flat.size * np.dtype(flat.dtype).itemsize
            host = self._pinned_for((key, i), nbytes, rt, stream).view(flat.dtype)
            rt.to_host(host, src, stream)
            hosts.append(host)
        rt.synchronize(stream)  # MPI reads the pinned buffers next
        if comm_engine is None:  # the node leaders' communicator
            leaders = self._engine.topology().leaders
            for host in hosts:
                drive(leaders, reduce_calls(leaders, host, op, opts.mpi_message_bytes),
                      opts.timeout_seconds, "allreduce among node leaders (staged)")
        else:
            host_opts = opts if opts.implementation is not CI.NCCL else CommunicationOptions(
                opts.bytes_per_pack, opts.timeout_seconds, CI.AUTO, opts.mpi_message_bytes)
            comm_engine.allreduce(hosts, op, host_opts, out=hosts)
        for i, (flat, host) in enumerate(zip(flats, hosts, strict=True)):
            rt.from_host(flat, host, stream)
            self._released((key, i), rt, stream)

    # -- allreduce -----------------------------------------------------------------------
    @_on_gpu
    def allreduce(
        self, tensors: Sequence[Any], op: ReduceOp, opts: CommunicationOptions, out: Any
    ) -> list[Any]:
        """The engine's allreduce for device arrays (see the module docstring)."""
        engine = self._engine
        items, rt, gpu, stream = self._on_device(tensors, "allreduce")
        key = ("device-allreduce", op, opts, *[(t.shape, np.dtype(t.dtype)) for t in items])
        layout = engine.fused_layout(key, items, op, opts)
        route = self._route(opts, rt)
        srcs, flats = [], []  # what each group is reduced from, and into
        for group in layout.groups:
            flat = rt.empty(group.total, group.wire, gpu)
            members = [rt.view(items[index], group.wire) for index, _, _ in group.members]
            if len(members) == 1:
                srcs.append(members[0])  # read in place: no packing copy
            else:
                rt.pack(members, flat, stream)
                srcs.append(flat)
            flats.append(flat)
        wire_op = _wire_op(op)
        if route in ("nccl", "hierarchical") and not all(
            g.wire in NCCL_DTYPE_NAMES for g in layout.groups
        ):
            route = self.last_route = engine.last_device_route = "staged"
        if route == "staged":
            self._staged_reduce(engine, srcs, flats, wire_op, opts, rt, stream, layout.digest)
        else:
            if route != "copy":
                self._agree(layout.text, opts)
            for src, flat in zip(srcs, flats, strict=True):
                self._reduce_one(route, src, flat, wire_op, opts, rt, gpu, stream, layout.digest)
        return self._unfuse(layout, flats, op, rt, stream, out)

    def _reduce_one(self, route, src, flat, op, opts, rt, gpu, stream, key) -> None:
        """Reduce device buffer ``src`` into ``flat`` (they may be one buffer) by ``route``."""
        engine = self._engine
        if route == "nccl":
            self._comm("world", gpu).allreduce(src, flat, op, stream)
            return
        if route != "hierarchical":  # copy, mpi-device
            if src is not flat:
                rt.copy(flat, src, stream)
            if route == "mpi-device":
                self._mpi_reduce(engine.comm, flat, op, opts, rt, stream)
            return
        top = engine.topology()
        node = self._comm("node", gpu) if top.node.Get_size() > 1 else None
        if node is not None:
            node.reduce(src, flat, op, 0, stream)
        elif src is not flat:
            rt.copy(flat, src, stream)
        if top.leaders is not None:
            if self.cuda_aware:
                self._mpi_reduce(top.leaders, flat, op, opts, rt, stream)
            else:
                self._staged_reduce(None, [flat], [flat], op, opts, rt, stream, ("leaders", key))
        if node is not None:
            node.broadcast(flat, 0, stream)

    def _unfuse(self, layout, flats, op, rt, stream, out) -> list[Any]:
        size = self._engine.size
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
            rt.copy(target, result, stream)
        return targets

    def _on_device(self, tensors: Sequence[Any], operation: str):
        """The tensors all on one GPU (host arrays copied there), its runtime, GPU and stream."""
        first = next(t for t in tensors if type(t) is not np.ndarray and is_device_array(t))
        rt, gpu = device_arrays([first], operation)
        stream = rt.current_stream(gpu)
        items = [
            t if is_device_array(t) else rt.to_device(np.asarray(t), gpu, stream) for t in tensors
        ]
        device_arrays(items, operation)
        from hpcdist.collectives.engine import _check_dtype

        for i, t in enumerate(items):
            _check_dtype(np.dtype(t.dtype), operation, i)
        return items, rt, gpu, stream

    # -- broadcast -----------------------------------------------------------------------
    @_on_gpu
    def broadcast(self, tensors: Sequence[Any], root: int, opts: CommunicationOptions) -> list:
        """The engine's broadcast for device arrays: one flat byte buffer, one call."""
        engine = self._engine
        items, rt, gpu, stream = self._on_device(tensors, "broadcast")
        sizes = [t.size * np.dtype(t.dtype).itemsize for t in items]
        flat = rt.empty(sum(sizes), np.dtype(np.uint8), gpu)
        rt.pack([rt.view(t, np.dtype(np.uint8)) for t in items], flat, stream)
        route = self._route(opts, rt)
        if route == "hierarchical":
            route = self.last_route = engine.last_device_route = "nccl"
        text = f"broadcast(root={root}, {describe_arrays(items)}, device)"
        if route == "staged":
            host = self._pinned_for(("bcast", signature_hash(text)), flat.size, rt, stream)
            rt.to_host(host, flat, stream)
            rt.synchronize(stream)
            (got,) = engine.broadcast([host], root, opts)
            rt.from_host(flat, got, stream)
            self._released(("bcast", signature_hash(text)), rt, stream)
        elif route != "copy":
            self._agree(text, opts)
            if route == "nccl":
                self._comm("world", gpu).broadcast(flat, root, stream)
            else:
                self._device_to_mpi()
                rt.synchronize(stream)
                drive(engine.comm, iter_bcast(flat, root), opts.timeout_seconds, text)
        out, lo = [], 0
        for t, n in zip(items, sizes, strict=True):
            piece = rt.slice(flat, lo, lo + n)
            out.append(rt.view(piece, np.dtype(t.dtype), tuple(t.shape)))
            lo += n
        return out

    # -- allgather and reduce_scatter ----------------------------------------------------
    @_on_gpu
    def allgather(self, tensor: Any, axis: int, opts: CommunicationOptions) -> Any:
        """The engine's allgather for a device array: NCCL when every rank has the same
        shape and ``axis`` is 0, else through pinned host memory and the host path."""
        engine = self._engine
        (x,), rt, gpu, stream = self._on_device([tensor], "allgather")
        route = self._route(opts, rt)
        shape = tuple(x.shape) or (1,)
        if route == "copy":
            copied = rt.empty(x.size, np.dtype(x.dtype), gpu)
            rt.copy(copied, rt.view(x, np.dtype(x.dtype)), stream)
            return rt.view(copied, np.dtype(x.dtype), shape)
        if route == "nccl" and axis in (0, -len(shape)) and self._same_shapes(shape, opts):
            comm = self._comm("world", gpu)
            if comm.supports(np.dtype(x.dtype)):
                text = f"allgather(axis=0, {describe_arrays([x])}, device)"
                self._agree(text, opts)
                send = rt.view(x, np.dtype(x.dtype))
                recv = rt.empty(send.size * engine.size, np.dtype(x.dtype), gpu)
                comm.allgather(send, recv, stream)
                return rt.view(recv, np.dtype(x.dtype), (shape[0] * engine.size, *shape[1:]))
        self.last_route = engine.last_device_route = "staged"
        host = self._to_pinned_copy("allgather", x, rt, stream)
        out = rt.to_device(engine.allgather(host, axis, opts), gpu, stream)
        self._released("allgather", rt, stream)
        return out

    @_on_gpu
    def reduce_scatter(self, tensor: Any, op: ReduceOp, opts: CommunicationOptions) -> Any:
        """The engine's reduce_scatter for a device array: NCCL when the rows split evenly
        (and the dtype is NCCL's), else through pinned host memory and the host path."""
        engine = self._engine
        (x,), rt, gpu, stream = self._on_device([tensor], "reduce_scatter")
        route = self._route(opts, rt)
        even = x.ndim > 0 and x.shape[0] % engine.size == 0
        dtype = np.dtype(x.dtype)
        if route == "nccl" and even and dtype.kind in "iuf":
            comm = self._comm("world", gpu)
            if comm.supports(dtype):
                text = f"reduce_scatter(op={op.name}, {describe_arrays([x])}, device)"
                self._agree(text, opts)
                send = rt.view(x, dtype)
                recv = rt.empty(send.size // engine.size, dtype, gpu)
                comm.reduce_scatter(send, recv, _wire_op(op), stream)
                if op is ReduceOp.MEAN:
                    recv = rt.divide(recv, engine.size, stream)
                block = (x.shape[0] // engine.size, *x.shape[1:])
                return rt.view(recv, np.dtype(recv.dtype), block)
        self.last_route = engine.last_device_route = "staged"
        host = self._to_pinned_copy("reduce_scatter", x, rt, stream)
        out = rt.to_device(engine.reduce_scatter(host, op, opts), gpu, stream)
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
        (both,) = self._engine.allreduce([mine], ReduceOp.MAX, CommunicationOptions(
            0, opts.timeout_seconds, CI.AUTO))
        return int(both[0]) == -int(both[1])

    def close(self) -> None:
        """Destroy the NCCL communicators and drop the pinned buffers."""
        for comm in self._nccl.values():
            comm.close()
        self._nccl.clear()
        self._pinned.clear()


def iter_bcast(flat: Any, root: int) -> Any:
    """The MPI plan of broadcasting device buffer ``flat`` (CUDA-aware MPI)."""
    from hpcdist.collectives.mpi_backend import Call

    yield Call("Bcast", (flat, root))
