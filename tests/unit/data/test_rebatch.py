"""Rebatching: TF's G/W/R split table, its invariants, and partial and empty batches."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hpcdist.data.dataset import Dataset, TensorSpec
from hpcdist.data.rebatch import (
    batch_dim,
    batch_sizes_for_worker,
    empty_from_spec,
    empty_like_batch,
    find_global_batch_size,
    rebatch_steps,
    split_batch,
    worker_sub_batches,
)

# (G, W, R, w) -> worker w's sizes. The first row is TF's documented example.
SPLIT_TABLE = [
    (7, 2, 2, 0, [2, 2, 2, 1]),
    (7, 2, 2, 1, [2, 1, 2, 2]),
    (8, 1, 2, 0, [4, 4]),
    (2, 1, 2, 0, [1, 1]),
    (5, 1, 2, 0, [3, 2]),
    (3, 1, 4, 0, [1, 1, 1, 0]),
    (0, 1, 3, 0, [0, 0, 0]),
    (10, 4, 1, 0, [3, 3, 2, 2]),
    (10, 4, 1, 1, [3, 2, 2, 3]),
    (10, 4, 1, 2, [2, 2, 3, 3]),
    (10, 4, 1, 3, [2, 3, 3, 2]),
    (9, 3, 2, 0, [2, 2, 2, 1, 1, 1]),
    (9, 3, 2, 1, [2, 1, 1, 1, 2, 2]),
    (9, 3, 2, 2, [1, 1, 2, 2, 2, 1]),
    (1, 2, 2, 0, [1, 0, 0, 0]),
    (1, 2, 2, 1, [0, 0, 1, 0]),
    (64, 2, 4, 1, [8] * 8),
]


@pytest.mark.parametrize(("g", "w_count", "r", "w", "expected"), SPLIT_TABLE)
def test_split_table(g, w_count, r, w, expected):
    assert batch_sizes_for_worker(g, w_count, r, w) == expected


@settings(deadline=None, max_examples=100)
@given(g=st.integers(0, 300), w_count=st.integers(1, 6), r=st.integers(1, 5))
def test_split_invariants(g, w_count, r):
    n = w_count * r
    lists = [batch_sizes_for_worker(g, w_count, r, w) for w in range(w_count)]
    for sizes in lists:
        assert len(sizes) == n and sum(sizes) == g  # (A) and (B)
        assert max(sizes) - min(sizes) <= 1  # (D)
    # (C): workers reading their lists R at a time consume G elements per step.
    for step in range(w_count):
        assert sum(sum(s[step * r : (step + 1) * r]) for s in lists) == g
    # DATA: worker w's first R sizes are global sub-batches w*R .. w*R+R-1.
    for w, sizes in enumerate(lists):
        assert sizes[:r] == lists[0][w * r : (w + 1) * r]


@pytest.mark.parametrize(
    ("args", "error", "match"),
    [
        ((-1, 1, 1, 0), ValueError, "global_batch_size must be >= 0"),
        ((4, 0, 1, 0), ValueError, "num_workers must be >= 1"),
        ((4, 1, 0, 0), ValueError, "num_replicas_per_worker must be >= 1"),
        ((4, 2, 1, 2), ValueError, "worker_index is 2 but there are 2 workers"),
        ((4.0, 1, 1, 0), TypeError, "global_batch_size must be an int"),
        ((4, True, 1, 0), TypeError, "num_workers must be an int"),
    ],
)
def test_split_rejects_bad_arguments(args, error, match):
    with pytest.raises(error, match=match):
        batch_sizes_for_worker(*args)


def test_split_batch_cuts_every_leaf_into_views():
    x = np.arange(10).reshape(5, 2)
    element = {"x": x, "y": (np.arange(5), np.arange(5.0))}
    pieces = split_batch(element, [2, 2, 1])
    assert [p["x"].shape for p in pieces] == [(2, 2), (2, 2), (1, 2)]
    assert pieces[2]["y"][1].tolist() == [4.0]
    assert np.shares_memory(pieces[1]["x"], x)
    with pytest.raises(ValueError, match="do not add up to the batch size 5"):
        split_batch(element, [2, 2])


def test_batch_dim_errors_are_explained():
    assert batch_dim((np.zeros((3, 1)), np.zeros(3))) == 3
    with pytest.raises(ValueError, match="different first dimensions \\[2, 3\\]"):
        batch_dim((np.zeros(2), np.zeros(3)))
    with pytest.raises(ValueError, match="without a batch dimension"):
        batch_dim({"x": np.float32(1.0)})


def test_empty_batches_keep_dtype_and_trailing_shape():
    empty = empty_like_batch({"img": np.ones((4, 3, 2), np.float32), "label": np.arange(4)})
    assert empty["img"].shape == (0, 3, 2) and empty["img"].dtype == np.float32
    assert empty["label"].shape == (0,) and empty["label"].dtype == np.int64
    spec = (TensorSpec((None, 5), np.dtype("float16")), TensorSpec((None, None), np.dtype("int8")))
    a, b = empty_from_spec(spec)
    assert (a.shape, a.dtype, b.shape, b.dtype) == ((0, 5), np.float16, (0, 0), np.int8)


def test_worker_sub_batches_of_a_partial_batch_give_empties():
    # 3 elements over W=2 x R=2: global split [1, 1, 1, 0]; worker 1 keeps [1, 0].
    part = worker_sub_batches(np.array([10, 11, 12]), 2, 2, 1, own_part_only=True)
    assert [p.tolist() for p in part] == [[12], []]
    assert part[1].dtype == np.int64
    # All four in worker 1's rotated order (FILE/OFF reading): [1, 0, 1, 1].
    every = worker_sub_batches(np.array([10, 11, 12]), 2, 2, 1, own_part_only=False)
    assert [p.tolist() for p in every] == [[10], [], [11], [12]]


@settings(deadline=None, max_examples=100)
@given(
    batches=st.lists(st.integers(0, 20), min_size=1, max_size=5),
    w_count=st.integers(1, 4),
    r=st.integers(1, 3),
)
def test_data_sharding_partitions_every_batch(batches, w_count, r):
    elements, start = [], 0
    for b in batches:
        elements.append(np.arange(start, start + b))
        start += b
    seen = []
    for w in range(w_count):
        steps = list(rebatch_steps(elements, w_count, r, w, own_part_only=True))
        assert len(steps) == len(elements) and all(len(s) == r for s in steps)
        seen += [int(v) for step in steps for sub in step for v in sub]
    assert sorted(seen) == list(range(start))


@settings(deadline=None, max_examples=100)
@given(
    batches=st.lists(st.integers(0, 20), min_size=1, max_size=5),
    w_count=st.integers(1, 4),
    r=st.integers(1, 3),
    w=st.integers(0, 3),
)
def test_stream_rebatching_keeps_order_and_everything(batches, w_count, r, w):
    w = w % w_count
    elements, start = [], 0
    for b in batches:
        elements.append(np.arange(start, start + b))
        start += b
    steps = list(rebatch_steps(elements, w_count, r, w, own_part_only=False))
    assert len(steps) == len(elements) * w_count and all(len(s) == r for s in steps)
    flat = [int(v) for step in steps for sub in step for v in sub]
    assert flat == list(range(start))


def test_find_global_batch_size_uses_the_last_batch():
    assert find_global_batch_size(Dataset.range(10).batch(4).map(lambda x: x * 2)) == 4
    assert find_global_batch_size(Dataset.range(10).batch(2).unbatch().batch(5).take(1)) == 5


def test_unbatched_dataset_raises_tf_error():
    expected = r"not batched: no \.batch\(\).*RangeDataset -> MapDataset"
    with pytest.raises(ValueError, match=expected):
        find_global_batch_size(Dataset.range(4).map(lambda x: x))
