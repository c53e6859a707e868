"""Fused optimizer updates on the GPU: the updates of :mod:`hpcdist.kernels.optim` as CUDA kernels.

Same names, arguments and formulas as the CPU module (``sgd``, ``momentum``,
``adam``, ``rmsprop``, ``adagrad``, ``nadam``, ``sum_squares``, ``scale``,
``clip_values``); arrays are 1-D C-contiguous device arrays (Numba device
arrays, or CuPy arrays and any other object with ``__cuda_array_interface__``,
taken without copies). The ``hyper`` array is a host array (NumPy or a list):
its values become kernel arguments of the parameters' dtype, so the arithmetic
stays in that dtype and nothing is copied to the device for them. Each update
is one kernel launch, a grid-stride loop; ``stream`` picks the CUDA stream.

Importing this module imports ``numba.cuda``. Under Numba's CUDA simulator
(``NUMBA_ENABLE_CUDASIM=1``) the kernels run on the host, which is how they
are tested without a GPU.

Example (needs a GPU or the simulator)::

    adam(p, p, g, m, v, None, np.array([lr_t, 0.9, 0.999, 1e-7, 0.0], np.float32))
"""

from __future__ import annotations

import math
import sys
from typing import Any

import numpy as np
from numba import config, cuda

from hpcdist.kernels.cuda import as_device, is_c_contiguous, launch_config

__all__ = [
    "adagrad",
    "adam",
    "clip_values",
    "device_context",
    "momentum",
    "nadam",
    "rmsprop",
    "scale",
    "sgd",
    "sum_squares",
]

_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))

# ------------------------------------------------------------------------------- kernels


@cuda.jit
def _sgd_kernel(p_in: Any, p_out: Any, g: Any, lr: float, decay: float, zero: float) -> None:
    for i in range(cuda.grid(1), p_in.shape[0], cuda.gridsize(1)):
        p = p_in[i]
        if decay != zero:
            p = p - p * decay
        p_out[i] = p - g[i] * lr


@cuda.jit
def _momentum_kernel(
    p_in: Any,
    p_out: Any,
    g: Any,
    vel: Any,
    lr: float,
    mom: float,
    decay: float,
    nesterov: bool,
    zero: float,
) -> None:
    for i in range(cuda.grid(1), p_in.shape[0], cuda.gridsize(1)):
        p = p_in[i]
        if decay != zero:
            p = p - p * decay
        step = g[i] * lr
        v = vel[i] * mom - step
        vel[i] = v
        if nesterov:
            p_out[i] = p + (v * mom - step)
        else:
            p_out[i] = p + v


@cuda.jit
def _adam_kernel(
    p_in: Any,
    p_out: Any,
    g: Any,
    m: Any,
    v: Any,
    vhat: Any,
    amsgrad: bool,
    lr_t: float,
    c1: float,
    c2: float,
    eps: float,
    decay: float,
    zero: float,
) -> None:
    for i in range(cuda.grid(1), p_in.shape[0], cuda.gridsize(1)):
        p = p_in[i]
        if decay != zero:
            p = p - p * decay
        gi = g[i]
        mi = m[i]
        mi = mi + (gi - mi) * c1
        m[i] = mi
        vi = v[i]
        vi = vi + (gi * gi - vi) * c2
        v[i] = vi
        if amsgrad:
            vi = max(vhat[i], vi)
            vhat[i] = vi
        p_out[i] = p - (mi * lr_t) / (math.sqrt(vi) + eps)


@cuda.jit
def _rmsprop_kernel(
    p_in: Any,
    p_out: Any,
    g: Any,
    vel: Any,
    avg: Any,
    mom: Any,
    centered: bool,
    use_momentum: bool,
    lr: float,
    rho: float,
    c: float,
    momentum: float,
    eps: float,
    decay: float,
    zero: float,
) -> None:
    for i in range(cuda.grid(1), p_in.shape[0], cuda.gridsize(1)):
        p = p_in[i]
        if decay != zero:
            p = p - p * decay
        gi = g[i]
        vi = rho * vel[i] + c * (gi * gi)
        vel[i] = vi
        if centered:
            a = rho * avg[i] + c * gi
            avg[i] = a
            denom = vi - a * a + eps
        else:
            denom = vi + eps
        inc = lr * gi / math.sqrt(denom)
        if use_momentum:
            mb = momentum * mom[i] + inc
            mom[i] = mb
            p_out[i] = p - mb
        else:
            p_out[i] = p - inc


@cuda.jit
def _adagrad_kernel(
    p_in: Any, p_out: Any, g: Any, acc: Any, lr: float, eps: float, decay: float, zero: float
) -> None:
    for i in range(cuda.grid(1), p_in.shape[0], cuda.gridsize(1)):
        p = p_in[i]
        if decay != zero:
            p = p - p * decay
        gi = g[i]
        a = acc[i] + gi * gi
        acc[i] = a
        p_out[i] = p - lr * gi / math.sqrt(a + eps)


@cuda.jit
def _nadam_kernel(
    p_in: Any,
    p_out: Any,
    g: Any,
    m: Any,
    v: Any,
    lr: float,
    c1: float,
    c2: float,
    eps: float,
    c_m: float,
    c_g: float,
    c_v: float,
    decay: float,
    zero: float,
) -> None:
    for i in range(cuda.grid(1), p_in.shape[0], cuda.gridsize(1)):
        p = p_in[i]
        if decay != zero:
            p = p - p * decay
        gi = g[i]
        mi = m[i]
        mi = mi + (gi - mi) * c1
        m[i] = mi
        vi = v[i]
        vi = vi + (gi * gi - vi) * c2
        v[i] = vi
        m_hat = mi * c_m + gi * c_g
        p_out[i] = p - (m_hat * lr) / (math.sqrt(vi * c_v) + eps)


@cuda.jit
def _sum_squares_kernel(g: Any, out: Any) -> None:
    acc = 0.0
    for i in range(cuda.grid(1), g.shape[0], cuda.gridsize(1)):
        x = np.float64(g[i])
        acc += x * x
    cuda.atomic.add(out, 0, acc)


@cuda.jit
def _scale_kernel(g: Any, c: float) -> None:
    for i in range(cuda.grid(1), g.shape[0], cuda.gridsize(1)):
        g[i] = g[i] * c


@cuda.jit
def _clip_kernel(g: Any, c: float) -> None:
    lo = -c
    for i in range(cuda.grid(1), g.shape[0], cuda.gridsize(1)):
        x = g[i]
        if x > c:
            g[i] = c
        elif x < lo:
            g[i] = lo


# ------------------------------------------------------------------------- host side


def _flat(name: str, arrays: dict[str, Any], dtype: np.dtype | None = None) -> list[Any]:
    """The arrays as 1-D contiguous device arrays of one float dtype and size, else an error."""
    out = []
    first = next(iter(arrays))
    size = None
    for label, x in arrays.items():
        d = as_device(x, f"{name}: {label}")
        if len(d.shape) != 1 or not is_c_contiguous(d):
            raise TypeError(
                f"{name}: {label} has shape {tuple(d.shape)}; expected a 1-D C-contiguous "
                "device array (a flat buffer)"
            )
        xd = np.dtype(d.dtype)
        if dtype is None:
            dtype = xd
            if dtype not in _DTYPES:
                raise TypeError(
                    f"{name}: {label} is {dtype}; expected float32 or float64 (cast it first)"
                )
        elif xd != dtype:
            raise TypeError(
                f"{name}: {label} is {xd} but {first} is {dtype}; every array of one update "
                "must have the parameters' dtype"
            )
        if size is None:
            size = d.shape[0]
        elif d.shape[0] != size:
            raise ValueError(
                f"{name}: {label} has {d.shape[0]} elements but {first} has {size}; "
                "expected arrays of one size"
            )
        out.append(d)
    return out


def _optional(name: str, label: str, x: Any, like: Any) -> tuple[Any, bool]:
    """``(array, present)``: ``None`` or an empty array means absent (``like`` stands in)."""
    if x is None or (hasattr(x, "shape") and len(x.shape) == 1 and x.shape[0] == 0):
        return like, False
    (d,) = _flat(name, {label: x}, np.dtype(like.dtype))
    if d.shape[0] != like.shape[0]:
        raise ValueError(
            f"{name}: {label} has {d.shape[0]} elements but the parameters have "
            f"{like.shape[0]}; expected the same size, or an empty array to leave it out"
        )
    return d, True


def _scalars(name: str, hyper: Any, dtype: np.dtype, names: tuple[str, ...]) -> list[Any]:
    h = np.asarray(hyper, dtype=dtype)
    if h.shape != (len(names),):
        raise ValueError(
            f"{name}: hyper has shape {h.shape}; expected {len(names)} host values "
            f"[{', '.join(names)}]"
        )
    return [dtype.type(x) for x in h]


def device_context(index: int) -> Any:
    """A context manager that makes GPU ``index`` Numba's current device for launches.

    Example: ``with device_context(1): sgd(p, p, g, hyper)`` for arrays on GPU 1.
    """
    return cuda.gpus[int(index)]


def _resolve(stream: Any) -> Any:
    """``stream``; for the default ``0``, CuPy's current stream when CuPy is in use.

    So updates run in order with the caller's CuPy work (a replica's own stream
    under ``MirroredStrategy``) rather than on the legacy default stream.
    """
    if not (isinstance(stream, int) and stream == 0) or config.ENABLE_CUDASIM:
        return stream

    cupy = sys.modules.get("cupy")  # CuPy arrays imply it is imported
    if cupy is None:
        return stream
    ptr = int(cupy.cuda.get_current_stream().ptr)
    return cuda.external_stream(ptr) if ptr else stream


def _launch(kernel: Any, n: int, stream: Any, *args: Any) -> None:
    if n:
        blocks, threads = launch_config(n)
        kernel[blocks, threads, _resolve(stream)](*args)


def sgd(p_in: Any, p_out: Any, g: Any, hyper: Any, stream: Any = 0) -> None:
    """Plain SGD with decoupled weight decay, ``hyper = [lr, wd]`` (see the CPU ``sgd``).

    Example: ``sgd(p, p, g, [0.01, 0.0])``.
    """
    p_in, p_out, g = _flat("sgd", {"p_in": p_in, "p_out": p_out, "g": g})
    dtype = np.dtype(p_in.dtype)
    lr, wd = _scalars("sgd", hyper, dtype, ("lr", "wd"))
    _launch(_sgd_kernel, p_in.shape[0], stream, p_in, p_out, g, lr, lr * wd, dtype.type(0))


def momentum(
    p_in: Any, p_out: Any, g: Any, vel: Any, hyper: Any, nesterov: bool = False, stream: Any = 0
) -> None:
    """SGD with momentum, ``hyper = [lr, momentum, wd]`` (see the CPU ``momentum``).

    Example: ``momentum(p, p, g, vel, [0.1, 0.9, 0.0], nesterov=True)``.
    """
    arrays = {"p_in": p_in, "p_out": p_out, "g": g, "vel": vel}
    p_in, p_out, g, vel = _flat("momentum", arrays)
    dtype = np.dtype(p_in.dtype)
    lr, mom, wd = _scalars("momentum", hyper, dtype, ("lr", "momentum", "wd"))
    args = (p_in, p_out, g, vel, lr, mom, lr * wd, bool(nesterov), dtype.type(0))
    _launch(_momentum_kernel, p_in.shape[0], stream, *args)


def adam(
    p_in: Any, p_out: Any, g: Any, m: Any, v: Any, vhat: Any, hyper: Any, stream: Any = 0
) -> None:
    """Adam / amsgrad, ``hyper = [lr_t, beta_1, beta_2, epsilon, lr * wd]`` (see the CPU ``adam``).

    Example: ``adam(p, p, g, m, v, None, hyper)``.
    """
    arrays = {"p_in": p_in, "p_out": p_out, "g": g, "m": m, "v": v}
    p_in, p_out, g, m, v = _flat("adam", arrays)
    vhat, amsgrad = _optional("adam", "vhat", vhat, v)
    dtype = np.dtype(p_in.dtype)
    names = ("lr_t", "beta_1", "beta_2", "epsilon", "lr*wd")
    lr_t, b1, b2, eps, decay = _scalars("adam", hyper, dtype, names)
    one = dtype.type(1)
    args = (p_in, p_out, g, m, v, vhat, amsgrad, lr_t, one - b1, one - b2, eps, decay)
    _launch(_adam_kernel, p_in.shape[0], stream, *args, dtype.type(0))


def rmsprop(
    p_in: Any, p_out: Any, g: Any, vel: Any, avg: Any, mom: Any, hyper: Any, stream: Any = 0
) -> None:
    """RMSprop, ``hyper = [lr, rho, momentum, epsilon, wd]`` (see the CPU ``rmsprop``).

    Example: ``rmsprop(p, p, g, vel, None, None, [1e-3, 0.9, 0.0, 1e-7, 0.0])``.
    """
    arrays = {"p_in": p_in, "p_out": p_out, "g": g, "vel": vel}
    p_in, p_out, g, vel = _flat("rmsprop", arrays)
    avg, centered = _optional("rmsprop", "avg", avg, vel)
    mom, use_momentum = _optional("rmsprop", "mom", mom, vel)
    dtype = np.dtype(p_in.dtype)
    names = ("lr", "rho", "momentum", "epsilon", "wd")
    lr, rho, momentum_, eps, wd = _scalars("rmsprop", hyper, dtype, names)
    args = (p_in, p_out, g, vel, avg, mom, centered, use_momentum, lr, rho)
    rest = (dtype.type(1) - rho, momentum_, eps, lr * wd, dtype.type(0))
    _launch(_rmsprop_kernel, p_in.shape[0], stream, *args, *rest)


def adagrad(p_in: Any, p_out: Any, g: Any, acc: Any, hyper: Any, stream: Any = 0) -> None:
    """Adagrad, ``hyper = [lr, epsilon, wd]`` (see the CPU ``adagrad``).

    Example: ``adagrad(p, p, g, acc, [1e-3, 1e-7, 0.0])``.
    """
    p_in, p_out, g, acc = _flat("adagrad", {"p_in": p_in, "p_out": p_out, "g": g, "acc": acc})
    dtype = np.dtype(p_in.dtype)
    lr, eps, wd = _scalars("adagrad", hyper, dtype, ("lr", "epsilon", "wd"))
    args = (p_in, p_out, g, acc, lr, eps, lr * wd, dtype.type(0))
    _launch(_adagrad_kernel, p_in.shape[0], stream, *args)


def nadam(p_in: Any, p_out: Any, g: Any, m: Any, v: Any, hyper: Any, stream: Any = 0) -> None:
    """Nadam, ``hyper = [lr, beta_1, beta_2, epsilon, c_m, c_g, c_v, lr * wd]`` (see the CPU
    ``nadam``).

    Example: ``nadam(p, p, g, m, v, hyper)``.
    """
    arrays = {"p_in": p_in, "p_out": p_out, "g": g, "m": m, "v": v}
    p_in, p_out, g, m, v = _flat("nadam", arrays)
    dtype = np.dtype(p_in.dtype)
    names = ("lr", "beta_1", "beta_2", "epsilon", "c_m", "c_g", "c_v", "lr*wd")
    lr, b1, b2, eps, c_m, c_g, c_v, decay = _scalars("nadam", hyper, dtype, names)
    one = dtype.type(1)
    args = (p_in, p_out, g, m, v, lr, one - b1, one - b2, eps, c_m, c_g, c_v, decay)
    _launch(_nadam_kernel, p_in.shape[0], stream, *args, dtype.type(0))


def sum_squares(g: Any, stream: Any = 0) -> float:
    """``sum(g**2)`` accumulated in float64, as a Python float (waits for the result).

    Example: ``math.sqrt(sum_squares(g))`` is the L2 norm of ``g``.
    """
    (g,) = _flat("sum_squares", {"g": g})
    stream = _resolve(stream)
    out = cuda.to_device(np.zeros(1, np.float64), stream=stream)
    _launch(_sum_squares_kernel, g.shape[0], stream, g, out)
    return float(out.copy_to_host(stream=stream)[0])


def scale(g: Any, c: float, stream: Any = 0) -> None:
    """``g *= c`` in place, ``c`` cast to ``g``'s dtype.

    Example: ``scale(g, clip_norm / norm)``.
    """
    (g,) = _flat("scale", {"g": g})
    _launch(_scale_kernel, g.shape[0], stream, g, np.dtype(g.dtype).type(c))


def clip_values(g: Any, c: float, stream: Any = 0) -> None:
    """Clip ``g`` to ``[-c, c]`` in place (NaN stays NaN).

    Example: ``clip_values(g, 1.0)``.
    """
    (g,) = _flat("clip_values", {"g": g})
    if not c >= 0:
        raise ValueError(f"clip_values: c is {c!r}; expected a non-negative clip value")
    _launch(_clip_kernel, g.shape[0], stream, g, np.dtype(g.dtype).type(c))
