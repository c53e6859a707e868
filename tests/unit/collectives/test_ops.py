"""reduce_arrays and divide_mean against exact references, for every dtype and op."""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from hpcdist.collectives import ReduceOp, reduce_arrays
from hpcdist.collectives.ops import divide_mean

NUMBERS = ["float16", "float32", "float64", "int32", "int64"]
SHAPES = st.sampled_from([(), (0,), (1,), (2,), (7,), (3, 0), (2, 3)])
SETTINGS = settings(deadline=None, max_examples=100)


def _exact(value, dtype):
    """The exact rational of a (finite) number."""
    return Fraction(int(value)) if np.dtype(dtype).kind in "iu" else Fraction(float(value))


def _mean_dtype(dtype) -> np.dtype:
    """MEAN keeps a float dtype and gives float64 for integers (TF's MEAN)."""
    dtype = np.dtype(dtype)
    return np.dtype(np.float64) if dtype.kind in "iu" else dtype


def _rounded(q: Fraction, dtype) -> np.generic:
    """``q`` rounded to nearest in the dtype MEAN gives for ``dtype`` inputs."""
    # num / den is correctly rounded to float64, and a second rounding of a quotient of
    # two float32 (or float16) numbers to float32 (float16) is exact (innocuous).
    return _mean_dtype(dtype).type(q.numerator / q.denominator)


@st.composite
def stacks(draw, dtypes=NUMBERS):
    """1 to 5 arrays of one dtype and shape with small integer values (exact sums)."""
    dtype = draw(st.sampled_from(dtypes))
    shape = draw(SHAPES)
    count = draw(st.integers(1, 5))
    if dtype == "bool":
        elements = st.booleans()
    else:
        elements = st.integers(-100, 100)
    arrays = [draw(hnp.arrays(dtype, shape, elements=elements)).astype(dtype) for _ in range(count)]
    return dtype, shape, arrays


@SETTINGS
@given(stacks(), st.sampled_from(list(ReduceOp)))
def test_reduce_arrays_matches_exact_reference(case, op):
    dtype, shape, arrays = case
    before = [a.copy() for a in arrays]
    out = reduce_arrays(arrays, op)
    wanted = _mean_dtype(dtype) if op is ReduceOp.MEAN else np.dtype(dtype)
    assert out.dtype == wanted and out.shape == shape
    assert all(not np.shares_memory(out, a) for a in arrays)
    for a, b in zip(arrays, before, strict=True):
        np.testing.assert_array_equal(a, b)  # the inputs are untouched
    for index in np.ndindex(shape):
        values = [_exact(a[index], dtype) for a in arrays]
        if op is ReduceOp.MIN:
            expected = np.dtype(dtype).type(min(values))
        elif op is ReduceOp.MAX:
            expected = np.dtype(dtype).type(max(values))
        elif op is ReduceOp.SUM:
            expected = np.dtype(dtype).type(sum(values))
        else:
            expected = _rounded(sum(values) / len(values), dtype)
        assert out[index] == expected, (index, values, out[index], expected)


@SETTINGS
@given(stacks(["bool"]), st.sampled_from([ReduceOp.MIN, ReduceOp.MAX]))
def test_reduce_arrays_of_booleans_is_all_and_any(case, op):
    _, shape, arrays = case
    out = reduce_arrays(arrays, op)
    expected = np.logical_and.reduce(arrays) if op is ReduceOp.MIN else np.logical_or.reduce(arrays)
    assert out.dtype == np.bool_ and out.shape == shape
    np.testing.assert_array_equal(out, expected)


@SETTINGS
@given(stacks(), st.integers(1, 9))
def test_mean_with_explicit_count(case, count):
    dtype, shape, arrays = case
    out = reduce_arrays(arrays, "mean", count=count)
    assert out.dtype == _mean_dtype(dtype)
    for index in np.ndindex(shape):
        total = sum(_exact(a[index], dtype) for a in arrays)
        assert out[index] == _rounded(total / count, dtype)


@SETTINGS
@given(
    st.sampled_from(["int32", "int64"]),
    hnp.array_shapes(min_dims=0, max_dims=2, min_side=0, max_side=5),
    st.integers(1, 1000),
    st.data(),
)
def test_divide_mean_of_integers_is_the_nearest_float64(dtype, shape, count, data):
    info = np.iinfo(dtype)
    total = data.draw(hnp.arrays(dtype, shape, elements=st.integers(info.min, info.max)))
    out = divide_mean(total, count)
    assert out.dtype == np.float64 and out.shape == total.shape
    for index in np.ndindex(total.shape):
        # int / int in Python is correctly rounded; numpy converts the total to float64
        # first, which is exact for int32 and for the int64 values that fit 53 bits.
        value = int(total[index])
        if abs(value) < 2**53:
            assert out[index] == value / count
        else:
            assert out[index] == float(value) / count


@SETTINGS
@given(
    st.sampled_from(["float16", "float32", "float64"]),
    hnp.array_shapes(min_dims=0, max_dims=2, min_side=0, max_side=5),
    st.integers(1, 1000),
    st.data(),
)
def test_divide_mean_rounds_floats_to_nearest(dtype, shape, count, data):
    elements = hnp.from_dtype(np.dtype(dtype), allow_nan=False, allow_infinity=False)
    total = data.draw(hnp.arrays(dtype, shape, elements=elements))
    out = divide_mean(total, count)
    assert out.dtype == np.dtype(dtype) and out.shape == total.shape
    for index in np.ndindex(total.shape):
        expected = _rounded(Fraction(float(total[index])) / count, dtype)
        assert out[index] == expected


def test_mean_of_booleans_and_bad_input_raise():
    with pytest.raises(TypeError, match="boolean"):
        reduce_arrays([np.array([True]), np.array([False])], ReduceOp.SUM)
    with pytest.raises(ValueError, match="same shape"):
        reduce_arrays([np.zeros(2), np.zeros(3)], "SUM")
    with pytest.raises(ValueError, match="at least one"):
        reduce_arrays([], "SUM")
    with pytest.raises(ValueError, match="SUM, MEAN, MIN, MAX"):
        reduce_arrays([np.zeros(2)], "avg")


def test_integer_mean_is_a_float64_mean():
    out = reduce_arrays([np.array([-7, 7, -1], np.int64), np.array([0, 0, 0], np.int64)], "MEAN")
    assert out.dtype == np.float64
    np.testing.assert_array_equal(out, [-3.5, 3.5, -0.5])
