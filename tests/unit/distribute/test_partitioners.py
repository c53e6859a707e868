"""Partitioners against TF's documented examples and their size guarantees; row layouts."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hpcdist.distribute.partitioners import (
    FixedShardsPartitioner,
    MaxSizePartitioner,
    MinSizePartitioner,
    Partitioner,
    shard_offsets,
    shard_sizes,
)

# -- TF's documented examples ------------------------------------------------------------------


def test_documented_fixed_shards_example():
    assert FixedShardsPartitioner(num_shards=2)([10, 3], np.float32) == [2, 1]


def test_documented_min_size_examples():
    assert MinSizePartitioner(min_shard_bytes=4, max_shards=2)([6, 1], np.float32) == [2, 1]
    assert MinSizePartitioner(min_shard_bytes=4, max_shards=10)([6, 1], np.float32) == [6, 1]


def test_documented_max_size_examples():
    assert MaxSizePartitioner(max_shard_bytes=4)([6, 1], np.float32) == [6, 1]
    assert MaxSizePartitioner(max_shard_bytes=4, max_shards=2)([6, 1], np.float32) == [2, 1]
    assert MaxSizePartitioner(max_shard_bytes=1024)([6, 1], np.float32) == [1, 1]


def test_min_size_defaults_give_one_shard():
    # default max_shards=1: never split, however large
    assert MinSizePartitioner()((1 << 20, 64), "float32") == [1, 1]


# -- details -----------------------------------------------------------------------------------


def test_shard_sizes_and_offsets():
    assert shard_sizes(13, 5) == [3, 3, 3, 2, 2]
    assert shard_sizes(10, 2) == [5, 5]
    assert shard_sizes(2, 4) == [1, 1, 0, 0]
    assert shard_sizes(0, 1) == [0]
    assert shard_offsets([3, 3, 3, 2, 2]) == [0, 3, 6, 9, 11, 13]
    assert shard_offsets([]) == [0]
    with pytest.raises(ValueError, match="num_shards must be a positive integer"):
        shard_sizes(3, 0)
    with pytest.raises(ValueError, match="rows must be a non-negative integer"):
        shard_sizes(-1, 2)
    with pytest.raises(ValueError, match="non-negative integers"):
        shard_offsets([2, -1])


def test_never_more_shards_than_rows():
    assert FixedShardsPartitioner(8)((3, 4), "float64") == [3, 1]
    assert MinSizePartitioner(1, max_shards=100)((5, 2), "int8") == [5, 1]
    assert MaxSizePartitioner(1)((5, 2), "float64") == [5, 1]


def test_other_axes_and_shape_forms():
    assert FixedShardsPartitioner(3)((4, 9), "float32", axis=1) == [1, 3]
    assert FixedShardsPartitioner(3)((4, 9), "float32", axis=-1) == [1, 3]
    # along axis 1 a column is 4 float32 = 16 bytes: 2 columns per 32-byte shard
    assert MaxSizePartitioner(32)((4, 9), "float32", axis=1) == [1, 5]
    assert FixedShardsPartitioner(2)(7, "float32") == [2]

    class TensorShapeLike:
        def as_list(self):
            return [10, 3]

    assert FixedShardsPartitioner(2)(TensorShapeLike(), "float32") == [2, 1]


def test_strings_count_bytes_per_string():
    # 8 strings of 16 bytes (default) under 32 bytes per shard -> 4 shards of 2
    assert MaxSizePartitioner(32)((8,), object) == [4]
    assert MaxSizePartitioner(32, bytes_per_string=32)((8,), object) == [8]
    assert MinSizePartitioner(64, max_shards=10, bytes_per_string=8)((8,), "U5") == [1]


def test_empty_axes_give_one_shard():
    assert FixedShardsPartitioner(4)((0, 3), "float32") == [1, 1]
    assert MinSizePartitioner(1, max_shards=4)((5, 0), "float32") == [1, 1]
    assert MaxSizePartitioner(1)((5, 0), "float32") == [1, 1]


def test_scalar_shapes_are_not_partitionable():
    for p in (FixedShardsPartitioner(2), MinSizePartitioner(), MaxSizePartitioner(4)):
        with pytest.raises(ValueError, match=r"cannot partition a scalar \(shape \(\)\)"):
            p((), "float32")


def test_bad_shapes_and_axes():
    p = FixedShardsPartitioner(2)
    with pytest.raises(ValueError, match="fully defined"):
        p((None, 3), "float32")
    with pytest.raises(ValueError, match="fully defined"):
        p((-1, 3), "float32")
    with pytest.raises(ValueError, match="axis 2 is out of range"):
        p((4, 3), "float32", axis=2)
    with pytest.raises(TypeError, match="axis must be an int"):
        p((4, 3), "float32", axis=0.5)


@pytest.mark.parametrize(
    "make",
    [
        lambda: FixedShardsPartitioner(0),
        lambda: FixedShardsPartitioner(-2),
        lambda: FixedShardsPartitioner(1.5),
        lambda: FixedShardsPartitioner("2"),
        lambda: FixedShardsPartitioner(True),
        lambda: MinSizePartitioner(min_shard_bytes=0),
        lambda: MinSizePartitioner(max_shards=0),
        lambda: MinSizePartitioner(bytes_per_string=-1),
        lambda: MinSizePartitioner(max_shards=None),
        lambda: MaxSizePartitioner(max_shard_bytes=0),
        lambda: MaxSizePartitioner(max_shard_bytes=2.5),
        lambda: MaxSizePartitioner(4, max_shards=0),
        lambda: MaxSizePartitioner(4, bytes_per_string=0),
    ],
)
def test_bad_arguments(make):
    with pytest.raises(ValueError, match="must be a positive integer"):
        make()


def test_numpy_integers_are_accepted():
    assert FixedShardsPartitioner(np.int64(2))((4,), "float32") == [2]
    assert MaxSizePartitioner(np.int32(8), max_shards=np.int64(3))((6,), "float32") == [3]


def test_base_class():
    with pytest.raises(NotImplementedError, match="must implement __call__"):
        Partitioner()((4,), "float32")

    class Halves(Partitioner):
        def __call__(self, shape, dtype, axis=0):
            return [2 if i == axis else 1 for i in range(len(shape))]

    assert Halves()((4, 3), "float32", axis=1) == [1, 2]
    assert "num_shards=3" in repr(FixedShardsPartitioner(3))
    assert "max_shards=None" in repr(MaxSizePartitioner(5))
    assert "min_shard_bytes=7" in repr(MinSizePartitioner(7))


# -- properties --------------------------------------------------------------------------------

DTYPES = st.sampled_from(["int8", "float16", "float32", "float64"])
SHAPES = st.tuples(st.integers(0, 300), st.integers(0, 6))


def _row_bytes(shape, dtype) -> int:
    return shape[1] * np.dtype(dtype).itemsize


@settings(max_examples=150, deadline=None)
@given(SHAPES, DTYPES, st.integers(1, 40))
def test_fixed_property(shape, dtype, n):
    parts = FixedShardsPartitioner(n)(shape, dtype)
    assert parts == [max(1, min(n, shape[0])), 1]
    sizes = shard_sizes(shape[0], parts[0])
    assert sum(sizes) == shape[0] and max(sizes) - min(sizes) <= 1


@settings(max_examples=200, deadline=None)
@given(SHAPES, DTYPES, st.integers(1, 2000), st.integers(1, 40))
def test_min_size_property(shape, dtype, min_bytes, max_shards):
    rows, row_bytes = shape[0], _row_bytes(shape, dtype)
    n = MinSizePartitioner(min_bytes, max_shards=max_shards)(shape, dtype)[0]
    assert 1 <= n <= max(1, min(max_shards, rows))
    if rows * row_bytes >= min_bytes and row_bytes > 0:
        # every shard, the smallest included, holds at least min_bytes ...
        assert min(shard_sizes(rows, n)) * row_bytes >= min_bytes
        # ... and one more shard would break that (as many shards as possible)
        if n < min(max_shards, rows):
            assert min(shard_sizes(rows, n + 1)) * row_bytes < min_bytes
    else:
        assert n == 1


@settings(max_examples=200, deadline=None)
@given(SHAPES, DTYPES, st.integers(1, 2000), st.none() | st.integers(1, 40))
def test_max_size_property(shape, dtype, max_bytes, max_shards):
    rows, row_bytes = shape[0], _row_bytes(shape, dtype)
    n = MaxSizePartitioner(max_bytes, max_shards=max_shards)(shape, dtype)[0]
    assert 1 <= n <= max(1, rows)
    if max_shards is not None:
        assert n <= max_shards
    if rows == 0 or row_bytes == 0:
        assert n == 1
        return
    unbounded = math.ceil(rows / max(1, max_bytes // row_bytes))
    if row_bytes <= max_bytes and (max_shards is None or max_shards >= unbounded):
        # every shard fits, and one shard fewer would not (as few shards as possible)
        assert max(shard_sizes(rows, n)) * row_bytes <= max_bytes
        if n > 1:
            assert max(shard_sizes(rows, n - 1)) * row_bytes > max_bytes
    elif row_bytes > max_bytes:
        assert n == (rows if max_shards is None else min(rows, max_shards))
    else:
        assert n == max_shards
