"""Fused optimizer updates on the CPU: one pass over flat parameter buffers.

Each update reads the parameters, the gradient and the optimizer state once
and writes the new parameters and state in the same loop (no temporaries).
All arrays are 1-D, C-contiguous NumPy arrays of one dtype (``float32`` or
``float64``); the hyper-parameters come as a small array of that same dtype,
so the arithmetic happens in the parameter dtype, as Keras does it.

``p_in`` and ``p_out`` may be the same array (update in place) or two arrays
(out of place: ``p_in`` is left unchanged). State arrays (velocity, moments)
are always updated in place. Weight decay is decoupled and applied first:
``p -= p * (lr * wd)``; a zero decay leaves ``p`` untouched.

* :func:`sgd` ``hyper = [lr, wd]``: ``p -= lr * g``.
* :func:`momentum` ``hyper = [lr, momentum, wd]``: ``vel = momentum * vel - lr * g``;
  ``p += vel`` (nesterov: ``p += momentum * vel - lr * g``).
* :func:`adam` ``hyper = [lr_t, beta_1, beta_2, epsilon, lr * wd]``:
  ``m += (g - m)(1 - b1)``; ``v += (g^2 - v)(1 - b2)``; amsgrad (a non-empty
  ``vhat``): ``vhat = max(vhat, v)``, used instead of ``v``;
  ``p -= lr_t * m / (sqrt(v) + eps)``.
* :func:`rmsprop` ``hyper = [lr, rho, momentum, epsilon, wd]``:
  ``vel = rho vel + (1 - rho) g^2``; centered (a non-empty ``avg``):
  ``avg = rho avg + (1 - rho) g``, ``denom = vel - avg^2 + eps``, else
  ``denom = vel + eps``; ``inc = lr g / sqrt(denom)``; with momentum (a
  non-empty ``mom``): ``mom = momentum * mom + inc``, ``p -= mom``; else ``p -= inc``.
* :func:`adagrad` ``hyper = [lr, epsilon, wd]``: ``acc += g^2``;
  ``p -= lr g / sqrt(acc + eps)``.
* :func:`nadam` ``hyper = [lr, beta_1, beta_2, epsilon, c_m, c_g, c_v, lr * wd]``:
  ``m += (g - m)(1 - b1)``; ``v += (g^2 - v)(1 - b2)``; ``m_hat = c_m m + c_g g``;
  ``v_hat = c_v v``; ``p -= lr m_hat / (sqrt(v_hat) + eps)`` (the step's
  momentum-schedule factors ``c_m``, ``c_g``, ``c_v`` come from the optimizer).
* :func:`sum_squares`, :func:`scale`, :func:`clip_values`: what gradient
  clipping needs.

Example:
    >>> import numpy as np
    >>> p, g = np.ones(3, np.float32), np.array([1.0, 2.0, 3.0], np.float32)
    >>> sgd(p, p, g, np.array([0.5, 0.0], np.float32))
    >>> p
    array([ 0.5,  0. , -0.5], dtype=float32)
    >>> sum_squares(g)
    14.0
"""

from __future__ import annotations

from typing import Any

import numpy as np
from numba import njit

__all__ = [
    "adagrad", "adam", "clip_values", "momentum", "nadam", "rmsprop", "scale", "sgd",
    "sum_squares",
]  # fmt: skip

_JIT = {"nogil": True, "cache": True, "error_model": "numpy", "boundscheck": False}
_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))
_EMPTY = {d: np.empty(0, d) for d in _DTYPES}

# ------------------------------------------------------------------------------- kernels


# Each update has two loops with the same body: in place over one array ``p``, and out of
# place from ``p_in`` to ``p_out``. The in-place loop matters: with ``p_in is p_out`` LLVM's
# runtime alias check of a two-array loop fails and the scalar fallback runs (four times
# slower for Adam); over one array the loop vectorizes. (The body is written out in each
# loop: a shared element function called from the loop does not vectorize.)


@njit(**_JIT)
def _sgd_in(p: np.ndarray, g: np.ndarray, lr: float, decay: float, zero: float) -> None:
    for i in range(p.shape[0]):
        x = p[i]
        if decay != zero:
            x = x - x * decay
        p[i] = x - g[i] * lr


@njit(**_JIT)
def _sgd_out(
    p_in: np.ndarray, p_out: np.ndarray, g: np.ndarray, lr: float, decay: float, zero: float
) -> None:
    for i in range(p_in.shape[0]):
        x = p_in[i]
        if decay != zero:
            x = x - x * decay
        p_out[i] = x - g[i] * lr


@njit(**_JIT)
def _momentum_in(
    p: np.ndarray,
    g: np.ndarray,
    vel: np.ndarray,
    lr: float,
    mom: float,
    decay: float,
    nesterov: bool,
    zero: float,
) -> None:
    for i in range(p.shape[0]):
        x = p[i]
        if decay != zero:
            x = x - x * decay
        step = g[i] * lr
        v = vel[i] * mom - step
        vel[i] = v
        p[i] = x + (v * mom - step) if nesterov else x + v


@njit(**_JIT)
def _momentum_out(
    p_in: np.ndarray,
    p_out: np.ndarray,
    g: np.ndarray,
    vel: np.ndarray,
    lr: float,
    mom: float,
    decay: float,
    nesterov: bool,
    zero: float,
) -> None:
    for i in range(p_in.shape[0]):
        x = p_in[i]
        if decay != zero:
            x = x - x * decay
        step = g[i] * lr
        v = vel[i] * mom - step
        vel[i] = v
        p_out[i] = x + (v * mom - step) if nesterov else x + v


@njit(**_JIT)
def _adam_in(
    p: np.ndarray,
    g: np.ndarray,
    m: np.ndarray,
    v: np.ndarray,
    vhat: np.ndarray,
    amsgrad: bool,
    lr_t: float,
    c1: float,
    c2: float,
    eps: float,
    decay: float,
    zero: float,
) -> None:
    for i in range(p.shape[0]):
        x = p[i]
        if decay != zero:
            x = x - x * decay
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
        p[i] = x - (mi * lr_t) / (np.sqrt(vi) + eps)


@njit(**_JIT)
def _adam_out(
    p_in: np.ndarray,
    p_out: np.ndarray,
    g: np.ndarray,
    m: np.ndarray,
    v: np.ndarray,
    vhat: np.ndarray,
    amsgrad: bool,
    lr_t: float,
    c1: float,
    c2: float,
    eps: float,
    decay: float,
    zero: float,
) -> None:
    for i in range(p_in.shape[0]):
        x = p_in[i]
        if decay != zero:
            x = x - x * decay
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
        p_out[i] = x - (mi * lr_t) / (np.sqrt(vi) + eps)


@njit(**_JIT)
def _rmsprop_in(
    p: np.ndarray,
    g: np.ndarray,
    vel: np.ndarray,
    avg: np.ndarray,
    mom: np.ndarray,
    centered: bool,
    use_mom: bool,
    lr: float,
    rho: float,
    c: float,
    momentum: float,
    eps: float,
    decay: float,
    zero: float,
) -> None:
    for i in range(p.shape[0]):
        x = p[i]
        if decay != zero:
            x = x - x * decay
        gi = g[i]
        vi = rho * vel[i] + c * (gi * gi)
        vel[i] = vi
        if centered:
            a = rho * avg[i] + c * gi
            avg[i] = a
            denom = vi - a * a + eps
        else:
            denom = vi + eps
        inc = lr * gi / np.sqrt(denom)
        if use_mom:
            inc = momentum * mom[i] + inc
            mom[i] = inc
        p[i] = x - inc


@njit(**_JIT)
def _rmsprop_out(
    p_in: np.ndarray,
    p_out: np.ndarray,
    g: np.ndarray,
    vel: np.ndarray,
    avg: np.ndarray,
    mom: np.ndarray,
    centered: bool,
    use_mom: bool,
    lr: float,
    rho: float,
    c: float,
    momentum: float,
    eps: float,
    decay: float,
    zero: float,
) -> None:
    for i in range(p_in.shape[0]):
        x = p_in[i]
        if decay != zero:
            x = x - x * decay
        gi = g[i]
        vi = rho * vel[i] + c * (gi * gi)
        vel[i] = vi
        if centered:
            a = rho * avg[i] + c * gi
            avg[i] = a
            denom = vi - a * a + eps
        else:
            denom = vi + eps
        inc = lr * gi / np.sqrt(denom)
        if use_mom:
            inc = momentum * mom[i] + inc
            mom[i] = inc
        p_out[i] = x - inc


@njit(**_JIT)
def _adagrad_in(
    p: np.ndarray, g: np.ndarray, acc: np.ndarray, lr: float, eps: float, decay: float, zero: float
) -> None:
    for i in range(p.shape[0]):
        x = p[i]
        if decay != zero:
            x = x - x * decay
        gi = g[i]
        a = acc[i] + gi * gi
        acc[i] = a
        p[i] = x - lr * gi / np.sqrt(a + eps)


@njit(**_JIT)
def _adagrad_out(
    p_in: np.ndarray,
    p_out: np.ndarray,
    g: np.ndarray,
    acc: np.ndarray,
    lr: float,
    eps: float,
    decay: float,
    zero: float,
) -> None:
    for i in range(p_in.shape[0]):
        x = p_in[i]
        if decay != zero:
            x = x - x * decay
        gi = g[i]
        a = acc[i] + gi * gi
        acc[i] = a
        p_out[i] = x - lr * gi / np.sqrt(a + eps)


@njit(**_JIT)
def _nadam_in(
    p: np.ndarray,
    g: np.ndarray,
    m: np.ndarray,
    v: np.ndarray,
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
    for i in range(p.shape[0]):
        x = p[i]
        if decay != zero:
            x = x - x * decay
        gi = g[i]
        mi = m[i]
        mi = mi + (gi - mi) * c1
        m[i] = mi
        vi = v[i]
        vi = vi + (gi * gi - vi) * c2
        v[i] = vi
        m_hat = mi * c_m + gi * c_g
        p[i] = x - (m_hat * lr) / (np.sqrt(vi * c_v) + eps)


@njit(**_JIT)
def _nadam_out(
    p_in: np.ndarray,
    p_out: np.ndarray,
    g: np.ndarray,
    m: np.ndarray,
    v: np.ndarray,
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
    for i in range(p_in.shape[0]):
        x = p_in[i]
        if decay != zero:
            x = x - x * decay
        gi = g[i]
        mi = m[i]
        mi = mi + (gi - mi) * c1
        m[i] = mi
        vi = v[i]
        vi = vi + (gi * gi - vi) * c2
        v[i] = vi
        m_hat = mi * c_m + gi * c_g
        p_out[i] = x - (m_hat * lr) / (np.sqrt(vi * c_v) + eps)


@njit(**_JIT)
def _sum_squares(g: np.ndarray) -> float:
    # four partial sums (a fixed order: deterministic) keep the adds pipelined
    a0 = 0.0
    a1 = 0.0
    a2 = 0.0
    a3 = 0.0
    n = g.shape[0]
    n4 = n - n % 4
    for i in range(0, n4, 4):
        x0 = np.float64(g[i])
        x1 = np.float64(g[i + 1])
        x2 = np.float64(g[i + 2])
        x3 = np.float64(g[i + 3])
        a0 += x0 * x0
        a1 += x1 * x1
        a2 += x2 * x2
        a3 += x3 * x3
    for i in range(n4, n):
        x = np.float64(g[i])
        a0 += x * x
    return (a0 + a1) + (a2 + a3)


@njit(**_JIT)
def _scale(g: np.ndarray, c: float) -> None:
    for i in range(g.shape[0]):
        g[i] = g[i] * c


@njit(**_JIT)
def _clip_values(g: np.ndarray, c: float) -> None:
    lo = -c
    for i in range(g.shape[0]):
        x = g[i]
        if x > c:
            g[i] = c
        elif x < lo:
            g[i] = lo


# ------------------------------------------------------------------------- checking


def _describe(x: Any) -> str:
    if isinstance(x, np.ndarray):
        layout = "contiguous" if x.flags.c_contiguous else "non-contiguous"
        return f"a {layout} {x.dtype} array of shape {x.shape}"
    return type(x).__name__


def _check_flat(name: str, arrays: dict[str, Any], dtype: np.dtype | None = None) -> np.dtype:
    """The common dtype of 1-D contiguous float32/float64 arrays of one size, else an error."""
    first = next(iter(arrays))
    size = None
    for label, x in arrays.items():
        if not (isinstance(x, np.ndarray) and x.ndim == 1 and x.flags.c_contiguous):
            raise TypeError(
                f"{name}: {label} is {_describe(x)}; expected a 1-D C-contiguous NumPy array "
                "(pass a flat buffer, e.g. np.ascontiguousarray(x).reshape(-1))"
            )
        if dtype is None:
            dtype = x.dtype
            if dtype not in _DTYPES:
                raise TypeError(
                    f"{name}: {label} is {dtype}; expected float32 or float64 (cast it first)"
                )
        elif x.dtype != dtype:
            raise TypeError(
                f"{name}: {label} is {x.dtype} but {first} is {dtype}; every array of one "
                "update must have the parameters' dtype"
            )
        if size is None:
            size = x.shape[0]
        elif x.shape[0] != size:
            raise ValueError(
                f"{name}: {label} has {x.shape[0]} elements but {first} has {size}; "
                "expected arrays of one size"
            )
    assert dtype is not None
    return dtype


def _optional(name: str, label: str, x: Any, size: int, dtype: np.dtype) -> np.ndarray:
    """An optional state array: ``None`` or empty means absent, else size ``size``."""
    if x is None:
        return _EMPTY[dtype]
    if isinstance(x, np.ndarray) and x.ndim == 1 and x.shape[0] == 0:
        return _EMPTY[dtype]
    _check_flat(name, {label: x}, dtype)
    if x.shape[0] != size:
        raise ValueError(
            f"{name}: {label} has {x.shape[0]} elements but the parameters have {size}; "
            "expected the same size, or an empty array to leave it out"
        )
    return x


def _hyper(name: str, hyper: Any, dtype: np.dtype, names: tuple[str, ...]) -> np.ndarray:
    if isinstance(hyper, np.ndarray) and hyper.dtype == dtype and hyper.flags.c_contiguous:
        h = hyper
    else:
        h = np.ascontiguousarray(hyper, dtype=dtype)
    if h.shape != (len(names),):
        raise ValueError(
            f"{name}: hyper has shape {h.shape}; expected {len(names)} values [{', '.join(names)}]"
        )
    return h


def _in_place(name: str, p_in: np.ndarray, p_out: np.ndarray, *state: np.ndarray) -> bool:
    """Whether the update is in place (``p_out`` is ``p_in``'s memory); overlaps are errors."""
    same = p_out is p_in or p_out.ctypes.data == p_in.ctypes.data  # in place (any two views)
    if not same and np.may_share_memory(p_in, p_out):
        raise ValueError(
            f"{name}: p_in and p_out overlap without being the same array; pass the same "
            "array (in place) or two separate arrays (out of place)"
        )
    for x in state:
        if x.shape[0] and (np.may_share_memory(x, p_out) or np.may_share_memory(x, p_in)):
            raise ValueError(f"{name}: a state array shares memory with the parameters")
    return same


# ---------------------------------------------------------------------------- updates


def sgd(p_in: np.ndarray, p_out: np.ndarray, g: np.ndarray, hyper: Any) -> None:
    """Plain SGD with decoupled weight decay: ``p_out = p_in - lr*wd*p_in - lr*g``.

    ``hyper = [lr, wd]`` (cast to the parameters' dtype).

    Example: ``sgd(p, p, g, np.array([0.01, 0.0], p.dtype))`` updates ``p`` in place.
    """
    dtype = _check_flat("sgd", {"p_in": p_in, "p_out": p_out, "g": g})
    lr, wd = _hyper("sgd", hyper, dtype, ("lr", "wd"))
    args = (g, lr, lr * wd, dtype.type(0))
    if _in_place("sgd", p_in, p_out):
        _sgd_in(p_in, *args)
    else:
        _sgd_out(p_in, p_out, *args)


def momentum(
    p_in: np.ndarray,
    p_out: np.ndarray,
    g: np.ndarray,
    vel: np.ndarray,
    hyper: Any,
    nesterov: bool = False,
) -> None:
    """SGD with momentum (Keras form): ``vel = mom*vel - lr*g; p += vel``.

    ``hyper = [lr, momentum, wd]``; ``nesterov=True`` makes the step
    ``p += mom*vel - lr*g`` (with the new ``vel``). ``vel`` is updated in place.

    Example: ``momentum(p, p, g, vel, np.array([0.1, 0.9, 0.0], p.dtype))``.
    """
    dtype = _check_flat("momentum", {"p_in": p_in, "p_out": p_out, "g": g, "vel": vel})
    lr, mom, wd = _hyper("momentum", hyper, dtype, ("lr", "momentum", "wd"))
    args = (g, vel, lr, mom, lr * wd, bool(nesterov), dtype.type(0))
    if _in_place("momentum", p_in, p_out, vel):
        _momentum_in(p_in, *args)
    else:
        _momentum_out(p_in, p_out, *args)


def adam(
    p_in: np.ndarray,
    p_out: np.ndarray,
    g: np.ndarray,
    m: np.ndarray,
    v: np.ndarray,
    vhat: np.ndarray | None,
    hyper: Any,
) -> None:
    """Adam (amsgrad when ``vhat`` is non-empty), with decoupled weight decay.

    ``hyper = [lr_t, beta_1, beta_2, epsilon, lr * wd]`` where ``lr_t =
    lr * sqrt(1 - beta_2^t) / (1 - beta_1^t)`` for step ``t`` (1-based).
    ``m``, ``v`` (and ``vhat``) are updated in place.

    Example: ``adam(p, p, g, m, v, np.empty(0, p.dtype), hyper)``.
    """
    dtype = _check_flat("adam", {"p_in": p_in, "p_out": p_out, "g": g, "m": m, "v": v})
    vhat = _optional("adam", "vhat", vhat, p_in.shape[0], dtype)
    names = ("lr_t", "beta_1", "beta_2", "epsilon", "lr*wd")
    lr_t, b1, b2, eps, decay = _hyper("adam", hyper, dtype, names)
    one = dtype.type(1)
    amsgrad = vhat.shape[0] > 0
    args = (g, m, v, vhat, amsgrad, lr_t, one - b1, one - b2, eps, decay, dtype.type(0))
    if _in_place("adam", p_in, p_out, m, v, vhat):
        _adam_in(p_in, *args)
    else:
        _adam_out(p_in, p_out, *args)


def rmsprop(
    p_in: np.ndarray,
    p_out: np.ndarray,
    g: np.ndarray,
    vel: np.ndarray,
    avg: np.ndarray | None,
    mom: np.ndarray | None,
    hyper: Any,
) -> None:
    """RMSprop (centered when ``avg`` is non-empty, with momentum when ``mom`` is).

    ``hyper = [lr, rho, momentum, epsilon, wd]``. State arrays are updated in place.

    Example: ``rmsprop(p, p, g, vel, None, None, np.array([1e-3, 0.9, 0, 1e-7, 0], p.dtype))``.
    """
    dtype = _check_flat("rmsprop", {"p_in": p_in, "p_out": p_out, "g": g, "vel": vel})
    avg = _optional("rmsprop", "avg", avg, p_in.shape[0], dtype)
    mom = _optional("rmsprop", "mom", mom, p_in.shape[0], dtype)
    names = ("lr", "rho", "momentum", "epsilon", "wd")
    lr, rho, momentum_, eps, wd = _hyper("rmsprop", hyper, dtype, names)
    flags = (avg.shape[0] > 0, mom.shape[0] > 0)
    consts = (lr, rho, dtype.type(1) - rho, momentum_, eps, lr * wd, dtype.type(0))
    if _in_place("rmsprop", p_in, p_out, vel, avg, mom):
        _rmsprop_in(p_in, g, vel, avg, mom, *flags, *consts)
    else:
        _rmsprop_out(p_in, p_out, g, vel, avg, mom, *flags, *consts)


def adagrad(
    p_in: np.ndarray, p_out: np.ndarray, g: np.ndarray, acc: np.ndarray, hyper: Any
) -> None:
    """Adagrad: ``acc += g^2; p -= lr * g / sqrt(acc + epsilon)``, decoupled weight decay first.

    ``hyper = [lr, epsilon, wd]``. ``acc`` is updated in place.

    Example: ``adagrad(p, p, g, acc, np.array([1e-3, 1e-7, 0.0], p.dtype))``.
    """
    dtype = _check_flat("adagrad", {"p_in": p_in, "p_out": p_out, "g": g, "acc": acc})
    lr, eps, wd = _hyper("adagrad", hyper, dtype, ("lr", "epsilon", "wd"))
    args = (g, acc, lr, eps, lr * wd, dtype.type(0))
    if _in_place("adagrad", p_in, p_out, acc):
        _adagrad_in(p_in, *args)
    else:
        _adagrad_out(p_in, p_out, *args)


def nadam(
    p_in: np.ndarray, p_out: np.ndarray, g: np.ndarray, m: np.ndarray, v: np.ndarray, hyper: Any
) -> None:
    """Nadam (Adam with Nesterov momentum, Keras's form), decoupled weight decay first.

    ``hyper = [lr, beta_1, beta_2, epsilon, c_m, c_g, c_v, lr * wd]`` where, for
    step ``t`` (1-based), ``u_t = beta_1 (1 - 0.5 * 0.96^t)``, ``c_m = u_{t+1} /
    (1 - u_1...u_{t+1})``, ``c_g = (1 - u_t) / (1 - u_1...u_t)`` and ``c_v = 1 /
    (1 - beta_2^t)``. ``m`` and ``v`` are updated in place.

    Example: ``nadam(p, p, g, m, v, hyper)`` with ``hyper`` from ``Nadam.hyper_parameters``.
    """
    dtype = _check_flat("nadam", {"p_in": p_in, "p_out": p_out, "g": g, "m": m, "v": v})
    names = ("lr", "beta_1", "beta_2", "epsilon", "c_m", "c_g", "c_v", "lr*wd")
    lr, b1, b2, eps, c_m, c_g, c_v, decay = _hyper("nadam", hyper, dtype, names)
    one = dtype.type(1)
    args = (g, m, v, lr, one - b1, one - b2, eps, c_m, c_g, c_v, decay, dtype.type(0))
    if _in_place("nadam", p_in, p_out, m, v):
        _nadam_in(p_in, *args)
    else:
        _nadam_out(p_in, p_out, *args)


# ------------------------------------------------------------------------- clipping


def sum_squares(g: np.ndarray) -> float:
    """``sum(g**2)`` accumulated in float64 (a Python float).

    Example: ``math.sqrt(sum_squares(g))`` is the L2 norm of ``g``.
    """
    _check_flat("sum_squares", {"g": g})
    return float(_sum_squares(g))


def scale(g: np.ndarray, c: float) -> None:
    """``g *= c`` in place, ``c`` cast to ``g``'s dtype.

    Example: ``scale(g, clip_norm / norm)``.
    """
    dtype = _check_flat("scale", {"g": g})
    _scale(g, dtype.type(c))


def clip_values(g: np.ndarray, c: float) -> None:
    """Clip ``g`` to ``[-c, c]`` in place (NaN stays NaN)."""
    dtype = _check_flat("clip_values", {"g": g})
    if not c >= 0:
        raise ValueError(f"clip_values: c is {c!r}; expected a non-negative clip value")
    _clip_values(g, dtype.type(c))
