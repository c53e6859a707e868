"""Fusion layouts: groups per dtype, buckets, copy tables; and the backend choice."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hpcdist.collectives import choice
from hpcdist.collectives.fusion import BufferPool, addresses, build_layout, unfuse, wire_dtype
from hpcdist.collectives.ops import ReduceOp
from hpcdist.collectives.options import CommunicationImplementation as CI
from hpcdist.kernels import gather_bytes


def _pack(bucket, items, size):
    out = np.zeros(size, np.uint8)
    base = addresses(items)
    gather_bytes(out, base[bucket.tensor] + bucket.src, bucket.nbytes, bucket.dst)
    return out


@settings(deadline=None, max_examples=60)
@given(
    sizes=st.lists(st.integers(0, 40), min_size=0, max_size=8),
    bucket=st.sampled_from([0, 64, 128, 256, 1000]),
)
def test_buckets_cover_every_byte_once_in_order(sizes, bucket):
    items = [np.arange(n, dtype=np.float32) + 100 * i for i, n in enumerate(sizes)]
    layout = build_layout(items, ReduceOp.SUM, bucket, "t")
    expected = np.concatenate(items) if items else np.zeros(0, np.float32)
    if not items:
        assert layout.groups == ()
        return
    (group,) = layout.groups
    assert group.total == expected.size
    got = []
    for b in group.buckets:
        assert b.hi > b.lo
        if bucket:
            assert (b.hi - b.lo) * 4 <= max(64, bucket // 64 * 64)
        got.append(_pack(b, items, (b.hi - b.lo) * 4).view(np.float32))
    joined = np.concatenate(got) if got else np.zeros(0, np.float32)
    np.testing.assert_array_equal(joined, expected)
    whole = _pack(group.whole, items, group.total * 4).view(np.float32)
    np.testing.assert_array_equal(whole, expected)


def test_groups_by_dtype_and_views_back_into_shapes():
    items = [
        np.ones((2, 3), np.float32),
        np.arange(4, dtype=np.int64),
        np.full(3, 2.0, np.float32),
        np.array([1 + 2j, 3 - 1j], np.complex64),
        np.array([True, False]),
    ]
    layout = build_layout(items[:4], ReduceOp.SUM, 0, "sig")
    assert [g.wire for g in layout.groups] == [np.float32, np.int64, np.float32]
    assert [g.dtype for g in layout.groups] == [np.float32, np.int64, np.complex64]
    assert layout.groups[2].total == 4  # complex as pairs of floats
    results: list = [None] * 4
    for g in layout.groups:
        unfuse(g, _pack(g.whole, items, g.total * g.wire.itemsize).view(g.wire), layout.shapes,
               results)
    for got, want in zip(results, items[:4], strict=True):
        assert got.dtype == want.dtype and got.shape == want.shape
        np.testing.assert_array_equal(got, want)
    bools = build_layout([items[4]], ReduceOp.MIN, 0, "b")
    assert bools.groups[0].wire == np.uint8
    assert layout.digest == build_layout(items[:4], ReduceOp.SUM, 0, "sig").digest


@pytest.mark.parametrize(
    "dtype, op, message",
    [
        ("bool", ReduceOp.SUM, "boolean"),
        ("complex64", ReduceOp.MAX, "complex"),
        ("float128" if hasattr(np, "float128") else "longdouble", ReduceOp.SUM, "not supported"),
    ],
)
def test_wire_dtype_rejects_what_cannot_be_reduced(dtype, op, message):
    with pytest.raises(TypeError, match=message):
        wire_dtype(np.dtype(dtype), op)


def test_choice_rules_and_environment_override():
    assert choice.choose(CI.AUTO, nodes=1, ranks=4, largest_node=4, environ={}) is CI.SHM
    assert choice.choose(CI.AUTO, nodes=2, ranks=4, largest_node=2, environ={}) is CI.HIERARCHICAL
    assert choice.choose(CI.AUTO, nodes=4, ranks=4, largest_node=1, environ={}) is CI.MPI
    assert choice.choose(CI.SHM, nodes=2, ranks=4, largest_node=2, environ={}) is CI.HIERARCHICAL
    assert choice.choose(CI.RING, nodes=1, ranks=2, largest_node=2, environ={}) is CI.MPI
    env = {"HPCDIST_COLLECTIVES": "Hierarchical"}
    assert choice.choose(CI.AUTO, nodes=1, ranks=2, largest_node=2, environ=env) is CI.SHM
    env = {"HPCDIST_COLLECTIVES": "mpi"}
    assert choice.choose(CI.AUTO, nodes=1, ranks=2, largest_node=2, environ=env) is CI.MPI
    assert choice.choose(CI.SHM, nodes=1, ranks=2, largest_node=2, environ=env) is CI.SHM
    with pytest.raises(ValueError, match="HPCDIST_COLLECTIVES='fast'"):
        choice.env_implementation({"HPCDIST_COLLECTIVES": "fast"})


def test_slot_bytes_shrinks_on_crowded_nodes_and_reads_the_variable():
    assert choice.slot_bytes(2, environ={}) == choice.DEFAULT_BUCKET_BYTES
    crowded = choice.slot_bytes(255, environ={})
    assert choice.MIN_SLOT_BYTES <= crowded < choice.DEFAULT_BUCKET_BYTES
    assert 2 * 256 * crowded <= choice.WINDOW_BUDGET_BYTES
    assert choice.slot_bytes(2, environ={"HPCDIST_SHM_SLOT_BYTES": "65536"}) == 65536
    with pytest.raises(ValueError, match="HPCDIST_SHM_SLOT_BYTES"):
        choice.slot_bytes(2, environ={"HPCDIST_SHM_SLOT_BYTES": "12"})


def test_buffer_pool_reuses_a_dropped_buffer_and_never_a_held_one():
    pool = BufferPool()
    f32 = np.dtype(np.float32)
    a = pool.take("k", 8, f32)
    b = pool.take("k", 8, f32)
    assert b is not a  # ``a`` is still held
    a_id = id(b)
    del b
    assert id(pool.take("k", 8, f32)) == a_id  # dropped: the same buffer again
    buf, address = pool.take_with_address("k", 8, f32)
    assert address == buf.ctypes.data
    del buf  # the address cache does not count as a holder
    again, same = pool.take_with_address("k", 8, f32)
    assert same == address and again.ctypes.data == address


def test_buffer_pool_past_its_limit_drops_its_oldest_layout_only():
    pool = BufferPool()
    f32 = np.dtype(np.float32)
    kept = {}
    for i in range(BufferPool.LIMIT + 3):
        kept[i] = id(pool.take(i, 4, f32))  # each dropped at once: free for reuse
    recent = BufferPool.LIMIT + 2
    assert id(pool.take(recent, 4, f32)) == kept[recent]  # recent layouts survive the overflow
    assert id(pool.take(BufferPool.LIMIT - 1, 4, f32)) == kept[BufferPool.LIMIT - 1]
    assert len(pool._spare) == BufferPool.LIMIT
