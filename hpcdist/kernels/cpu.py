"""CPU kernels of the fused shared-memory all-reduce: pack, unpack, k-way reduce, scale.

* :func:`gather_bytes` copies many tensors (given by raw data addresses) into
  one flat byte buffer in one call: the fusion *pack*.
* :func:`scatter_bytes` is the inverse *unpack*.
* :func:`reduce_slots` folds the rows of a 2-D slot window element-wise in row
  order (``SUM``, ``MEAN``, ``MIN``, ``MAX``), bitwise reproducible; ``float16``
  and ``bfloat16`` accumulate in ``float32`` and are rounded once
  (:mod:`hpcdist.kernels.fold16`).
* :func:`scale` divides a float array in place.

Each public function checks its arguments in Python (typed errors that say
what was expected and found) and calls an ``@njit(nogil=True, cache=True)``
kernel: one thread (one core per rank), compiled on first use and cached on
disk. ``reduce_slots`` and ``scale`` hand their kernel addresses and byte
strides, so it is compiled once per dtype, whatever the memory layout.

Example:
    >>> import numpy as np
    >>> slots = np.array([[1.0, 2.0, 3.0], [10.0, 20.0, 30.0]], np.float32)
    >>> out = np.zeros(3, np.float32)
    >>> reduce_slots(slots, 0, 3, out, 0, SUM, 1)
    >>> out
    array([11., 22., 33.], dtype=float32)
    >>> a, b = np.arange(3, dtype=np.int16), np.ones(2, np.int16)
    >>> flat = np.zeros(a.nbytes + b.nbytes, np.uint8)
    >>> addrs = np.array([x.__array_interface__["data"][0] for x in (a, b)], np.int64)
    >>> gather_bytes(flat, addrs, np.array([6, 4]), np.array([0, 6]))
    >>> flat.view(np.int16)
    array([0, 1, 2, 1, 1], dtype=int16)
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numba
import numpy as np
from numba import njit, types
from numba.core.extending import overload

from hpcdist.kernels._llvm import memcpy, pointer, stack_block
from hpcdist.kernels.fold16 import BFLOAT16, fold_addresses
from hpcdist.kernels.half import float_to_half, half_to_float

__all__ = ["MAX", "MEAN", "MIN", "SUM", "gather_bytes", "reduce_slots", "scale", "scatter_bytes"]

SUM = 0
MEAN = 1
MIN = 2
MAX = 3

_BLOCK = 2048  # elements per accumulator block: 8 KiB of float32, stays in L1
_JIT = {"nogil": True, "cache": True, "error_model": "numpy"}
_FLOAT_CHARS = frozenset("efdE")
_SUPPORTED_CHARS = frozenset("efdbhilqBHILQ")  # float16/32/64, (u)int8/16/32/64
_BF16_CHAR = "E"  # ml_dtypes.bfloat16: folded by hpcdist.kernels.fold16


# ---------------------------------------------------------------- dtype-level helpers
# Plain functions whose @overload picks an implementation per dtype when compiled.
# ``dt`` is a dtype (``arr.dtype``) or ``np.float16``, which stands for float16
# data held in uint16 arrays (Numba has no float16 arrays on the CPU).
# The @overload functions and their implementations carry type comments, not annotations:
# Numba requires both to have equal signatures, annotations included.
_Impl = Callable[..., Any]  # an implementation: a Python function Numba compiles


def _scalar(dt: types.Type) -> types.Type:
    return dt.dtype if isinstance(dt, (types.DType, types.NumberClass)) else dt


def _widen(x: float, dt: np.dtype | type[np.float16]) -> float:
    raise NotImplementedError


@overload(_widen)
def _widen_impl(x, dt):
    # type: (types.Type, types.Type) -> _Impl
    # half bits (uint16 under a float16 dtype) become float32; anything else stays
    if _scalar(dt) == types.float16 and x == types.uint16:
        return lambda x, dt: half_to_float(x)
    return lambda x, dt: x


def _put(o: np.ndarray, j: int, v: float, dt: np.dtype | type[np.float16]) -> None:
    raise NotImplementedError


@overload(_put)
def _put_impl(o, j, v, dt):
    # type: (types.Type, types.Type, types.Type, types.Type) -> _Impl
    # o[j] = v, rounded to half bits when o holds float16 data
    if _scalar(dt) == types.float16 and o.dtype == types.uint16:

        def put_half(o, j, v, dt):
            # type: (np.ndarray, int, float, np.dtype) -> None
            o[j] = float_to_half(np.float32(v))

        return put_half

    def put(o, j, v, dt):
        # type: (np.ndarray, int, float, np.dtype) -> None
        o[j] = v

    return put


def _divide(v: float, d: int, dt: np.dtype | type[np.float16]) -> float:
    raise NotImplementedError


@overload(_divide)
def _divide_impl(v, d, dt):
    # type: (types.Type, types.Type, types.Type) -> _Impl
    s = _scalar(dt)
    if s in (types.float16, types.float32):
        return lambda v, d, dt: np.float32(v) / np.float32(d)
    if s == types.float64:
        return lambda v, d, dt: np.float64(v) / np.float64(d)
    return lambda v, d, dt: v  # integers: MEAN is rejected before any kernel runs


# ----------------------------------------------------------------------- pack / unpack


@njit(**_JIT)
def _bad_entry(size: int, nbytes: np.ndarray, offsets: np.ndarray) -> int:
    """Index of the first entry outside ``[0, size)`` bytes, or -1."""
    for i in range(nbytes.shape[0]):
        n = nbytes[i]
        o = offsets[i]
        if n < 0 or o < 0 or o + n > size:
            return i
    return -1


@njit(**_JIT)
def _gather(dst: np.ndarray, addrs: np.ndarray, nbytes: np.ndarray, offsets: np.ndarray) -> int:
    bad = _bad_entry(dst.shape[0], nbytes, offsets)
    if bad >= 0:
        return bad
    base = np.int64(dst.ctypes.data)
    for i in range(addrs.shape[0]):
        memcpy(base + offsets[i], addrs[i], nbytes[i])
    return -1


@njit(**_JIT)
def _scatter(src: np.ndarray, addrs: np.ndarray, nbytes: np.ndarray, offsets: np.ndarray) -> int:
    bad = _bad_entry(src.shape[0], nbytes, offsets)
    if bad >= 0:
        return bad
    base = np.int64(src.ctypes.data)
    for i in range(addrs.shape[0]):
        memcpy(addrs[i], base + offsets[i], nbytes[i])
    return -1


def _check_table(
    name: str, buf: np.ndarray, addrs: np.ndarray, nbytes: np.ndarray, offsets: np.ndarray
) -> None:
    if not (
        isinstance(buf, np.ndarray)
        and buf.ndim == 1
        and buf.dtype == np.uint8
        and buf.flags.c_contiguous
    ):
        found = f"{type(buf).__name__} {getattr(buf, 'dtype', '')}{getattr(buf, 'shape', '')}"
        raise TypeError(
            f"{name}: the flat buffer must be a contiguous 1-D uint8 NumPy array; found "
            f"{found}; pass buf.view(np.uint8).reshape(-1) of a contiguous array"
        )
    for label, table in (("addrs", addrs), ("nbytes", nbytes), ("offsets", offsets)):
        if not (isinstance(table, np.ndarray) and table.ndim == 1 and table.dtype.kind in "iu"):
            raise TypeError(
                f"{name}: {label} must be a 1-D integer NumPy array (np.int64); "
                f"found {type(table).__name__}; build it with np.asarray(..., np.int64)"
            )
    if not len(addrs) == len(nbytes) == len(offsets):
        raise ValueError(
            f"{name}: addrs, nbytes and offsets have {len(addrs)}, {len(nbytes)} and "
            f"{len(offsets)} entries; expected one entry per tensor in each"
        )


def _raise_bad_entry(name: str, i: int, size: int, nbytes: np.ndarray, offsets: np.ndarray) -> None:
    o, n = int(offsets[i]), int(nbytes[i])
    raise ValueError(
        f"{name}: tensor {i} spans bytes [{o}, {o + n}) of a flat buffer of {size} bytes; "
        "expected nbytes >= 0, offset >= 0 and offset + nbytes <= len(buffer); nothing was copied"
    )


def gather_bytes(
    dst: np.ndarray, addrs: np.ndarray, nbytes: np.ndarray, offsets: np.ndarray
) -> None:
    """Pack: copy ``nbytes[i]`` bytes from address ``addrs[i]`` to ``dst[offsets[i]:]``.

    ``addrs[i]`` is the data pointer of a C-contiguous array that stays alive
    for the call (``a.__array_interface__['data'][0]``); each copy is one
    ``memcpy`` and sources must not overlap ``dst``. Every range is checked
    against ``dst`` before anything is copied; addresses cannot be checked.

    Example: ``gather_bytes(flat, addrs, nbytes, offsets)`` fills a bucket in one call.
    """
    _check_table("gather_bytes", dst, addrs, nbytes, offsets)
    bad = _gather(dst, addrs, nbytes, offsets)
    if bad >= 0:
        _raise_bad_entry("gather_bytes", bad, dst.shape[0], nbytes, offsets)


def scatter_bytes(
    src: np.ndarray, addrs: np.ndarray, nbytes: np.ndarray, offsets: np.ndarray
) -> None:
    """Unpack: copy ``src[offsets[i]:offsets[i] + nbytes[i]]`` to address ``addrs[i]``.

    The inverse of :func:`gather_bytes`, with the same table and checks.

    Example: ``scatter_bytes(flat, addrs, nbytes, offsets)`` writes every tensor back.
    """
    _check_table("scatter_bytes", src, addrs, nbytes, offsets)
    bad = _scatter(src, addrs, nbytes, offsets)
    if bad >= 0:
        _raise_bad_entry("scatter_bytes", bad, src.shape[0], nbytes, offsets)


# ------------------------------------------------------------------------------ reduce


def _token_dtype(token: np.ndarray) -> np.dtype | type[np.float16]:
    raise NotImplementedError


@overload(_token_dtype)
def _token_dtype_impl(token):
    # type: (types.Type) -> _Impl
    # kernels take a zero-size array whose type names the dtype; a 2-D uint16 one
    # stands for float16 (Numba has no float16 arrays on the CPU)
    if token.ndim == 2:
        return lambda token: np.float16
    return lambda token: token.dtype


def _dtype_token(dtype: np.dtype) -> np.ndarray:
    if dtype.char == "e":
        return np.empty((0, 0), np.uint16)
    return np.empty(0, dtype)


_TOKENS = {c: _dtype_token(np.dtype(c)) for c in _SUPPORTED_CHARS}
_ITEMSIZES = {c: np.dtype(c).itemsize for c in _SUPPORTED_CHARS}


@njit(**_JIT)
def _fold_elementwise(
    src: int,
    row_bytes: int,
    col_bytes: int,
    nrows: int,
    count: int,
    dst: int,
    out_bytes: int,
    op: int,
    divisor: int,
    token: np.ndarray,
) -> None:
    """Any op, any strides, any rows: each element folded over the rows, then written.

    Addresses and strides are in bytes; ``dst`` may be exactly one of the rows.
    """
    dt = _token_dtype(token)
    for i in range(count):
        a = _widen(pointer(src + i * col_bytes, dt)[0], dt)
        for k in range(1, nrows):
            b = _widen(pointer(src + k * row_bytes + i * col_bytes, dt)[0], dt)
            if op == MIN:
                # np.minimum: a NaN in either operand wins (never true for integers)
                a = a if a != a or a <= b else b
            elif op == MAX:
                a = a if a != a or a >= b else b
            else:
                a = a + b
        if op == MEAN:
            a = _divide(a, divisor, dt)
        _put(pointer(dst + i * out_bytes, dt), 0, a, dt)


# The kernels below handle contiguous rows block by block, with vectorised loops
# written out in place (no helper functions: a compiled helper is optimised again
# inside its caller, which doubles compile time). Each is compiled on first use,
# per dtype: a SUM-only program never compiles the MIN/MAX kernel. The in-place
# loops of _fold read and write through one view, so LLVM vectorises them even
# when ``dst`` is one of the rows.


@njit(**_JIT)
def _fold(
    src: int,
    row_bytes: int,
    nrows: int,
    count: int,
    dst: int,
    op: int,
    divisor: int,
    itemsize: int,
    token: np.ndarray,
) -> None:
    """SUM or MEAN of ``nrows >= 2`` contiguous rows at ``src`` into ``dst``.

    The first two rows go straight into ``dst`` unless ``dst`` is a later row
    (exactly: ``dst == src + r * row_bytes``, r >= 2); then the rows before it
    are summed in a stack accumulator first, so its old values are read before
    they are overwritten. One pass over memory per row.
    """
    dt = _token_dtype(token)
    alias = np.int64(-1)
    for k in range(nrows):
        if dst == src + k * row_bytes:
            alias = k
    acc = numba.carray(stack_block(_BLOCK, dt), _BLOCK)
    for b0 in range(0, count, _BLOCK):
        bn = min(_BLOCK, count - b0)
        off = b0 * itemsize
        x = numba.carray(pointer(src + off, dt), bn)
        y = numba.carray(pointer(src + row_bytes + off, dt), bn)
        o = numba.carray(pointer(dst + off, dt), bn)
        if alias >= 2:
            for j in range(bn):
                acc[j] = x[j] + y[j]
            for k in range(2, alias):
                row = numba.carray(pointer(src + k * row_bytes + off, dt), bn)
                for j in range(bn):
                    acc[j] = acc[j] + row[j]
            for j in range(bn):
                o[j] = acc[j] + o[j]  # o is row ``alias``: read, then written
        elif alias == 1:
            for j in range(bn):
                o[j] = x[j] + o[j]
        elif alias == 0:
            for j in range(bn):
                o[j] = o[j] + y[j]
        else:
            for j in range(bn):
                o[j] = x[j] + y[j]
        for k in range(max(2, alias + 1), nrows):
            row = numba.carray(pointer(src + k * row_bytes + off, dt), bn)
            for j in range(bn):
                o[j] = o[j] + row[j]
        if op == MEAN:
            for j in range(bn):
                o[j] = _divide(o[j], divisor, dt)


@njit(**_JIT)
def _fold_minmax(
    src: int,
    row_bytes: int,
    nrows: int,
    count: int,
    dst: int,
    op: int,
    itemsize: int,
    token: np.ndarray,
) -> None:
    """MIN or MAX of ``nrows >= 2`` contiguous rows at ``src`` into ``dst``, block by block.

    Each block is folded in a stack accumulator and written last, so ``dst``
    may be exactly one of the rows. NaN propagates as in ``np.minimum``.
    """
    dt = _token_dtype(token)
    acc = numba.carray(stack_block(_BLOCK, dt), _BLOCK)
    for b0 in range(0, count, _BLOCK):
        bn = min(_BLOCK, count - b0)
        off = b0 * itemsize
        x = numba.carray(pointer(src + off, dt), bn)
        y = numba.carray(pointer(src + row_bytes + off, dt), bn)
        if op == MIN:
            for j in range(bn):
                a = x[j]
                b = y[j]
                acc[j] = a if a != a or a <= b else b
        else:
            for j in range(bn):
                a = x[j]
                b = y[j]
                acc[j] = a if a != a or a >= b else b
        for k in range(2, nrows):
            row = numba.carray(pointer(src + k * row_bytes + off, dt), bn)
            if op == MIN:
                for j in range(bn):
                    a = acc[j]
                    b = row[j]
                    acc[j] = a if a != a or a <= b else b
            else:
                for j in range(bn):
                    a = acc[j]
                    b = row[j]
                    acc[j] = a if a != a or a >= b else b
        o = numba.carray(pointer(dst + off, dt), bn)
        for j in range(bn):
            o[j] = acc[j]


@njit(**_JIT)
def _fold_half(
    src: int, row_bytes: int, nrows: int, count: int, dst: int, op: int, divisor: int
) -> None:
    """:func:`_fold` for float16 bits: each block adds in a float32 accumulator."""
    dt = np.float16
    acc = numba.carray(stack_block(_BLOCK, dt), _BLOCK)
    d = np.float32(divisor)
    for b0 in range(0, count, _BLOCK):
        bn = min(_BLOCK, count - b0)
        off = b0 * 2
        x = numba.carray(pointer(src + off, dt), bn)
        y = numba.carray(pointer(src + row_bytes + off, dt), bn)
        for j in range(bn):
            acc[j] = half_to_float(x[j]) + half_to_float(y[j])
        for k in range(2, nrows):
            row = numba.carray(pointer(src + k * row_bytes + off, dt), bn)
            for j in range(bn):
                acc[j] = acc[j] + half_to_float(row[j])
        o = numba.carray(pointer(dst + off, dt), bn)
        if op == MEAN:
            for j in range(bn):
                o[j] = float_to_half(acc[j] / d)
        else:
            for j in range(bn):
                o[j] = float_to_half(acc[j])


@njit(**_JIT)
def _addresses(a: np.ndarray, b: np.ndarray) -> tuple[int, int]:
    return np.int64(a.ctypes.data), np.int64(b.ctypes.data)


def _describe(a: object) -> str:
    if isinstance(a, np.ndarray):
        return f"{a.dtype} array of shape {a.shape}"
    return type(a).__name__


def reduce_slots(
    slots: np.ndarray, lo: int, hi: int, out: np.ndarray, out_lo: int, op: int, divisor: int
) -> None:
    """``out[out_lo + i - lo] = slots[0, i] OP slots[1, i] OP ... OP slots[n-1, i]``, lo <= i < hi.

    A left fold in row order, so floats are bitwise equal to
    ``functools.reduce(np.add, rows)``. ``op`` is ``SUM``, ``MEAN`` (the sum
    divided by ``divisor``, floats only), ``MIN`` or ``MAX`` (NaN propagates
    as in ``np.minimum``). Integer sums wrap around. ``float16`` accumulates
    in ``float32`` (MEAN divides there too) and rounds once. Rows may have any
    strides (a view into a shared window). ``out`` may be exactly the
    ``[lo, hi)`` range of one row (in place: ``out=slots[r]``, ``out_lo=lo``);
    otherwise it must not overlap ``slots``. Contiguous rows take vectorised
    single passes; one compiled kernel per dtype, cached on disk.

    Example: ``reduce_slots(window[:, :m], 0, m, window[rank, :m], 0, SUM, 1)``.
    """
    if not (
        isinstance(slots, np.ndarray)
        and isinstance(out, np.ndarray)
        and slots.ndim == 2
        and out.ndim == 1
        and slots.dtype == out.dtype
        and (slots.dtype.char in _SUPPORTED_CHARS or slots.dtype == BFLOAT16)
    ):
        raise TypeError(
            f"reduce_slots: slots is {_describe(slots)} and out is {_describe(out)}; expected a "
            "2-D slots array and a 1-D out array of one dtype among bfloat16, float16/32/64 "
            "and (u)int8/16/32/64"
        )
    nrows, m = slots.shape
    if op not in (SUM, MEAN, MIN, MAX):
        raise ValueError(f"reduce_slots: op is {op!r}; expected SUM=0, MEAN=1, MIN=2 or MAX=3")
    if op == MEAN:
        if slots.dtype.char not in _FLOAT_CHARS:
            raise TypeError(
                f"reduce_slots: MEAN needs a float dtype, found {slots.dtype}; "
                "reduce integers with SUM and divide afterwards"
            )
        if divisor <= 0:
            raise ValueError(
                f"reduce_slots: MEAN divisor is {divisor}; expected a positive count of replicas"
            )
    if nrows < 1:
        raise ValueError("reduce_slots: slots has no rows; expected at least one row")
    if not 0 <= lo <= hi <= m:
        raise ValueError(
            f"reduce_slots: lo={lo}, hi={hi} is not a range of the {m} elements of a slot; "
            "expected 0 <= lo <= hi <= slots.shape[1]"
        )
    count = hi - lo
    if out_lo < 0 or out_lo + count > out.shape[0]:
        raise ValueError(
            f"reduce_slots: writing {count} elements at out_lo={out_lo} overruns out of "
            f"{out.shape[0]} elements; expected 0 <= out_lo and out_lo + (hi - lo) <= len(out)"
        )
    if count == 0:
        return
    char = slots.dtype.char
    if char in "eE":  # Numba has no float16 arrays on the CPU: use the bits
        src, dst = _addresses(slots.view(np.uint16), out.view(np.uint16))
    else:
        src, dst = _addresses(slots, out)
    row_bytes, col_bytes = slots.strides
    out_bytes = out.strides[0]
    src += lo * col_bytes
    dst += out_lo * out_bytes
    itemsize = slots.itemsize
    if char == _BF16_CHAR:
        if (count > 1 and col_bytes != 2) or (count > 1 and out_bytes != 2):
            raise ValueError(
                "reduce_slots: bfloat16 rows and out must be contiguous; pass "
                "np.ascontiguousarray copies"
            )
        fold_addresses(src, row_bytes, nrows, count, dst, op, divisor, BFLOAT16)
        return
    if nrows < 2 or col_bytes != itemsize or out_bytes != itemsize or (op > MEAN and char == "e"):
        _fold_elementwise(
            src, row_bytes, col_bytes, nrows, count, dst, out_bytes, op, divisor, _TOKENS[char]
        )
    elif op > MEAN:
        _fold_minmax(src, row_bytes, nrows, count, dst, op, itemsize, _TOKENS[char])
    elif char == "e":
        _fold_half(src, row_bytes, nrows, count, dst, op, divisor)
    else:
        _fold(src, row_bytes, nrows, count, dst, op, divisor, itemsize, _TOKENS[char])


def fold_rows(
    src: int, row_bytes: int, nrows: int, count: int, dst: int, op: int, divisor: int, char: str
) -> None:
    """:func:`reduce_slots` on raw addresses, without its checks (the hot small-message path).

    Folds ``count`` elements of ``nrows`` contiguous rows starting at address
    ``src`` (``row_bytes`` apart) into the contiguous ``dst``, in row order,
    with the same compiled kernels, so the bits equal :func:`reduce_slots`'s.
    ``char`` is the dtype's character (``"f"`` for float32). The caller
    guarantees what :func:`reduce_slots` checks.
    """
    if count <= 0:
        return
    if char == _BF16_CHAR:
        fold_addresses(src, row_bytes, nrows, count, dst, op, divisor, BFLOAT16)
        return
    token = _TOKENS[char]
    itemsize = _ITEMSIZES[char]
    if nrows < 2 or (op > MEAN and char == "e"):
        _fold_elementwise(src, row_bytes, itemsize, nrows, count, dst, itemsize, op, divisor, token)
    elif op > MEAN:
        _fold_minmax(src, row_bytes, nrows, count, dst, op, itemsize, token)
    elif char == "e":
        _fold_half(src, row_bytes, nrows, count, dst, op, divisor)
    else:
        _fold(src, row_bytes, nrows, count, dst, op, divisor, itemsize, token)


# ------------------------------------------------------------------------------- scale


@njit(**_JIT)
def _scale(base: int, n: int, stride: int, divisor: int, itemsize: int, token: np.ndarray) -> None:
    dt = _token_dtype(token)
    if stride == itemsize:
        x = numba.carray(pointer(base, dt), n)
        for i in range(n):
            _put(x, i, _divide(_widen(x[i], dt), divisor, dt), dt)
    else:
        for i in range(n):
            p = pointer(base + i * stride, dt)
            _put(p, 0, _divide(_widen(p[0], dt), divisor, dt), dt)


@njit(**_JIT)
def _address(a: np.ndarray) -> int:
    return np.int64(a.ctypes.data)


def scale(x: np.ndarray, divisor: int) -> None:
    """``x[i] = x[i] / divisor`` in place for a 1-D float array (float16 via float32).

    The division is a true division in the array's dtype (``float32`` for
    ``float16``), as ``reduce_slots`` does for ``MEAN``.

    Example: ``scale(grads, world_size)`` turns a summed gradient into a mean.
    """
    if not (isinstance(x, np.ndarray) and x.ndim == 1 and x.dtype.char in _FLOAT_CHARS):
        raise TypeError(
            f"scale: x is {_describe(x)}; expected a 1-D bfloat16 or float16/32/64 NumPy array"
        )
    if divisor <= 0:
        raise ValueError(f"scale: divisor is {divisor}; expected a positive count")
    if x.shape[0] == 0:
        return
    char = x.dtype.char
    if char == _BF16_CHAR:  # one row folded with MEAN: divided in float32, rounded once
        work = x if x.flags.c_contiguous else x.copy()
        bits = work.view(np.uint16)
        address = int(bits.__array_interface__["data"][0])
        fold_addresses(address, 0, 1, work.shape[0], address, MEAN, divisor, BFLOAT16)
        if work is not x:
            x[...] = work
        return
    base = _address(x.view(np.uint16) if char == "e" else x)
    _scale(base, x.shape[0], x.strides[0], divisor, x.itemsize, _TOKENS[char])
