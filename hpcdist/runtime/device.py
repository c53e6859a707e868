"""Device memory: how the collectives move the bytes of GPU arrays.

A *device array* is any object with ``__cuda_array_interface__`` that is not a
NumPy array: CuPy arrays, Numba device arrays, and in tests a fake GPU array
whose memory is really on the host. The collectives never touch such memory
with NumPy; they ask the array's :class:`DeviceRuntime` to allocate, copy,
pack and synchronise, always on an explicit stream.

* :class:`CupyRuntime` serves CuPy arrays (CuPy is imported on first use).
* :func:`register_runtime` adds a runtime for another array type (the test
  suite registers one for its fake GPU array).
* :func:`runtime_for` finds the runtime of an array.

Stream rule (what the collectives rely on): every operation is enqueued on the
stream it is given, in call order; ``synchronize(stream)`` waits on the host
until all of them are done. Copies from and to *pinned* host memory
(:meth:`DeviceRuntime.pinned`) are asynchronous.

Example:
    >>> import numpy as np
    >>> is_device_array(np.ones(2))
    False
"""

from __future__ import annotations

import contextlib
import math
import socket
from collections.abc import Sequence
from typing import Any

import numpy as np

from hpcdist.arrays import is_c_contiguous_device as is_c_contiguous
from hpcdist.errors import DeviceArrayError


def is_device_array(x: Any) -> bool:
    """Whether ``x`` exposes ``__cuda_array_interface__`` (and is not a NumPy array).

    Example: ``is_device_array(cupy.ones(2))`` is ``True``, ``is_device_array(np.ones(2))`` False.
    """
    return not isinstance(x, np.ndarray) and hasattr(type(x), "__cuda_array_interface__")


def device_pointer(x: Any) -> int:
    """The data pointer of a device array (from ``__cuda_array_interface__``).

    Example: ``device_pointer(a) == a.data.ptr`` for a CuPy array ``a``.
    """
    return int(x.__cuda_array_interface__["data"][0])


class DeviceRuntime:
    """What the collectives need from one kind of device array (override every method).

    ``stream`` arguments are opaque handles from :meth:`current_stream`
    (for CuPy the stream's ``ptr``). Methods that write device memory only
    enqueue work; :meth:`synchronize` waits for it.

    Example: ``rt = runtime_for(x); flat = rt.empty(n, np.float32, rt.device_id(x))``.
    """

    name = "device"

    def device_id(self, x: Any) -> int:
        """The ordinal of the GPU that holds ``x``."""
        raise NotImplementedError

    def current_stream(self, device: int) -> int:
        """The stream the caller's work runs on for ``device`` (work is enqueued there)."""
        raise NotImplementedError

    def empty(self, count: int, dtype: np.dtype, device: int) -> Any:
        """A new uninitialised 1-D device array of ``count`` elements on ``device``."""
        raise NotImplementedError

    def view(self, x: Any, dtype: np.dtype, shape: tuple[int, ...] | None = None) -> Any:
        """A view of contiguous ``x`` reinterpreted as ``dtype`` (1-D, or ``shape``)."""
        raise NotImplementedError

    def slice(self, flat: Any, lo: int, hi: int) -> Any:
        """The view ``flat[lo:hi]`` of a 1-D device array."""
        raise NotImplementedError

    def pack(self, tensors: Sequence[Any], flat: Any, stream: int) -> None:
        """Copy contiguous same-dtype ``tensors`` one after another into ``flat``."""
        raise NotImplementedError

    def copy(self, dst: Any, src: Any, stream: int) -> None:
        """Copy the bytes of device array ``src`` into device array ``dst`` (same nbytes)."""
        raise NotImplementedError

    def to_host(self, dst: np.ndarray, src: Any, stream: int) -> None:
        """Enqueue the copy of device array ``src`` into host array ``dst`` (same nbytes)."""
        raise NotImplementedError

    def from_host(self, dst: Any, src: np.ndarray, stream: int) -> None:
        """Enqueue the copy of host array ``src`` into device array ``dst`` (same nbytes)."""
        raise NotImplementedError

    def divide(self, flat: Any, divisor: int, stream: int) -> Any:
        """``flat / divisor``: in place for floats, a new float64 array for integers."""
        raise NotImplementedError

    def astype(self, x: Any, dtype: np.dtype, stream: int) -> Any:
        """A new device array of ``x`` converted to ``dtype``."""
        raise NotImplementedError

    def synchronize(self, stream: int) -> None:
        """Wait on the host until all work enqueued on ``stream`` has finished."""
        raise NotImplementedError

    def record(self, stream: int) -> Any:
        """An event marking the work enqueued on ``stream`` so far."""
        raise NotImplementedError

    def wait(self, stream: int, event: Any) -> None:
        """Make later work on ``stream`` wait for ``event`` (no host wait)."""
        raise NotImplementedError

    def pinned(self, nbytes: int) -> np.ndarray:
        """A page-locked host buffer of ``nbytes`` (uint8) for asynchronous copies."""
        raise NotImplementedError

    def activate(self, device: int) -> contextlib.AbstractContextManager[Any]:
        """A context in which ``device`` is the current GPU (events, default streams)."""
        return contextlib.nullcontext()

    def device_identity(self, device: int | None = None) -> str | None:
        """A name of the physical GPU ``device`` (None: the current one) that is the same in
        every process using it, e.g. its UUID; ``None`` when unknown (never matches)."""
        return None

    def to_device(self, host: np.ndarray, device: int, stream: int) -> Any:
        """A new device array holding a copy of ``host`` (its shape and dtype)."""
        flat = self.empty(host.size, host.dtype, device)
        self.from_host(flat, np.ascontiguousarray(host).reshape(-1), stream)
        return self.view(flat, host.dtype, host.shape)


class CupyRuntime(DeviceRuntime):
    """:class:`DeviceRuntime` for CuPy arrays; packing uses hpcdist's Numba CUDA kernel
    (one copy per tensor where numba-cuda cannot launch kernels).

    Example: ``runtime_for(cupy.ones(3))`` is the process's ``CupyRuntime``.
    """

    name = "cupy"

    def __init__(self) -> None:
        import cupy  # lazy: optional GPU dependency (CuPy)

        self._cp = cupy
        self._streams: dict[int, Any] = {}
        self._numba_ok: bool | None = None

    def _stream(self, handle: int) -> Any:
        stream = self._streams.get(handle)
        if stream is None:
            stream = self._streams[handle] = self._cp.cuda.ExternalStream(handle)
        return stream

    def device_id(self, x: Any) -> int:
        return int(x.device.id)

    def activate(self, device: int) -> contextlib.AbstractContextManager[Any]:
        return self._cp.cuda.Device(device)

    def device_identity(self, device: int | None = None) -> str | None:
        return device_identity(self._cp.cuda.Device().id if device is None else device)

    def current_stream(self, device: int) -> int:
        with self._cp.cuda.Device(device):
            return int(self._cp.cuda.get_current_stream().ptr)

    def empty(self, count: int, dtype: np.dtype, device: int) -> Any:
        with self._cp.cuda.Device(device):
            return self._cp.empty(int(count), dtype=dtype)

    def view(self, x: Any, dtype: np.dtype, shape: tuple[int, ...] | None = None) -> Any:
        flat = x.reshape(-1).view(dtype)
        return flat if shape is None else flat.reshape(shape)

    def slice(self, flat: Any, lo: int, hi: int) -> Any:
        return flat[lo:hi]

    def pack(self, tensors: Sequence[Any], flat: Any, stream: int) -> None:
        if len(tensors) == 1 or not self._numba_cuda():
            lo = 0  # one copy per tensor (also where Numba cannot launch kernels)
            for t in tensors:
                self.copy(flat[lo : lo + t.size], t, stream)
                lo += t.size
            return
        from numba import cuda  # lazy: optional GPU dependency (numba.cuda)

        from hpcdist.kernels.cuda import pack_cuda  # lazy: optional GPU dependency (numba.cuda)

        # one launch; the bucket's table is built (in CuPy's pool) once per layout
        with self._cp.cuda.Device(flat.device.id):
            pack_cuda([t.reshape(-1) for t in tensors], flat, stream=cuda.external_stream(stream))

    def _numba_cuda(self) -> bool:
        """Whether Numba can launch CUDA kernels here (numba-cuda with its CUDA extra)."""
        if self._numba_ok is None:
            try:
                from numba import cuda  # lazy: optional GPU dependency (numba.cuda)

                self._numba_ok = bool(cuda.is_available())
            except Exception:  # noqa: BLE001 - numba.cuda unusable: per-tensor copies work
                self._numba_ok = False
        return self._numba_ok

    def copy(self, dst: Any, src: Any, stream: int) -> None:
        self._cp.cuda.runtime.memcpyAsync(
            dst.data.ptr, src.data.ptr, src.nbytes, self._cp.cuda.runtime.memcpyDeviceToDevice,
            stream,
        )

    def to_host(self, dst: np.ndarray, src: Any, stream: int) -> None:
        self._cp.cuda.runtime.memcpyAsync(
            dst.ctypes.data, src.data.ptr, src.nbytes, self._cp.cuda.runtime.memcpyDeviceToHost,
            stream,
        )

    def from_host(self, dst: Any, src: np.ndarray, stream: int) -> None:
        self._cp.cuda.runtime.memcpyAsync(
            dst.data.ptr, src.ctypes.data, src.nbytes, self._cp.cuda.runtime.memcpyHostToDevice,
            stream,
        )

    def divide(self, flat: Any, divisor: int, stream: int) -> Any:
        with self._cp.cuda.Device(flat.device.id), self._stream(stream):
            if flat.dtype.kind == "f":
                flat /= flat.dtype.type(divisor)
                return flat
            return flat.astype(np.float64) / divisor

    def astype(self, x: Any, dtype: np.dtype, stream: int) -> Any:
        with self._cp.cuda.Device(x.device.id), self._stream(stream):
            return x.astype(dtype)

    def synchronize(self, stream: int) -> None:
        self._cp.cuda.runtime.streamSynchronize(stream)

    def record(self, stream: int) -> Any:
        event = self._cp.cuda.Event(block=False, disable_timing=True)
        event.record(self._stream(stream))
        return event

    def wait(self, stream: int, event: Any) -> None:
        self._stream(stream).wait_event(event)

    def pinned(self, nbytes: int) -> np.ndarray:
        memory = self._cp.cuda.alloc_pinned_memory(max(1, int(nbytes)))
        return np.frombuffer(memory, np.uint8, max(1, int(nbytes)))[: int(nbytes)]


def device_identity(device: int) -> str | None:
    """The UUID of CUDA device ``device`` as CuPy reports it (else its PCI bus id on this
    host): the same in every process that uses that GPU, whatever CUDA_VISIBLE_DEVICES
    numbers it. ``None`` when CuPy cannot tell (no CuPy, no driver).

    Example: two ranks bound to one GPU get equal strings.
    """
    try:
        import cupy  # lazy: optional GPU dependency (CuPy)

        uuid = cupy.cuda.runtime.getDeviceProperties(device).get("uuid")
        if uuid:
            return bytes(uuid).hex() if isinstance(uuid, bytes | bytearray) else str(uuid)
        bus = cupy.cuda.runtime.deviceGetPCIBusId(device)
    except Exception:  # noqa: BLE001 - unknown: the caller treats it as a GPU of its own
        return None
    return f"{socket.gethostname()}/{bus}"


_RUNTIMES: dict[type, DeviceRuntime] = {}


def register_runtime(array_type: type, runtime: DeviceRuntime) -> None:
    """Use ``runtime`` for arrays of exactly ``array_type``.

    Example: ``register_runtime(MyGpuArray, MyRuntime())``.
    """
    if not isinstance(runtime, DeviceRuntime):
        raise TypeError(f"runtime must be a DeviceRuntime; got {type(runtime).__name__}")
    _RUNTIMES[array_type] = runtime


def runtime_for(x: Any) -> DeviceRuntime:
    """The :class:`DeviceRuntime` of device array ``x``.

    Example: ``runtime_for(cupy.zeros(1)).name == "cupy"``.
    """
    kind = type(x)
    runtime = _RUNTIMES.get(kind)
    if runtime is not None:
        return runtime
    if kind.__module__.split(".", 1)[0] == "cupy":
        runtime = _RUNTIMES[kind] = CupyRuntime()
        return runtime
    raise DeviceArrayError(
        f"{kind.__module__}.{kind.__name__} exposes __cuda_array_interface__ but hpcdist has no "
        "device runtime for it; pass CuPy arrays (cupy.asarray(x) wraps it without a copy), or "
        "register one with hpcdist.runtime.device.register_runtime"
    )


def device_arrays(tensors: Sequence[Any], operation: str) -> tuple[DeviceRuntime, int]:
    """The runtime and GPU of ``tensors`` (all device arrays of one runtime and one GPU).

    Raises :class:`DeviceArrayError` for mixed kinds or GPUs and strided arrays.
    """
    runtime = runtime_for(tensors[0])
    device = runtime.device_id(tensors[0])
    for i, t in enumerate(tensors):
        if not is_device_array(t) or runtime_for(t) is not runtime:
            raise DeviceArrayError(
                f"{operation}: tensor {i} is {type(t).__name__} but tensor 0 is "
                f"{type(tensors[0]).__name__}; pass arrays of one kind (move host arrays to the "
                "GPU first)"
            )
        if runtime.device_id(t) != device:
            raise DeviceArrayError(
                f"{operation}: tensor {i} is on GPU {runtime.device_id(t)} but tensor 0 is on "
                f"GPU {device}; one call reduces the arrays of one GPU"
            )
        if not is_c_contiguous(t):
            raise DeviceArrayError(
                f"{operation}: tensor {i} of shape {tuple(t.shape)} is not C-contiguous; pass "
                "a contiguous copy (cupy.ascontiguousarray)"
            )
    return runtime, device


def nbytes_of(x: Any) -> int:
    """Bytes of a device array, from its interface.

    Example: ``nbytes_of(cupy.zeros(4, cupy.float32)) == 16``.
    """
    cai = x.__cuda_array_interface__
    return math.prod(cai["shape"]) * np.dtype(cai["typestr"]).itemsize


__all__ = [
    "CupyRuntime",
    "DeviceArrayError",
    "DeviceRuntime",
    "device_arrays",
    "device_identity",
    "device_pointer",
    "is_c_contiguous",
    "is_device_array",
    "nbytes_of",
    "register_runtime",
    "runtime_for",
]
