"""Reductions and casts of 16-bit floats (float16, bfloat16) that accumulate in float32.

The engine reduces half-precision data by widening every element to
``float32``, folding the rows in row order in ``float32`` and rounding once
(to nearest, ties to even) at the end, so the bits depend only on the inputs
and the row order:

* :func:`fold_rows16` folds the rows of a 2-D array into a 1-D one
  (``SUM``, ``MEAN``, ``MIN``, ``MAX``); rows and result may be float16,
  bfloat16 or float32 (a float32 result is not rounded: the node partial
  sums of the hierarchical path; float32 rows with a 16-bit result: the
  owner's fold of the compressed path);
* :func:`narrow` and :func:`widen` cast float32 to and from a 16-bit type,
  bit-exact with NumPy's and ``ml_dtypes``' ``astype``.

Numba has no 16-bit float arrays on the CPU, so the kernels see ``uint16``
bit patterns (:mod:`hpcdist.kernels.half`).

Example:
    >>> import numpy as np, ml_dtypes
    >>> bf16 = np.dtype(ml_dtypes.bfloat16)
    >>> rows = np.array([[1.0, 256.0], [2.0**-8, 1.0]], bf16)
    >>> out = np.empty(2, bf16)
    >>> fold_rows16(rows, out, SUM, 1)
    >>> out.astype(np.float32)  # 1 + 2**-8 is a tie: rounds to even (1.0); 257 -> 256
    array([  1., 256.], dtype=float32)
"""

from __future__ import annotations

import ml_dtypes
import numba
import numpy as np
from numba import njit

from hpcdist.kernels._llvm import pointer, stack_block
from hpcdist.kernels.half import (
    bfloat16_to_float,
    float_to_bfloat16,
    float_to_half,
    half_to_float,
)

__all__ = ["BFLOAT16", "fold_rows16", "is_half", "narrow", "widen"]

SUM, MEAN, MIN, MAX = 0, 1, 2, 3
F16, BF16 = 0, 1  # the 16-bit formats, as the kernels name them
BFLOAT16 = np.dtype(ml_dtypes.bfloat16)
_FORMATS = {np.dtype(np.float16): F16, BFLOAT16: BF16}
_BLOCK = 2048
_JIT = {"nogil": True, "cache": True, "error_model": "numpy"}


def is_half(dtype: np.dtype) -> bool:
    """Whether ``dtype`` is float16 or bfloat16. Example: ``is_half(BFLOAT16)`` is ``True``."""
    return dtype in _FORMATS


@njit(**_JIT)
def _up(bits: np.uint16, fmt: int) -> np.float32:
    return bfloat16_to_float(bits) if fmt == BF16 else half_to_float(bits)


@njit(**_JIT)
def _down(value: np.float32, fmt: int) -> np.uint16:
    return float_to_bfloat16(value) if fmt == BF16 else float_to_half(value)


@njit(**_JIT)
def _combine(acc: np.ndarray, bn: int, op: int, values: np.ndarray) -> None:
    if op == MIN:  # np.minimum: a NaN in either operand wins
        for j in range(bn):
            a = acc[j]
            b = values[j]
            acc[j] = a if a != a or a <= b else b
    elif op == MAX:
        for j in range(bn):
            a = acc[j]
            b = values[j]
            acc[j] = a if a != a or a >= b else b
    else:
        for j in range(bn):
            acc[j] = acc[j] + values[j]


@njit(**_JIT)
def _fold(
    src: int, row_bytes: int, nrows: int, count: int, dst: int, op: int, divisor: int,
    fmt_in: int, fmt_out: int,
) -> None:
    """Rows of ``fmt_in`` (F16, BF16; -1: float32) folded in float32 into ``fmt_out``
    (-1: float32, not rounded). ``dst`` may be exactly one of the rows."""
    acc = numba.carray(stack_block(_BLOCK, np.float32), _BLOCK)
    tmp = numba.carray(stack_block(_BLOCK, np.float32), _BLOCK)
    d = np.float32(divisor)
    in_size = 4 if fmt_in < 0 else 2
    out_size = 4 if fmt_out < 0 else 2
    for b0 in range(0, count, _BLOCK):
        bn = min(_BLOCK, count - b0)
        for k in range(nrows):
            target = acc if k == 0 else tmp
            base = src + k * row_bytes + b0 * in_size
            if fmt_in < 0:
                row32 = numba.carray(pointer(base, np.float32), bn)
                for j in range(bn):
                    target[j] = row32[j]
            else:
                row16 = numba.carray(pointer(base, np.uint16), bn)
                for j in range(bn):
                    target[j] = _up(row16[j], fmt_in)
            if k > 0:
                _combine(acc, bn, op, tmp)
        if op == MEAN:
            for j in range(bn):
                acc[j] = acc[j] / d
        if fmt_out < 0:
            o32 = numba.carray(pointer(dst + b0 * out_size, np.float32), bn)
            for j in range(bn):
                o32[j] = acc[j]
        else:
            o16 = numba.carray(pointer(dst + b0 * out_size, np.uint16), bn)
            for j in range(bn):
                o16[j] = _down(acc[j], fmt_out)


# The casts are the compressed path's hot loops: one kernel per format, so that the
# conversion inlines and the loop vectorises.


@njit(**_JIT)
def _narrow_bf16(src: int, dst: int, n: int) -> None:
    x = numba.carray(pointer(src, np.float32), n)
    o = numba.carray(pointer(dst, np.uint16), n)
    for i in range(n):
        o[i] = float_to_bfloat16(x[i])


@njit(**_JIT)
def _narrow_f16(src: int, dst: int, n: int) -> None:
    x = numba.carray(pointer(src, np.float32), n)
    o = numba.carray(pointer(dst, np.uint16), n)
    for i in range(n):
        o[i] = float_to_half(x[i])


@njit(**_JIT)
def _widen_bf16(src: int, dst: int, n: int) -> None:
    x = numba.carray(pointer(src, np.uint16), n)
    o = numba.carray(pointer(dst, np.float32), n)
    for i in range(n):
        o[i] = bfloat16_to_float(x[i])


@njit(**_JIT)
def _widen_f16(src: int, dst: int, n: int) -> None:
    x = numba.carray(pointer(src, np.uint16), n)
    o = numba.carray(pointer(dst, np.float32), n)
    for i in range(n):
        o[i] = half_to_float(x[i])


# Widened and divided in one pass (a compressed MEAN's result): the float32 division
# is the one ``np.divide`` makes, so the bits are those of widening, then dividing.


@njit(**_JIT)
def _widen_bf16_divided(src: int, dst: int, n: int, d: np.float32) -> None:
    x = numba.carray(pointer(src, np.uint16), n)
    o = numba.carray(pointer(dst, np.float32), n)
    for i in range(n):
        o[i] = bfloat16_to_float(x[i]) / d


@njit(**_JIT)
def _widen_f16_divided(src: int, dst: int, n: int, d: np.float32) -> None:
    x = numba.carray(pointer(src, np.uint16), n)
    o = numba.carray(pointer(dst, np.float32), n)
    for i in range(n):
        o[i] = half_to_float(x[i]) / d


def _format(dtype: np.dtype, allow_f32: bool) -> int:
    if dtype in _FORMATS:
        return _FORMATS[dtype]
    if allow_f32 and dtype == np.float32:
        return -1
    raise TypeError(
        f"expected float16, bfloat16{' or float32' if allow_f32 else ''} data; found {dtype}"
    )


def _address(a: np.ndarray) -> int:
    return int(a.__array_interface__["data"][0])


def fold_rows16(rows: np.ndarray, out: np.ndarray, op: int, divisor: int) -> None:
    """``out[i] = round(rows[0, i] OP rows[1, i] OP ...)``, in float32, in row order.

    ``rows`` (2-D, each row contiguous) and ``out`` (1-D contiguous, as long
    as a row) are float16, bfloat16 or float32, not both float32. ``op`` is
    ``SUM``, ``MEAN`` (the float32 sum divided by ``divisor``), ``MIN`` or
    ``MAX``; the result is rounded once to ``out``'s dtype (not at all for
    float32). ``out`` may be exactly one of the rows.

    Example: ``fold_rows16(recv, mine, SUM, 1)`` (see the module docstring).
    """
    if not (isinstance(rows, np.ndarray) and isinstance(out, np.ndarray)):
        raise TypeError(
            f"fold_rows16: rows and out must be NumPy arrays; found {type(rows).__name__} "
            f"and {type(out).__name__}"
        )
    fmt_in, fmt_out = _format(rows.dtype, True), _format(out.dtype, True)
    if fmt_in < 0 and fmt_out < 0:
        raise TypeError("fold_rows16: rows and out are both float32; use reduce_slots")
    if rows.ndim != 2 or out.ndim != 1 or rows.shape[1] != out.shape[0]:
        raise ValueError(
            f"fold_rows16: rows has shape {rows.shape} and out {out.shape}; expected (n, m) "
            "rows and an out of m elements"
        )
    if (rows.shape[1] > 1 and rows.strides[1] != rows.itemsize) or not out.flags.c_contiguous:
        raise ValueError(
            "fold_rows16: each row and out must be contiguous; pass np.ascontiguousarray copies"
        )
    if op not in (SUM, MEAN, MIN, MAX):
        raise ValueError(f"fold_rows16: op is {op!r}; expected SUM=0, MEAN=1, MIN=2 or MAX=3")
    if op == MEAN and divisor <= 0:
        raise ValueError(f"fold_rows16: MEAN divisor is {divisor}; expected a positive count")
    nrows, count = rows.shape
    if nrows == 0:
        raise ValueError("fold_rows16: rows has no rows; expected at least one")
    if count == 0:
        return
    _fold(
        _address(rows), rows.strides[0], nrows, count, _address(out), op, max(divisor, 1),
        fmt_in, fmt_out,
    )


def fold_addresses(
    src: int, row_bytes: int, nrows: int, count: int, dst: int, op: int, divisor: int,
    dtype: np.dtype,
) -> None:
    """:func:`fold_rows16` on raw addresses, same 16-bit ``dtype`` in and out, unchecked.

    Example: ``fold_addresses(slots, slot_bytes, 2, n, out, SUM, 1, BFLOAT16)``.
    """
    if count > 0:
        fmt = _FORMATS[dtype]
        _fold(src, row_bytes, nrows, count, dst, op, max(divisor, 1), fmt, fmt)


def narrow(x: np.ndarray, out: np.ndarray) -> np.ndarray:
    """``out[...] = x`` rounded to ``out``'s 16-bit dtype (``x``: contiguous float32).

    Example: ``narrow(grads, np.empty(grads.shape, BFLOAT16))``.
    """
    fmt = _format(out.dtype, False)
    if x.dtype != np.float32 or x.shape != out.shape or not (
        x.flags.c_contiguous and out.flags.c_contiguous
    ):
        raise TypeError(
            f"narrow: x is {x.dtype}{x.shape} and out {out.dtype}{out.shape}; expected "
            "contiguous float32 x and a contiguous out of the same shape"
        )
    if x.size:
        (_narrow_bf16 if fmt == BF16 else _narrow_f16)(_address(x), _address(out), x.size)
    return out


def widen(x: np.ndarray, out: np.ndarray, divisor: int = 0) -> np.ndarray:
    """``out[...] = x`` (exact) for a contiguous 16-bit ``x`` and float32 ``out``;
    ``divisor`` > 0: ``out[...] = x / divisor`` in float32, in the same pass (the bits
    of ``np.divide(out, np.float32(divisor), out=out)`` after widening).

    Example: ``widen(wire, np.empty(wire.shape, np.float32))``.
    """
    fmt = _format(x.dtype, False)
    if out.dtype != np.float32 or x.shape != out.shape or not (
        x.flags.c_contiguous and out.flags.c_contiguous
    ):
        raise TypeError(
            f"widen: x is {x.dtype}{x.shape} and out {out.dtype}{out.shape}; expected a "
            "contiguous 16-bit x and a contiguous float32 out of the same shape"
        )
    if not x.size:
        return out
    if divisor > 0:
        kernel = _widen_bf16_divided if fmt == BF16 else _widen_f16_divided
        kernel(_address(x), _address(out), x.size, np.float32(divisor))
    else:
        (_widen_bf16 if fmt == BF16 else _widen_f16)(_address(x), _address(out), x.size)
    return out
