"""Every argument-type signature hpcdist's host code launches its CUDA kernels with.

:func:`dispatched_signatures` calls the public host functions of
:mod:`hpcdist.kernels.cuda` and :mod:`hpcdist.kernels.optim_cuda` for every
dtype they accept, with NumPy arrays standing in for device arrays, and
records, instead of launching, ``numba.typeof`` of each kernel's arguments:
exactly the types Numba's dispatcher would compile for on a GPU (a
C-contiguous device array types as ``Array(dtype, ndim, "C")``, as the NumPy
stand-in does). :func:`compile_on_cpu` makes ``numba.cuda.compile_ptx`` work
without a GPU: numba-cuda asks the current device for its compute capability
when a kernel calls another ``@cuda.jit`` function.
"""

from __future__ import annotations

import contextlib
from collections import defaultdict
from collections.abc import Iterator
from typing import Any

import numba
import numpy as np

KERNEL_MODULES = ("hpcdist.kernels.cuda", "hpcdist.kernels.optim_cuda")
#: What the host functions accept (``_SUPPORTED_CHARS`` of the kernels; optimizers: floats).
PACK_DTYPES = [np.dtype(c) for c in "efdbhilqBHILQ"]
OPTIMIZER_DTYPES = [np.dtype(np.float32), np.dtype(np.float64)]


class _Recorder:
    """Stands in for a kernel: ``kernel[blocks, threads, stream](*args)`` records the types."""

    def __init__(self, name: str, seen: dict[str, set[tuple[Any, ...]]]) -> None:
        self.name, self._seen = name, seen

    def __getitem__(self, config: Any) -> Any:
        def launch(*args: Any) -> None:
            self._seen[self.name].add(tuple(numba.typeof(a) for a in args))

        return launch


class _HostResult(np.ndarray):
    """A host array with the one device-array method ``sum_squares`` calls."""

    def copy_to_host(self, stream: Any = None) -> np.ndarray:
        return np.asarray(self)


@contextlib.contextmanager
def _recording(seen: dict[str, set[tuple[Any, ...]]]) -> Iterator[None]:
    from hpcdist.kernels import cuda as kc  # lazy: imports numba.cuda
    from hpcdist.kernels import optim_cuda as ko  # lazy: imports numba.cuda

    patches: list[tuple[Any, str, Any]] = []
    for module in (kc, ko):
        for name in kernel_names(module):
            patches.append((module, name, _Recorder(f"{module.__name__}.{name}", seen)))
    host = {
        "_is_device_array": lambda x: isinstance(x, np.ndarray),
        "as_device": lambda x, what: x if isinstance(x, np.ndarray) else kc.as_device(x, what),
        "_address": lambda x: int(x.__array_interface__["data"][0]),
        "is_c_contiguous": lambda x: bool(x.flags.c_contiguous),
        "_upload": lambda host_array, stream, cupy_owned: host_array,
        "_TABLES": type(kc._TABLES)(),
    }
    patches += [(kc, name, value) for name, value in host.items()]
    patches += [(ko, "as_device", host["as_device"]), (ko, "is_c_contiguous",
                                                         host["is_c_contiguous"])]
    fake_cuda = _CudaProxy(ko.cuda)
    patches.append((ko, "cuda", fake_cuda))
    saved = [(m, n, getattr(m, n)) for m, n, _ in patches]
    try:
        for module, name, value in patches:
            setattr(module, name, value)
        yield
    finally:
        for module, name, value in saved:
            setattr(module, name, value)


class _CudaProxy:
    """``numba.cuda`` with ``to_device`` giving host arrays (for ``sum_squares``)."""

    def __init__(self, real: Any) -> None:
        self._real = real

    def to_device(self, host: np.ndarray, stream: Any = 0) -> np.ndarray:
        return np.array(host).view(_HostResult)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)


def kernel_names(module: Any) -> list[str]:
    """The names of the module's ``@cuda.jit`` kernels (dispatchers, not device functions)."""
    from numba.cuda.dispatcher import CUDADispatcher  # lazy: numba.cuda

    return sorted(
        name for name, value in vars(module).items()
        if isinstance(value, CUDADispatcher) and not value.targetoptions.get("device", False)
    )


def _reduce_calls(kc: Any, dtype: np.dtype) -> None:
    from hpcdist.kernels import MAX, MEAN, MIN, SUM

    rows = np.zeros((3, 8), dtype)
    strided = np.zeros((3, 16), dtype)[:, :8]  # rows of a wider window: layout "A"
    for slots in (rows, strided):
        for op in (SUM, MIN, MAX):
            kc.reduce_slots_cuda(slots, 0, 8, slots[2], 0, op, 1, stream=1)
            kc.reduce_slots_cuda(slots, 0, 8, np.zeros(8, dtype), 0, op, 1, stream=1)
        if dtype.kind == "f":
            kc.reduce_slots_cuda(slots, 0, 8, np.zeros(8, dtype), 0, MEAN, 3, stream=1)


def _optimizer_calls(ko: Any, dtype: np.dtype) -> None:
    def z() -> np.ndarray:
        return np.zeros(8, dtype)

    p, g = z(), z()
    ko.sgd(p, p, g, [0.1, 0.0], stream=1)
    for nesterov in (False, True):
        ko.momentum(p, p, g, z(), [0.1, 0.9, 0.0], nesterov=nesterov, stream=1)
    ko.adam(p, p, g, z(), z(), None, [1e-3, 0.9, 0.999, 1e-7, 0.0], stream=1)
    ko.adam(p, p, g, z(), z(), z(), [1e-3, 0.9, 0.999, 1e-7, 0.0], stream=1)
    ko.rmsprop(p, p, g, z(), None, None, [1e-3, 0.9, 0.0, 1e-7, 0.0], stream=1)
    ko.rmsprop(p, p, g, z(), z(), z(), [1e-3, 0.9, 0.5, 1e-7, 0.0], stream=1)
    ko.adagrad(p, p, g, z(), [1e-3, 1e-7, 0.0], stream=1)
    ko.nadam(p, p, g, z(), z(), [1e-3, 0.9, 0.999, 1e-7, 0.5, 0.5, 0.5, 0.0], stream=1)
    ko.sum_squares(g, stream=1)
    ko.scale(g, 0.5, stream=1)
    ko.clip_values(g, 1.0, stream=1)


def dispatched_signatures() -> dict[str, set[tuple[Any, ...]]]:
    """``{"module.kernel": {argument types, ...}}`` over every dtype the host code accepts."""
    from hpcdist.kernels import cuda as kc  # lazy: imports numba.cuda
    from hpcdist.kernels import optim_cuda as ko  # lazy: imports numba.cuda

    seen: dict[str, set[tuple[Any, ...]]] = defaultdict(set)
    with _recording(seen):
        for dtype in PACK_DTYPES:
            tensors = [np.zeros(n, dtype) for n in (3, 5)]
            flat = np.zeros(8, dtype)
            scales = [None, 0.5] if dtype.kind == "f" else [None]
            for scale in scales:
                kc.pack_cuda(tensors, flat, scale=scale, stream=1)
                kc.unpack_cuda(flat, tensors, scale=scale, stream=1)
            _reduce_calls(kc, dtype)
        for dtype in OPTIMIZER_DTYPES:
            _optimizer_calls(ko, dtype)
    return dict(seen)


@contextlib.contextmanager
def compile_on_cpu(cc: tuple[int, int] = (9, 0)) -> Iterator[None]:
    """Let ``compile_ptx`` run without a GPU: the current device is a stand-in of ``cc``.

    numba-cuda's dispatcher imports ``get_current_device`` by name from
    ``numba.cuda.api``; both names are replaced while the block runs.
    """
    import numba.cuda.api  # lazy: numba.cuda
    import numba.cuda.dispatcher  # lazy: numba.cuda

    class _Device:
        compute_capability = cc

    saved = [(m, m.get_current_device) for m in (numba.cuda.api, numba.cuda.dispatcher)]
    try:
        for module, _ in saved:
            module.get_current_device = lambda: _Device()
        yield
    finally:
        for module, real in saved:
            module.get_current_device = real
