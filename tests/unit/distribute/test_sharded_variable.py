"""ShardedVariable over plain variables, embedding_lookup, IndexedSlices."""

from __future__ import annotations

import numpy as np
import pytest

import hpcdist as hd
from hpcdist.distribute.indexed_slices import IndexedSlices, embedding_lookup_grad
from hpcdist.distribute.partitioners import shard_offsets, shard_sizes
from hpcdist.distribute.sharded_variable import ShardedVariable, embedding_lookup


def table(rows=13, cols=4, dtype=np.float64, seed=0):
    return np.random.default_rng(seed).standard_normal((rows, cols)).astype(dtype)


def shards_of(full, n, name="emb"):
    o = shard_offsets(shard_sizes(full.shape[0], n))
    return [hd.Variable(full[o[i] : o[i + 1]], name=f"{name}/part_{i}") for i in range(n)]


class CountingShard:
    """A duck-typed shard that records every read (a stand-in for a remote variable)."""

    def __init__(self, value, name="s"):
        self._v = np.array(value)
        self.name = name
        self.gathers = []
        self.value_calls = 0
        self.writes = []

    @property
    def shape(self):
        return self._v.shape

    @property
    def dtype(self):
        return self._v.dtype

    def value(self):
        self.value_calls += 1
        return self._v.copy()

    def _gather_rows(self, rows):
        rows = np.asarray(rows)
        assert rows.dtype == np.int64
        self.gathers.append(rows.tolist())
        return self._v[rows]

    def assign(self, v):
        self.writes.append(np.array(v))
        self._v = np.array(v, dtype=self._v.dtype)


def counting(full, n):
    o = shard_offsets(shard_sizes(full.shape[0], n))
    return [CountingShard(full[o[i] : o[i + 1]], f"c/part_{i}") for i in range(n)]


# -- description and reads ---------------------------------------------------------------------


def test_description():
    full = table(13, 4, np.float32)
    sv = ShardedVariable(shards_of(full, 5), name="emb")
    assert (sv.name, sv.shape, sv.dtype, sv.ndim, sv.size, len(sv)) == (
        "emb",
        (13, 4),
        np.float32,
        2,
        52,
        13,
    )
    assert [v.shape for v in sv.variables] == [(3, 4), (3, 4), (3, 4), (2, 4), (2, 4)]
    assert sv._offsets == [0, 3, 6, 9, 11, 13]
    assert sv.trainable is True
    assert list(sv) == sv.variables
    assert "shards=[3, 3, 3, 2, 2]" in repr(sv) and "'emb'" in repr(sv)
    assert not isinstance(sv, hd.Variable)


def test_name_defaults():
    full = table(4)
    assert ShardedVariable(shards_of(full, 2, name="w")).name == "w"
    assert ShardedVariable([hd.Variable(full)]).name == "ShardedVariable"
    assert ShardedVariable([hd.Variable(full, trainable=False)]).trainable is False


def test_reads_concatenate_the_shards():
    full = table(13, 3)
    sv = ShardedVariable(shards_of(full, 5))
    for got in (sv.value(), sv.read_value(), sv.numpy(), np.asarray(sv)):
        np.testing.assert_array_equal(got, full)
    assert np.asarray(sv, dtype=np.float32).dtype == np.float32
    with pytest.raises(ValueError, match="needs a copy"):
        np.array(sv, copy=False)
    one_d = ShardedVariable([hd.Variable(np.arange(3)), hd.Variable(np.arange(3, 5))])
    assert one_d.numpy().tolist() == [0, 1, 2, 3, 4]


def test_arithmetic_works_on_the_value():
    full = table(7, 2)
    sv = ShardedVariable(shards_of(full, 3))
    np.testing.assert_allclose(sv + 1, full + 1)
    np.testing.assert_allclose(2 * sv - sv, full)
    np.testing.assert_allclose(sv @ np.ones(2), full.sum(axis=1))
    np.testing.assert_allclose(np.sum(sv), full.sum())
    w = hd.Variable(np.ones((7, 2)))
    np.testing.assert_allclose(w + sv, full + 1)
    with pytest.raises(TypeError, match="cannot be the output"):
        np.add(full, 1, out=sv)
    x = sv
    x += 1  # rebinds x to an array; the variable is unchanged
    assert isinstance(x, np.ndarray)
    np.testing.assert_array_equal(sv.numpy(), full)


# -- writes ------------------------------------------------------------------------------------


def test_assign_round_trips():
    full = table(13, 4)
    parts = shards_of(np.zeros_like(full), 5)
    sv = ShardedVariable(parts)
    assert sv.assign(full) is sv
    np.testing.assert_array_equal(sv.numpy(), full)
    for p, piece in zip(parts, np.split(full, [3, 6, 9, 11]), strict=True):
        np.testing.assert_array_equal(p.numpy(), piece)
    sv.assign_add(np.ones_like(full))
    np.testing.assert_allclose(sv.numpy(), full + 1)
    assert sv.assign_sub(2 * np.ones_like(full), read_value=False) is None
    np.testing.assert_allclose(sv.numpy(), full - 1)
    other = ShardedVariable(shards_of(full * 3, 2))
    sv.assign(other)  # a different sharding of the same shape
    np.testing.assert_allclose(sv.numpy(), full * 3)
    sv.assign(hd.Variable(full))
    np.testing.assert_allclose(sv.numpy(), full)


def test_assign_checks_the_full_shape():
    sv = ShardedVariable(shards_of(table(5, 2), 2, name="t"))
    with pytest.raises(ValueError, match=r"shape \(4, 2\) to sharded variable 't' of shape \(5, 2"):
        sv.assign(np.zeros((4, 2)))
    with pytest.raises(ValueError, match="shapes must match"):
        sv.assign_add(1.0)
    with pytest.raises(TypeError, match="cast it first"):  # the shard's own dtype check
        sv.assign(np.zeros((5, 2), dtype=np.complex128))


def test_split():
    sv = ShardedVariable(shards_of(table(13), 5))
    pieces = sv._split(np.arange(26).reshape(13, 2))
    assert [p.shape[0] for p in pieces] == [3, 3, 3, 2, 2]
    np.testing.assert_array_equal(np.concatenate(pieces), np.arange(26).reshape(13, 2))
    with pytest.raises(ValueError, match="expected 13 rows"):
        sv._split(np.zeros((12, 2)))


def test_validation():
    with pytest.raises(ValueError, match="at least one shard"):
        ShardedVariable([])
    with pytest.raises(TypeError, match="non-empty list of variables"):
        ShardedVariable(hd.Variable(np.zeros((2, 2))))
    with pytest.raises(ValueError, match="same dtype; shard 0 is float64, shard 1 is float32"):
        ShardedVariable([hd.Variable(np.zeros((2, 2))), hd.Variable(np.zeros((2, 2), "f4"))])
    with pytest.raises(ValueError, match=r"except along axis 0; shard 0 has \(2, 2\), shard 1"):
        ShardedVariable([hd.Variable(np.zeros((2, 2))), hd.Variable(np.zeros((2, 3)))])
    with pytest.raises(ValueError, match="shard 0 is a scalar"):
        ShardedVariable([hd.Variable(1.0)])


# -- indexing ----------------------------------------------------------------------------------

INDEXES = [
    0,
    4,
    12,
    -1,
    -13,
    np.int64(7),
    slice(None),
    slice(2, 9),
    slice(None, None, 3),
    slice(11, 1, -2),
    slice(20, 30),
    [5, 0, 5],
    np.array([[1, 12], [-2, 3]]),
    (3, 1),
    (slice(1, 6), 2),
    (slice(None), slice(1, 3)),
    ([2, 4], 0),
    (4, Ellipsis),
    np.arange(13) % 2 == 0,
    (slice(1, 3), [0, 2]),
    (Ellipsis, 1),
    (),
]


@pytest.mark.parametrize("item", INDEXES, ids=[repr(i) for i in INDEXES])
def test_getitem_matches_numpy(item):
    full = table(13, 4)
    sv = ShardedVariable(shards_of(full, 5))
    np.testing.assert_array_equal(sv[item], full[item])


def test_getitem_reads_only_the_needed_shards():
    full = table(13, 2)
    parts = counting(full, 5)
    sv = ShardedVariable(parts)
    np.testing.assert_array_equal(sv[7], full[7])
    assert [p.gathers for p in parts] == [[], [], [[1]], [], []]
    np.testing.assert_array_equal(sv[2:7], full[2:7])
    assert [p.gathers for p in parts][:3] == [[[2]], [[0, 1, 2]], [[1], [0]]]
    assert sum(p.value_calls for p in parts) == 0
    with pytest.raises(IndexError, match="index 13 is out of bounds for axis 0 with size 13"):
        sv[13]
    with pytest.raises(IndexError, match="id -14 is out of range"):
        sv[[-14]]


# -- embedding_lookup --------------------------------------------------------------------------


@pytest.mark.parametrize("n", [1, 2, 5, 13])
def test_embedding_lookup_equals_take(n):
    rng = np.random.default_rng(n)
    full = table(13, 3, np.float32)
    ids = rng.integers(0, 13, size=(4, 6))  # duplicates almost surely
    expected = np.take(full, ids, axis=0)
    sv = ShardedVariable(shards_of(full, n))
    pieces = [full[a:b] for a, b in zip(sv._offsets[:-1], sv._offsets[1:], strict=True)]
    for params in (sv, pieces, tuple(sv.variables), full, hd.Variable(full), [full]):
        got = embedding_lookup(params, ids)
        assert got.shape == (4, 6, 3) and got.dtype == np.float32
        np.testing.assert_array_equal(got, expected)
    np.testing.assert_array_equal(embedding_lookup(sv, 5), full[5])
    np.testing.assert_array_equal(embedding_lookup(sv, [[[2]]]), full[[[[2]]]])


def test_embedding_lookup_fetches_each_row_once_per_shard():
    full = table(13, 2)
    parts = counting(full, 5)  # rows [0,3) [3,6) [6,9) [9,11) [11,13)
    ids = np.array([[12, 4, 4, 0], [3, 12, 5, 4]])
    np.testing.assert_array_equal(embedding_lookup(ShardedVariable(parts), ids), full[ids])
    # one call per shard holding requested rows, unique local rows, none for shards 2 and 3
    assert [p.gathers for p in parts] == [[[0]], [[0, 1, 2]], [], [], [[1]]]
    assert sum(p.value_calls for p in parts) == 0
    # a list of remote shards behaves the same
    parts = counting(full, 5)
    np.testing.assert_array_equal(embedding_lookup(parts, [10, 10, 9]), full[[10, 10, 9]])
    assert [p.gathers for p in parts] == [[], [], [], [[0, 1]], []]


def test_embedding_lookup_edge_cases():
    full = table(5, 2)
    sv = ShardedVariable(shards_of(full, 2))
    empty = embedding_lookup(sv, np.zeros((0, 3), dtype=np.int64))
    assert empty.shape == (0, 3, 2) and empty.dtype == full.dtype
    vec = np.arange(6.0)
    np.testing.assert_array_equal(embedding_lookup([vec[:4], vec[4:]], [5, 1]), [5.0, 1.0])
    with pytest.raises(IndexError, match=r"id 5 is out of range for a table of 5 rows"):
        embedding_lookup(sv, [0, 5])
    with pytest.raises(IndexError, match=r"id -1 is out of range"):
        embedding_lookup(full, [-1])
    with pytest.raises(TypeError, match="ids must be integers; got dtype float64"):
        embedding_lookup(sv, [1.0])
    with pytest.raises(ValueError, match="max_norm must be a positive number"):
        embedding_lookup(sv, [1], max_norm=0)
    with pytest.raises(ValueError, match="at least one shard"):
        embedding_lookup([], [0])
    with pytest.raises(TypeError, match="floating-point"):
        embedding_lookup(np.arange(4), [1], max_norm=1.0)


def test_embedding_lookup_max_norm():
    full = table(9, 3) * 3
    ids = np.array([0, 8, 8, 4, 2])
    got = embedding_lookup(ShardedVariable(shards_of(full, 3)), ids, max_norm=2.0)
    for out, row in zip(got, full[ids], strict=True):
        norm = np.linalg.norm(row)
        expected = row * (2.0 / norm) if norm > 2.0 else row
        np.testing.assert_allclose(out, expected, rtol=1e-12)
    small = np.array([[0.3, 0.4], [3.0, 4.0]])
    np.testing.assert_allclose(
        embedding_lookup(small, [0, 1], max_norm=1.0), [[0.3, 0.4], [0.6, 0.8]]
    )


# -- IndexedSlices -----------------------------------------------------------------------------


def test_indexed_slices_to_dense_against_add_at():
    rng = np.random.default_rng(3)
    idx = rng.integers(0, 10, size=25)
    vals = rng.standard_normal((25, 3))
    s = IndexedSlices(vals, idx, dense_shape=(10, 3))
    expected = np.zeros((10, 3))
    for i, v in zip(idx, vals, strict=True):
        expected[i] += v
    np.testing.assert_allclose(s.to_dense(), expected)
    d = s.deduplicate()
    assert d.indices.tolist() == sorted(set(idx.tolist()))
    np.testing.assert_allclose(IndexedSlices(d.values, d.indices, (10, 3)).to_dense(), expected)
    assert (s.dtype, s.shape, s.indices.dtype) == (np.float64, (10, 3), np.int64)
    np.testing.assert_allclose((-s).to_dense(), -expected)


def test_indexed_slices_validation():
    with pytest.raises(ValueError, match="one slice per index: 2 indices"):
        IndexedSlices(np.zeros((3, 2)), [0, 1], (4, 2))
    with pytest.raises(ValueError, match="indices must be 1-D"):
        IndexedSlices(np.zeros((2, 2)), [[0, 1]], (4, 2))
    with pytest.raises(TypeError, match="indices must be integers"):
        IndexedSlices(np.zeros((1, 2)), [0.5], (4, 2))
    with pytest.raises(ValueError, match=r"dense_shape \(4, 3\) does not fit"):
        IndexedSlices(np.zeros((1, 2)), [0], (4, 3))
    with pytest.raises(ValueError, match="has no dense_shape"):
        IndexedSlices(np.zeros((1, 2)), [0]).to_dense()
    with pytest.raises(IndexError, match=r"index 4 is out of range for dense_shape \(4, 2\)"):
        IndexedSlices(np.zeros((1, 2)), [4], (4, 2)).to_dense()


def test_embedding_lookup_grad_is_the_gradient():
    rng = np.random.default_rng(5)
    full = rng.standard_normal((6, 2))
    ids = np.array([[1, 4, 1], [5, 1, 0]])
    upstream = rng.standard_normal((2, 3, 2))  # d loss / d lookup, loss = sum(lookup * upstream)

    def loss(t):
        return float(np.sum(embedding_lookup(t, ids) * upstream))

    g = embedding_lookup_grad(ids, upstream, num_rows=6)
    assert g.indices.tolist() == ids.ravel().tolist() and g.dense_shape == (6, 2)
    numeric = np.zeros_like(full)
    for i in range(6):
        for j in range(2):
            bumped = full.copy()
            bumped[i, j] += 1.0
            numeric[i, j] = loss(bumped) - loss(full)  # the loss is linear in the table
    np.testing.assert_allclose(g.to_dense(), numeric, atol=1e-12)
    with pytest.raises(ValueError, match="does not match ids of shape"):
        embedding_lookup_grad(ids, np.zeros((3, 2, 2)), 6)


def test_split_indexed_slices():
    full = table(13, 2)
    sv = ShardedVariable(shards_of(full, 5))
    rng = np.random.default_rng(9)
    idx = rng.integers(0, 13, size=30)
    vals = rng.standard_normal((30, 2))
    grad = IndexedSlices(vals, idx, (13, 2))
    parts = sv._split_indexed_slices(grad)
    rebuilt = np.zeros((13, 2))
    seen = 0
    for s, local, v in parts:
        assert local.dtype == np.int64 and 0 <= local.min() and local.max() < sv._sizes[s]
        np.add.at(rebuilt, local + sv._offsets[s], v)
        seen += len(local)
    assert seen == 30 and sorted({s for s, _, _ in parts}) == sorted(
        {int(np.searchsorted(sv._offsets, i, side="right") - 1) for i in idx}
    )
    np.testing.assert_allclose(rebuilt, grad.to_dense())
    only = sv._split_indexed_slices(IndexedSlices(np.ones((2, 2)), [12, 11], (13, 2)))
    assert [(s, local.tolist()) for s, local, _ in only] == [(4, [1, 0])]
    with pytest.raises(ValueError, match=r"dense_shape \(12, 2\), but sharded variable"):
        sv._split_indexed_slices(IndexedSlices(np.ones((1, 2)), [0], (12, 2)))
    with pytest.raises(IndexError, match="id 13 is out of range"):
        sv._split_indexed_slices(IndexedSlices(np.ones((1, 2)), [13]))
