"""A fake GPU array: host memory behind ``__cuda_array_interface__``, for tests without a GPU.

:class:`FakeGpuArray` looks to hpcdist like a device array (it has
``__cuda_array_interface__``, no ``__array_interface__`` and no buffer
protocol, and refuses implicit conversion to NumPy, as CuPy does), so the
collectives take their device path. Its memory is an ordinary NumPy buffer,
so :class:`FakeRuntime` (registered for it on import) copies with
``ctypes.memmove`` and MPI may read it when told that MPI is CUDA-aware.

:class:`FakeRuntime` counts what it is asked to do (``calls``), so tests can
check that staging happened and that work went to the right stream.

Example:
    >>> import numpy as np
    >>> x = FakeGpuArray.from_host(np.arange(3.0))
    >>> x.get()
    array([0., 1., 2.])
"""

from __future__ import annotations

import ctypes
from collections import Counter
from collections.abc import Sequence
from typing import Any

import numpy as np

from hpcdist.runtime.device import DeviceRuntime, device_pointer, register_runtime


class FakeGpuArray:
    """A device array whose memory is a hidden NumPy array (``device`` is a fake ordinal)."""

    def __init__(self, host: np.ndarray, device: int = 0) -> None:
        self._host = host
        self.device_index = device

    @classmethod
    def from_host(cls, array: Any, device: int = 0) -> FakeGpuArray:
        """A fake device copy of ``array``."""
        return cls(np.array(array, copy=True), device)

    @property
    def __cuda_array_interface__(self) -> dict[str, Any]:
        h = self._host
        strides = None if h.flags.c_contiguous else h.strides
        return {
            "shape": h.shape,
            "typestr": h.dtype.str,
            "data": (h.ctypes.data if h.size else 0, False),
            "version": 3,
            "strides": strides,
            "stream": None,
        }

    shape = property(lambda self: self._host.shape)
    dtype = property(lambda self: self._host.dtype)
    size = property(lambda self: self._host.size)
    ndim = property(lambda self: self._host.ndim)
    nbytes = property(lambda self: self._host.nbytes)

    def __array__(self, *args: Any, **kwargs: Any) -> np.ndarray:
        raise TypeError("implicit conversion of a FakeGpuArray to NumPy; call .get()")

    def __len__(self) -> int:
        return len(self._host)

    def __getitem__(self, key: Any) -> FakeGpuArray:
        return FakeGpuArray(self._host[key], self.device_index)

    def __setitem__(self, key: Any, value: Any) -> None:
        self._host[key] = value.get() if isinstance(value, FakeGpuArray) else value

    def reshape(self, *shape: Any) -> FakeGpuArray:
        return FakeGpuArray(self._host.reshape(*shape), self.device_index)

    def view(self, dtype: Any) -> FakeGpuArray:
        return FakeGpuArray(self._host.view(dtype), self.device_index)

    def astype(self, dtype: Any) -> FakeGpuArray:
        return FakeGpuArray(self._host.astype(dtype), self.device_index)

    def copy(self) -> FakeGpuArray:
        return FakeGpuArray(self._host.copy(), self.device_index)

    @property
    def T(self) -> FakeGpuArray:  # noqa: N802 - NumPy's name
        return FakeGpuArray(self._host.T, self.device_index)

    def get(self) -> np.ndarray:
        """A host copy (CuPy's name)."""
        return self._host.copy()

    def __repr__(self) -> str:
        return f"FakeGpuArray({self._host!r}, device={self.device_index})"


def _host_view(x: Any) -> np.ndarray:
    """The hidden host array of ``x`` (a FakeGpuArray), checked against its pointer."""
    if not isinstance(x, FakeGpuArray):
        raise TypeError(f"the fake runtime got {type(x).__name__}; expected a FakeGpuArray")
    return x._host


class FakeRuntime(DeviceRuntime):
    """The :class:`~hpcdist.runtime.device.DeviceRuntime` of :class:`FakeGpuArray`.

    Work is done at once (a stream is only a number); ``calls`` counts each
    method and ``streams`` the streams that work was enqueued on.
    """

    name = "fake"

    def __init__(self) -> None:
        self.calls: Counter[str] = Counter()
        self.streams: Counter[int] = Counter()
        self.stream_handle = 7  # what current_stream returns

    def _count(self, name: str, stream: int | None = None) -> None:
        self.calls[name] += 1
        if stream is not None:
            self.streams[stream] += 1

    def device_id(self, x: Any) -> int:
        return int(x.device_index)

    def current_stream(self, device: int) -> int:
        self._count("current_stream")
        return self.stream_handle

    def empty(self, count: int, dtype: np.dtype, device: int) -> FakeGpuArray:
        self._count("empty")
        return FakeGpuArray(_garbage(int(count), np.dtype(dtype)), device)

    def view(self, x: Any, dtype: np.dtype, shape: tuple[int, ...] | None = None) -> FakeGpuArray:
        flat = _host_view(x).reshape(-1).view(dtype)
        return FakeGpuArray(flat if shape is None else flat.reshape(shape), x.device_index)

    def slice(self, flat: Any, lo: int, hi: int) -> FakeGpuArray:
        return FakeGpuArray(_host_view(flat)[lo:hi], flat.device_index)

    def pack(self, tensors: Sequence[Any], flat: Any, stream: int) -> None:
        self._count("pack", stream)
        dst = device_pointer(flat)
        for t in tensors:
            n = _host_view(t).nbytes
            if n:
                ctypes.memmove(dst, device_pointer(t), n)
            dst += n

    def copy(self, dst: Any, src: Any, stream: int) -> None:
        self._count("copy", stream)
        if _host_view(src).nbytes:
            ctypes.memmove(device_pointer(dst), device_pointer(src), _host_view(src).nbytes)

    def to_host(self, dst: np.ndarray, src: Any, stream: int) -> None:
        self._count("to_host", stream)
        if dst.nbytes != _host_view(src).nbytes:
            raise ValueError(f"to_host: {dst.nbytes} != {_host_view(src).nbytes} bytes")
        if dst.nbytes:
            ctypes.memmove(dst.ctypes.data, device_pointer(src), dst.nbytes)

    def from_host(self, dst: Any, src: np.ndarray, stream: int) -> None:
        self._count("from_host", stream)
        if src.nbytes != _host_view(dst).nbytes:
            raise ValueError(f"from_host: {src.nbytes} != {_host_view(dst).nbytes} bytes")
        if src.nbytes:
            ctypes.memmove(device_pointer(dst), src.ctypes.data, src.nbytes)

    def divide(self, flat: Any, divisor: int, stream: int) -> FakeGpuArray:
        self._count("divide", stream)
        h = _host_view(flat)
        if h.dtype.kind == "f":
            np.divide(h, h.dtype.type(divisor), out=h)
            return flat
        return FakeGpuArray(h.astype(np.float64) / divisor, flat.device_index)

    def astype(self, x: Any, dtype: np.dtype, stream: int) -> FakeGpuArray:
        self._count("astype", stream)
        return FakeGpuArray(_host_view(x).astype(dtype), x.device_index)

    def synchronize(self, stream: int) -> None:
        self._count("synchronize", stream)

    def record(self, stream: int) -> Any:
        self._count("record", stream)
        return ("event", stream)

    def wait(self, stream: int, event: Any) -> None:
        self._count("wait", stream)

    def pinned(self, nbytes: int) -> np.ndarray:
        self._count("pinned")
        return np.empty(int(nbytes), np.uint8)


def _garbage(count: int, dtype: np.dtype) -> np.ndarray:
    """Uninitialised-looking memory: a fixed byte pattern, so unwritten results show."""
    raw = np.full(count * dtype.itemsize, 0xA5, np.uint8)
    return raw.view(dtype)


RUNTIME = FakeRuntime()
register_runtime(FakeGpuArray, RUNTIME)


def fake(array: Any, device: int = 0) -> FakeGpuArray:
    """A fake GPU copy of ``array`` (shorthand for :meth:`FakeGpuArray.from_host`)."""
    return FakeGpuArray.from_host(array, device)
