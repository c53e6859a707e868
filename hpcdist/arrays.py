"""The one place that tells NumPy arrays from CuPy arrays.

Everything else asks this module: :func:`array_module` gives ``numpy`` or
``cupy`` for an array, :func:`to_host` brings any array to NumPy and
:func:`to_device` places a copy on a CPU or GPU device. CuPy is imported only
when a CuPy array or a GPU device is met, so a CPU-only install never needs it.

Example:
    >>> import numpy as np
    >>> array_module(np.ones(2)).__name__
    'numpy'
    >>> to_device([1.0, 2.0], "CPU", 0)
    array([1., 2.])
"""

from __future__ import annotations

import sys
from types import ModuleType
from typing import Any

import ml_dtypes
import numpy as np

from hpcdist.errors import ArrayInteropError

#: ``ml_dtypes.bfloat16`` as a NumPy dtype: the type JAX and TensorFlow use, and
#: hpcdist's for bfloat16 data (torch bf16 tensors arrive as arrays of it).
BFLOAT16 = np.dtype(ml_dtypes.bfloat16)


def is_floating(dtype: Any) -> bool:
    """Whether ``dtype`` is a real floating dtype: float16/32/64 or bfloat16.

    ``np.issubdtype`` says no for bfloat16 (an ``ml_dtypes`` type); ask here.
    Example: ``is_floating(BFLOAT16)`` and ``is_floating(np.float32)`` are ``True``.
    """
    dtype = np.dtype(dtype)
    return dtype.kind == "f" or dtype == BFLOAT16


def is_cupy(x: Any) -> bool:
    """Whether ``x`` is a CuPy array (checked without importing CuPy)."""
    return type(x).__module__.split(".", 1)[0] == "cupy"


def is_c_contiguous_device(x: Any) -> bool:
    """Whether an array with ``__cuda_array_interface__`` is C-contiguous (its ``strides``
    absent, or those of a C-ordered array; extents of 1 may have any stride)."""
    cai = x.__cuda_array_interface__
    strides = cai.get("strides")
    if strides is None:
        return True
    expected = np.dtype(cai["typestr"]).itemsize
    for extent, stride in zip(reversed(cai["shape"]), reversed(strides), strict=True):
        if extent > 1 and stride != expected:
            return False
        expected *= extent
    return True


def is_array(x: Any) -> bool:
    """Whether ``x`` is a NumPy array, NumPy scalar or CuPy array.

    Example: ``is_array(np.float32(1))`` is ``True``, ``is_array(1.0)`` is ``False``.
    """
    return isinstance(x, (np.ndarray, np.generic)) or is_cupy(x)


def array_module(x: Any) -> ModuleType:
    """``cupy`` for a CuPy array, else ``numpy``.

    Example: ``xp = array_module(x); xp.zeros_like(x)``.
    """
    if is_cupy(x):
        import cupy  # lazy: optional GPU dependency (CuPy)

        return cupy
    return np


def asarray(x: Any) -> Any:
    """``x`` as an array: arrays are returned as they are, anything else through NumPy.

    Example: ``asarray(3.0)`` is a 0-d float64 array.
    """
    if is_cupy(x) or isinstance(x, np.ndarray):
        return x
    return np.asarray(x)


def to_host(x: Any) -> np.ndarray:
    """A NumPy view or copy of ``x`` (a device-to-host copy for CuPy arrays).

    Example: ``to_host(cupy.ones(3))`` is ``array([1., 1., 1.])``.
    """
    if is_cupy(x):
        return x.get()
    return np.asarray(x)


def device_of(x: Any) -> tuple[str, int]:
    """``("GPU", ordinal)`` for a CuPy array, ``("CPU", 0)`` for anything else.

    Example: ``device_of(np.ones(1)) == ("CPU", 0)``.
    """
    if is_cupy(x):
        return "GPU", int(x.device.id)
    return "CPU", 0


def to_device(x: Any, device_type: str, index: int = 0, copy: bool = True) -> Any:
    """``x`` on the device ``device_type:index`` (``"CPU"`` or ``"GPU"``).

    A CPU device gives a NumPy array, a GPU device a CuPy array on that GPU.
    With ``copy=True`` (the default) the result never shares memory with
    ``x``, so replicas never see each other's writes.

    Example: ``to_device(np.ones(2), "CPU")`` is a new NumPy array.
    """
    kind = device_type.upper()
    if kind == "CPU":
        host = to_host(x)
        return np.array(host, copy=True) if copy else host
    if kind == "GPU":
        import cupy  # lazy: optional GPU dependency (CuPy)

        with cupy.cuda.Device(index):
            if copy or not is_cupy(x) or int(x.device.id) != index:
                return cupy.array(x, copy=True)
            return x
    raise ValueError(f"device type is {device_type!r}; expected 'CPU' or 'GPU'")


def copy(x: Any) -> Any:
    """A copy of the array ``x`` on the device it is on.

    Example: ``copy(a) is not a`` and ``(copy(a) == a).all()``.
    """
    return array_module(x).array(x, copy=True)


def as_result(x: Any) -> Any:
    """A 0-d NumPy array as a NumPy scalar; anything else unchanged.

    Reductions of scalars then print as numbers (``3.0``, not ``array(3.)``).

    Example: ``as_result(np.asarray(3.0))`` is ``np.float64(3.0)``.
    """
    if isinstance(x, np.ndarray) and x.ndim == 0:
        return x[()]
    return x


# -- arrays of other frameworks ------------------------------------------------------
#
# PyTorch tensors, JAX arrays, TensorFlow tensors and any object speaking DLPack,
# ``__array_interface__`` or ``__cuda_array_interface__`` enter hpcdist here:
# :func:`import_array` gives a NumPy (CPU) or CuPy (GPU) view of the same memory,
# :func:`export_like` turns a result back into the caller's type on the caller's
# device. The frameworks are never imported by hpcdist: an object of theirs
# exists only once the user imported them, so the lookups below are free.

_FRAMEWORKS = ("torch", "jax", "jaxlib", "tensorflow")


def _framework(x: Any) -> str:
    """The framework ``x`` belongs to (``"torch"``, ``"jax"``, ``"tensorflow"``), else ``""``."""
    root = type(x).__module__.split(".", 1)[0]
    if root not in _FRAMEWORKS:
        return ""

    if root == "torch":
        return "torch" if isinstance(x, sys.modules["torch"].Tensor) else ""
    if root in ("jax", "jaxlib"):
        jax = sys.modules.get("jax")
        return "jax" if jax is not None and isinstance(x, jax.Array) else ""
    tf = sys.modules["tensorflow"]
    return "tensorflow" if tf.is_tensor(x) or isinstance(x, tf.Variable) else ""


def is_foreign(x: Any) -> bool:
    """Whether ``x`` is an array of another framework that hpcdist converts at its boundary.

    True for PyTorch tensors, JAX arrays, TensorFlow tensors and variables,
    and any other object with ``__dlpack__`` or ``__array_interface__``; false
    for NumPy and CuPy arrays, plain values, and other objects with
    ``__cuda_array_interface__`` (Numba device arrays and the like), which the
    engine's device path takes as they are (:mod:`hpcdist.runtime.device`).

    Example: ``is_foreign(np.ones(2))`` is ``False``; ``is_foreign(torch.ones(2))`` is ``True``.
    """
    if isinstance(x, (np.ndarray, np.generic)) or is_cupy(x) or x is None:
        return False
    if _framework(x):
        return True
    if isinstance(x, (int, float, complex, str, bytes, list, tuple, dict)):
        return False
    if hasattr(x, "__cuda_array_interface__"):
        return False  # a device array: the engine's device path takes it as it is
    return hasattr(x, "__array_interface__") or hasattr(x, "__dlpack__")


def has_foreign(items: Any) -> bool:
    """Whether ``items`` (a list of arrays, or one array) holds an array of another framework.

    Example: ``has_foreign([np.ones(1), torch.ones(1)])`` is ``True``.
    """
    if isinstance(items, (list, tuple)):
        return any(is_foreign(x) for x in items)
    return is_foreign(items)


def _error(what: str, found: str, fix: str) -> Exception:
    return ArrayInteropError(f"hpcdist cannot take {what}: found {found}. {fix}")


def import_array(x: Any) -> Any:
    """A NumPy (CPU) or CuPy (GPU) view of ``x``'s memory; NumPy, CuPy and plain values as they are.

    Raises :class:`~hpcdist.errors.ArrayInteropError` for a tensor that
    requires grad, a non-contiguous view, dtypes the engine lacks (bfloat16
    on a GPU among them), or a GPU tensor on another GPU than the current one.
    bfloat16 on the CPU arrives as a view of dtype :data:`BFLOAT16` (torch:
    the memory reinterpreted, since DLPack and NumPy cannot carry the type).

    Example: ``import_array(torch.ones(3)).ctypes.data == t.data_ptr()`` (no copy).
    """
    kind = _framework(x)
    if kind == "torch":
        return _from_torch(x)
    if kind == "jax":
        return _from_jax(x)
    if kind == "tensorflow":
        return _from_tensorflow(x)
    if not is_foreign(x):
        return x
    if hasattr(x, "__array_interface__"):
        return np.asarray(x)
    device_type = x.__dlpack_device__()[0] if hasattr(x, "__dlpack_device__") else 1
    if device_type == 1:  # kDLCPU
        return np.from_dlpack(x)
    import cupy  # lazy: optional GPU dependency (CuPy)

    return cupy.from_dlpack(x)


def _from_torch(t: Any) -> Any:
    import torch  # lazy: optional framework (PyTorch)

    if t.requires_grad:
        raise _error(
            "a tensor that requires grad",
            f"a {tuple(t.shape)} tensor with requires_grad=True",
            "Pass tensor.detach() (shares memory); to reduce gradients use "
            "hpcdist.torch.DistributedOptimizer",
        )
    if t.layout is not torch.strided:
        raise _error("a sparse tensor", f"layout {t.layout}", "Pass tensor.to_dense()")
    if not t.is_contiguous():
        raise _error(
            "a non-contiguous view",
            f"shape {tuple(t.shape)} with strides {t.stride()}",
            "Pass tensor.contiguous() (a copy) so results cannot land in the wrong elements",
        )
    if t.is_conj() or t.is_neg():
        t = t.resolve_conj().resolve_neg()
    if t.dtype is torch.bfloat16:
        if t.device.type != "cpu":
            raise _error(
                "bfloat16 on a GPU (CuPy has no bfloat16 type)",
                f"a torch.bfloat16 tensor on {t.device}",
                "Reduce it on the CPU, or in float32 (tensor.float()) on the GPU",
            )
        return t.view(torch.int16).numpy().view(BFLOAT16)  # the same memory, retyped
    if t.device.type == "cpu":
        try:
            return t.numpy()
        except TypeError as err:
            raise _error(f"dtype {t.dtype}", str(err), "Convert it to float32/float64") from None
    if t.device.type == "cuda":
        current = torch.cuda.current_device()
        if t.device.index != current:
            raise _error(
                "a tensor on another GPU than this rank's",
                f"{t.device}, while this rank's GPU is cuda:{current}",
                f"Move it with tensor.to('cuda:{current}') or bind the rank to {t.device} "
                "with torch.cuda.set_device",
            )
        import cupy  # lazy: optional GPU dependency (CuPy)

        return cupy.from_dlpack(t)
    raise _error(
        f"a tensor on device {t.device}", str(t.device), "Move it to the CPU or a CUDA GPU"
    )


def _from_jax(a: Any) -> Any:
    devices = a.devices()
    if len(devices) != 1:
        raise _error(
            "a JAX array sharded over several devices",
            f"{len(devices)} devices",
            "Pass one shard (a.addressable_shards[i].data) or jax.device_get(a)",
        )
    platform = next(iter(devices)).platform
    if platform == "cpu" and np.dtype(a.dtype) == BFLOAT16:
        return np.asarray(a)  # a read-only view (NumPy's DLPack has no bfloat16)
    if platform == "cpu":
        return np.from_dlpack(a)
    if platform == "gpu" and np.dtype(a.dtype) == BFLOAT16:
        raise _error(
            "bfloat16 on a GPU (CuPy has no bfloat16 type)", "a bfloat16 JAX array on a GPU",
            "Reduce it on the CPU, or in float32 (a.astype(jnp.float32)) on the GPU",
        )
    if platform == "gpu":
        import cupy  # lazy: optional GPU dependency (CuPy)

        return cupy.from_dlpack(a)
    raise _error(f"a JAX array on {platform}", platform, "Move it to the CPU or a CUDA GPU")


def _from_tensorflow(t: Any) -> Any:
    import tensorflow as tf  # lazy: optional framework (TensorFlow)

    if isinstance(t, tf.Variable):
        t = t.read_value()
    if t.dtype == tf.bfloat16 and "GPU" in t.device.upper():
        raise _error(
            "bfloat16 on a GPU (CuPy has no bfloat16 type)", "a tf.bfloat16 tensor on a GPU",
            "Reduce it on the CPU, or in float32 (tf.cast(t, tf.float32)) on the GPU",
        )
    if "GPU" in t.device.upper():
        import cupy  # lazy: optional GPU dependency (CuPy)

        return cupy.from_dlpack(tf.experimental.dlpack.to_dlpack(t))
    return t.numpy()


def export_like(like: Any, result: Any) -> Any:
    """``result`` (NumPy or CuPy) as an array of ``like``'s type on ``like``'s device.

    PyTorch tensors share ``result``'s memory (``torch.from_numpy`` on the
    CPU, DLPack on a GPU); JAX and TensorFlow results are made through
    DLPack where the framework takes the buffer as it is, else copied.
    NumPy, CuPy and other ``like`` give ``result`` unchanged.

    Example: ``export_like(torch.ones(2), np.zeros(2))`` is ``tensor([0., 0.])``.
    """
    kind = _framework(like)
    if not kind:
        return result
    if isinstance(result, np.generic) or (isinstance(result, np.ndarray) and result.ndim == 0):
        result = np.array(result)
    if kind == "torch":
        import torch  # lazy: optional framework (PyTorch)

        if is_cupy(result):
            return torch.from_dlpack(result)
        if not result.flags.c_contiguous:
            result = result.copy()
        if result.dtype == BFLOAT16:  # torch has no NumPy bfloat16: retype the same memory
            out = torch.from_numpy(result.view(np.int16)).view(torch.bfloat16)
            return out if like.device.type == "cpu" else out.to(like.device)
        out = torch.from_numpy(result)
        return out if like.device.type == "cpu" else out.to(like.device)
    if kind == "jax":
        import jax  # lazy: optional framework (JAX)

        device = next(iter(like.devices()))
        if is_cupy(result) or device.platform == "cpu":
            try:
                return jax.dlpack.from_dlpack(result)
            except Exception:  # a layout JAX will not adopt: copy instead
                pass
        return jax.device_put(to_host(result), device)
    import tensorflow as tf  # lazy: optional framework (TensorFlow)

    if is_cupy(result):
        return tf.experimental.dlpack.from_dlpack(result.toDlpack())
    with tf.device(like.device or "/CPU:0"):
        return tf.convert_to_tensor(result)


def call_with_native(fn: Any, tensors: Any, out: Any = None, operation: str = "collective") -> Any:
    """``fn(native_tensors, native_out)`` on NumPy/CuPy views, results as the inputs' types.

    ``tensors`` is a list of arrays (any framework); ``out`` an optional list
    to write into (views of it go to ``fn``, which writes in place; ``out``
    itself is returned).

    Example: ``call_with_native(lambda t, o: engine.allreduce(t, "SUM", out=o), [torch_grad])``.
    """
    if is_foreign(tensors):
        raise TypeError(
            f"{operation} takes a list of arrays; got {type(tensors).__name__}. "
            f"Wrap a single array in a list: {operation}([x], ...)"
        )
    tensors = list(tensors)
    native = [import_array(t) for t in tensors]
    if out is not None:
        out = list(out)
        fn(native, [import_array(o) for o in out])
        return out
    results = fn(native, None)
    return [export_like(t, r) for t, r in zip(tensors, results, strict=True)]
