"""Half <-> float conversions against NumPy, bit for bit."""

from __future__ import annotations

import numpy as np
import pytest
from numba import njit

from hpcdist.kernels.half import float_to_half, half_to_float


@njit(cache=True)
def _to_float(bits, out):
    for i in range(bits.size):
        out[i] = half_to_float(bits[i])


@njit(cache=True)
def _to_half(values, out):
    for i in range(values.size):
        out[i] = float_to_half(values[i])


def _numpy_to_half(values: np.ndarray) -> np.ndarray:
    with np.errstate(all="ignore"):
        return values.astype(np.float16).view(np.uint16)


ALL_HALVES = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)


def test_half_to_float_matches_numpy_on_all_65536_patterns():
    got = np.empty(ALL_HALVES.size, np.float32)
    _to_float(ALL_HALVES, got)
    expected = ALL_HALVES.view(np.float16).astype(np.float32)
    # NaN payloads included: compare bit patterns, not values
    np.testing.assert_array_equal(got.view(np.uint32), expected.view(np.uint32))


def test_float_to_half_round_trips_every_half():
    floats = ALL_HALVES.view(np.float16).astype(np.float32)
    got = np.empty(floats.size, np.uint16)
    _to_half(floats, got)
    np.testing.assert_array_equal(got, ALL_HALVES)


def test_float_to_half_rounds_ties_to_even_and_neighbours():
    # every midpoint between adjacent finite halves, and one float32 ulp either side of it
    finite = ALL_HALVES.view(np.float16)
    finite = np.sort(finite[np.isfinite(finite)].astype(np.float64))
    mids = ((finite[:-1] + finite[1:]) / 2).astype(np.float32)  # exact in float32
    below = np.nextafter(mids, np.float32(-np.inf))
    above = np.nextafter(mids, np.float32(np.inf))
    top = np.float32(65520.0)  # the midpoint between the largest half and infinity
    edges = np.array([top, np.nextafter(top, np.float32(0)), 1e-8, -1e-8, 2.0**-25, 2.0**-24])
    values = np.concatenate([mids, below, above, edges.astype(np.float32)])
    got = np.empty(values.size, np.uint16)
    _to_half(values, got)
    np.testing.assert_array_equal(got, _numpy_to_half(values))


@pytest.mark.parametrize("seed", [0, 1])
def test_float_to_half_matches_numpy_on_random_bit_patterns(seed):
    rng = np.random.default_rng(seed)
    values = rng.integers(0, 1 << 32, size=1 << 20, dtype=np.uint64).astype(np.uint32)
    # and the NaN and infinity encodings with small and large payloads
    specials = np.array(
        [0x7F800000, 0xFF800000, 0x7F800001, 0xFF802000, 0x7FC00000, 0x7FFFFFFF, 0x7F801FFF],
        np.uint32,
    )
    values = np.concatenate([values, specials]).view(np.float32)
    got = np.empty(values.size, np.uint16)
    _to_half(values, got)
    np.testing.assert_array_equal(got, _numpy_to_half(values))
