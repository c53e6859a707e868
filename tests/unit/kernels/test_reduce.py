"""reduce_slots and scale against NumPy references, for every dtype and op."""

from __future__ import annotations

import functools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hpcdist.kernels import MAX, MEAN, MIN, SUM, reduce_slots, scale

DTYPES = [
    "float16", "float32", "float64",
    "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
]  # fmt: skip
OPS = [SUM, MEAN, MIN, MAX]
SIZES = [0, 1, 2, 3, 5, 7, 13, 31, 2053, 4099]  # primes; 2053 and 4099 cross accumulator blocks
_NUMPY_OP = {SUM: np.add, MEAN: np.add, MIN: np.minimum, MAX: np.maximum}


def _values(dtype: np.dtype, shape: tuple[int, ...], seed: int, special: bool) -> np.ndarray:
    rng = np.random.default_rng(seed)
    if dtype.kind == "f":
        big = 3e4 if dtype.itemsize == 2 else 1e30  # float16 sums overflow to inf
        x = rng.standard_normal(shape) * rng.choice([1.0, 1e-6, big], size=shape)
        if special and x.size:
            flat = x.reshape(-1)
            picks = rng.integers(0, flat.size, size=max(1, flat.size // 50))
            flat[picks] = rng.choice([np.inf, -np.inf, np.nan, 0.0, -0.0], size=picks.size)
        with np.errstate(over="ignore"):
            return x.astype(dtype)
    info = np.iinfo(dtype)
    return rng.integers(info.min, info.max, size=shape, endpoint=True, dtype=dtype)


def _reference(rows: list[np.ndarray], op: int, divisor: int, dtype: np.dtype) -> np.ndarray:
    if dtype == np.float16:
        rows = [r.astype(np.float32) for r in rows]
    with np.errstate(all="ignore"):
        acc = functools.reduce(_NUMPY_OP[op], rows)
        if op == MEAN:
            acc = acc / acc.dtype.type(divisor)
        return acc.astype(dtype)


def _assert_same(got: np.ndarray, expected: np.ndarray, op: int) -> None:
    np.testing.assert_array_equal(got, expected)  # NaN == NaN, -0.0 == 0.0
    if got.dtype.kind == "f" and op in (SUM, MEAN):
        # left fold in row order: the same bits as functools.reduce(np.add, rows)
        keep = ~np.isnan(expected)
        bits = f"uint{8 * got.itemsize}"
        np.testing.assert_array_equal(got[keep].view(bits), expected[keep].view(bits))


@settings(deadline=None, max_examples=250)
@given(
    dtype=st.sampled_from(DTYPES),
    op=st.sampled_from(OPS),
    n=st.integers(2, 5),
    m=st.sampled_from(SIZES),
    pad=st.integers(1, 9),
    data=st.data(),
)
def test_reduce_matches_numpy_fold(dtype, op, n, m, pad, data):
    dtype = np.dtype(dtype)
    if op == MEAN and dtype.kind != "f":
        op = SUM
    lo = data.draw(st.integers(0, m), label="lo")
    hi = data.draw(st.integers(lo, m), label="hi")
    in_place = data.draw(st.booleans(), label="in_place")
    special = data.draw(st.booleans(), label="special")
    divisor = data.draw(st.integers(1, 7), label="divisor")
    window = _values(dtype, (n, m + pad), seed=m * 31 + n, special=special)
    slots = window[:, :m]  # rows strided by the slot width, as in a shared window
    rows = [slots[k, lo:hi].copy() for k in range(n)]
    expected = _reference(rows, op, divisor, dtype)
    if in_place:
        row = data.draw(st.integers(0, n - 1), label="row")
        before = window.copy()
        reduce_slots(slots, lo, hi, slots[row], lo, op, divisor)
        _assert_same(slots[row, lo:hi], expected, op)
        untouched = np.ones(window.shape, bool)
        untouched[row, lo:hi] = False
        np.testing.assert_array_equal(window[untouched], before[untouched])
    else:
        out_lo = data.draw(st.integers(0, 3), label="out_lo")
        out = np.full(out_lo + (hi - lo) + 2, 7, dtype)
        reduce_slots(slots, lo, hi, out, out_lo, op, divisor)
        _assert_same(out[out_lo : out_lo + hi - lo], expected, op)
        assert (out[:out_lo] == 7).all() and (out[out_lo + hi - lo :] == 7).all()


@settings(deadline=None, max_examples=80)
@given(
    dtype=st.sampled_from(["float16", "float32", "int8"]),
    op=st.sampled_from(OPS),
    n=st.integers(1, 4),
    m=st.sampled_from(SIZES),
    col_step=st.sampled_from([1, 2, 3]),
    out_step=st.sampled_from([1, 3]),
    full_width=st.booleans(),
)
def test_reduce_any_strides_and_single_row(dtype, op, n, m, col_step, out_step, full_width):
    dtype = np.dtype(dtype)
    if op == MEAN and dtype.kind != "f":
        op = MAX
    width = m * col_step + (0 if full_width else 5)
    window = _values(dtype, (n, width), seed=m + n, special=True)
    slots = window[:, : m * col_step : col_step]
    out_buf = np.zeros(max(1, m * out_step), dtype)
    out = out_buf[::out_step][:m]
    expected = _reference([slots[k].copy() for k in range(n)], op, 3, dtype)
    reduce_slots(slots, 0, m, out, 0, op, 3)
    _assert_same(out, expected, op)


def test_in_place_with_strided_rows_reads_every_row_before_writing():
    window = np.arange(24, dtype=np.float64).reshape(3, 8)
    slots = window[:, ::2]  # 3 rows of 4 elements, column stride 16 bytes
    expected = slots[0] + slots[1] + slots[2]
    reduce_slots(slots, 0, 4, slots[1], 0, SUM, 1)
    np.testing.assert_array_equal(slots[1], expected)


def test_float16_accumulates_in_float32_and_rounds_once():
    # 2048 + 1 + 1 in float16 steps is 2048 (each +1 rounds away); in float32 it is 2050
    slots = np.array([[2048.0], [1.0], [1.0]], np.float16)
    out = np.zeros(1, np.float16)
    reduce_slots(slots, 0, 1, out, 0, SUM, 1)
    assert out[0] == 2050.0
    reduce_slots(slots, 0, 1, out, 0, MEAN, 3)
    assert out[0] == np.float16(np.float32(2050.0) / np.float32(3))


def test_integer_sum_wraps_like_numpy():
    slots = np.array([[120, -128], [10, -1]], np.int8)
    out = np.zeros(2, np.int8)
    reduce_slots(slots, 0, 2, out, 0, SUM, 1)
    assert out.tolist() == [-126, 127]


def test_min_max_propagate_nan_from_any_row():
    slots = np.array([[1.0, np.nan, 3.0], [np.nan, 2.0, 0.0]], np.float32)
    out = np.zeros(3, np.float32)
    reduce_slots(slots, 0, 3, out, 0, MIN, 1)
    np.testing.assert_array_equal(out, [np.nan, np.nan, 0.0])
    reduce_slots(slots, 0, 3, out, 0, MAX, 1)
    np.testing.assert_array_equal(out, [np.nan, np.nan, 3.0])


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"lo": 2, "hi": 1}, ValueError, "lo=2, hi=1 is not a range of the 4 elements"),
        ({"hi": 5}, ValueError, "lo=0, hi=5"),
        ({"out_lo": 2}, ValueError, "writing 4 elements at out_lo=2 overruns out of 4"),
        ({"op": 7}, ValueError, "op is 7; expected SUM=0"),
        ({"op": MEAN, "divisor": 0}, ValueError, "MEAN divisor is 0"),
        ({"out": np.zeros(4, np.float64)}, TypeError, "out is float64 array"),
        ({"slots": np.zeros(4, np.float32)}, TypeError, "expected a 2-D slots array"),
        (
            {"slots": np.zeros((2, 4), bool), "out": np.zeros(4, bool)},
            TypeError,
            "among bfloat16, float16",
        ),
        (
            {"slots": np.zeros((2, 4), np.int32), "out": np.zeros(4, np.int32), "op": MEAN},
            TypeError,
            "MEAN needs a float dtype, found int32",
        ),
        ({"slots": np.zeros((0, 4), np.float32)}, ValueError, "no rows"),
    ],
)
def test_reduce_rejects_bad_arguments(kwargs, error, match):
    args = {
        "slots": np.zeros((2, 4), np.float32),
        "lo": 0,
        "hi": 4,
        "out": np.zeros(4, np.float32),
        "out_lo": 0,
        "op": SUM,
        "divisor": 1,
    }
    args.update(kwargs)
    with pytest.raises(error, match=match):
        reduce_slots(**args)


@pytest.mark.parametrize("dtype", ["float16", "float32", "float64"])
@pytest.mark.parametrize("step", [1, 2])
def test_scale_divides_in_place(dtype, step):
    x = _values(np.dtype(dtype), (2 * 4099,), seed=3, special=True)[::step]
    work = np.float32 if dtype == "float16" else dtype
    with np.errstate(all="ignore"):
        expected = (x.astype(work) / np.dtype(work).type(7)).astype(dtype)
    scale(x, 7)
    _assert_same(x, expected, MEAN)


def test_scale_rejects_integers_and_bad_divisors():
    with pytest.raises(TypeError, match="int32 array"):
        scale(np.ones(3, np.int32), 2)
    with pytest.raises(ValueError, match="divisor is 0"):
        scale(np.ones(3, np.float32), 0)
