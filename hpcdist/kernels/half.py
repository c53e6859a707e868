"""IEEE half-precision and bfloat16 conversions for Numba CPU code, bit-exact with NumPy.

Numba has no ``float16`` arithmetic on the CPU, so kernels hold half floats as
``uint16`` bit patterns and convert with :func:`half_to_float` and
:func:`float_to_half`. Both are branch-light integer code that LLVM vectorises;
rounding is to nearest, ties to even; infinities, NaNs (payload kept the way
NumPy keeps it) and subnormals are exact, so results equal NumPy's
``astype`` bit for bit. :func:`bfloat16_to_float` and :func:`float_to_bfloat16`
do the same for bfloat16 (``ml_dtypes.bfloat16``, the top 16 bits of a float32).

Example:
    >>> import numpy as np
    >>> bits = np.array([1.5, -2.0], np.float16).view(np.uint16)
    >>> [float(half_to_float(b)) for b in bits]
    [1.5, -2.0]
    >>> int(float_to_half(np.float32(1.5))) == int(bits[0])
    True
"""

from __future__ import annotations

import numpy as np
from numba import njit

from hpcdist.kernels._llvm import f32_bits, f32_from_bits

__all__ = ["bfloat16_to_float", "float_to_bfloat16", "float_to_half", "half_to_float"]

# Both conversions are written without branches (every case is computed and the
# right one picked with bit masks) so that LLVM vectorises loops that call them.
# Numba does integer arithmetic in 64 bits; values stay below 2**32 except where
# masked back explicitly.

_LOW32 = 0xFFFFFFFF
_EXP_MASK = 0x0F800000  # half exponent field, shifted to the float32 exponent position
_REBIAS = (127 - 15) << 23
_SUBNORMAL_MAGIC = 113 << 23  # 2**-14 as float32 bits


@njit(nogil=True, cache=True)
def _mask(cond: bool) -> int:
    # all ones (32 bits) when cond, else 0
    return (0 - np.int64(cond)) & _LOW32


@njit(nogil=True, cache=True)
def half_to_float(bits: np.uint16) -> np.float32:
    """The ``float32`` value of the half float with bit pattern ``bits`` (exact).

    Example: ``half_to_float(np.uint16(0x3C00))`` is ``1.0``.
    """
    h = np.int64(bits)
    o = ((h & 0x7FFF) << 13) + _REBIAS
    exp = (h << 13) & _EXP_MASK
    # infinity or NaN: exponent all ones, mantissa (payload) kept
    o = o + (_mask(exp == _EXP_MASK) & _REBIAS)
    # zero or subnormal: renormalise with one float subtraction
    sub = f32_from_bits(np.uint32(o + (1 << 23))) - f32_from_bits(np.uint32(_SUBNORMAL_MAGIC))
    is_sub = _mask(exp == 0)
    o = (o & ~is_sub) | (np.int64(f32_bits(sub)) & is_sub)
    return f32_from_bits(np.uint32((o | ((h & 0x8000) << 16)) & _LOW32))


_F32_INF = 0x7F800000
_F16_OVERFLOW = (127 + 16) << 23  # 65536.0: every finite float32 at or above it is inf
_F16_MIN_NORMAL = 113 << 23  # 2**-14
_DENORM_MAGIC = 126 << 23  # 0.5: adding it rounds to the half subnormal grid
_NORMAL_BIAS = ((15 - 127) << 23) + 0xFFF


@njit(nogil=True, cache=True)
def float_to_half(value: np.float32) -> np.uint16:
    """The bit pattern of ``value`` rounded to half precision (nearest, ties to even).

    Overflow gives infinity; a NaN stays a NaN with the top of its payload, as
    NumPy's ``astype(np.float16)`` does.

    Example: ``float_to_half(np.float32(1.0))`` is ``0x3C00``.
    """
    bits = np.int64(f32_bits(np.float32(value)))
    sign = bits & 0x80000000
    u = bits ^ sign
    # NaN keeps the top of its payload, and stays a NaN when that is zero
    nan = 0x7C00 | ((u >> 13) & 0x3FF)
    nan = nan + np.int64(nan == 0x7C00)
    big_mask = _mask(u > _F32_INF)
    big = (nan & big_mask) | (0x7C00 & ~big_mask)
    # subnormal (and zero): one float addition rounds to the subnormal grid
    sub_f = f32_from_bits(np.uint32(u)) + f32_from_bits(np.uint32(_DENORM_MAGIC))
    sub = (np.int64(f32_bits(sub_f)) - _DENORM_MAGIC) & _LOW32
    # normal: rebias the exponent and round the mantissa to nearest even
    normal = (((u + _NORMAL_BIAS) & _LOW32) + ((u >> 13) & 1)) >> 13
    sub_mask = _mask(u < _F16_MIN_NORMAL)
    small = (sub & sub_mask) | (normal & ~sub_mask)
    big_mask = _mask(u >= _F16_OVERFLOW)
    o = (big & big_mask) | (small & ~big_mask)
    return np.uint16((o | (sign >> 16)) & 0xFFFF)


# bfloat16 is the top half of a float32: widening is a shift, narrowing rounds the
# low 16 bits away to nearest, ties to even. NaN becomes the quiet NaN 0x7FC0 with its
# sign, infinities stay, subnormals are kept (as ml_dtypes does).

_BF16_QUIET_NAN = 0x7FC0


@njit(nogil=True, cache=True)
def bfloat16_to_float(bits: np.uint16) -> np.float32:
    """The ``float32`` value of the bfloat16 with bit pattern ``bits`` (exact).

    Example: ``bfloat16_to_float(np.uint16(0x3F80))`` is ``1.0``.
    """
    return f32_from_bits(np.uint32((np.int64(bits) << 16) & _LOW32))


@njit(nogil=True, cache=True)
def float_to_bfloat16(value: np.float32) -> np.uint16:
    """The bit pattern of ``value`` rounded to bfloat16 (nearest, ties to even).

    Bit-exact with ``ml_dtypes``' ``astype(bfloat16)``: overflow gives
    infinity, a NaN gives the quiet NaN ``0x7FC0`` with the NaN's sign.

    Example: ``float_to_bfloat16(np.float32(1.0))`` is ``0x3F80``.
    """
    bits = np.int64(f32_bits(np.float32(value)))
    nan = ((bits >> 16) & 0x8000) | _BF16_QUIET_NAN
    rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16) & 0xFFFF
    is_nan = _mask((bits & 0x7FFFFFFF) > _F32_INF)
    return np.uint16(((nan & is_nan) | (rounded & ~is_nan)) & 0xFFFF)
