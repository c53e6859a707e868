"""The streaming Dataset: TF's documented examples, shuffle order, fast paths, node protocol."""

from __future__ import annotations

import collections
import gc
import threading

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import hpcdist.data.dataset as dsmod
from hpcdist.data.dataset import (
    AUTOTUNE,
    INFINITE,
    UNKNOWN,
    BatchDataset,
    Dataset,
    FilterDataset,
    GeneratorDataset,
    MapDataset,
    PrefetchDataset,
    RangeDataset,
    RepeatDataset,
    ShardDataset,
    ShuffleDataset,
    SkipDataset,
    TakeDataset,
    TensorDataset,
    TensorSliceDataset,
    TensorSpec,
    UnbatchDataset,
    _OptionsDataset,
)
from hpcdist.data.options import AutoShardPolicy, Options


def ints(ds):
    """The elements of a dataset of scalars (or batches) as Python lists/ints."""
    return [x.tolist() if isinstance(x, np.ndarray) else int(x) for x in ds]


class generic_paths:  # noqa: N801 - used as a context manager
    """Within the block, every node takes its element-by-element path."""

    def __enter__(self):
        self._saved = dsmod._FAST_PATHS
        dsmod._FAST_PATHS = False

    def __exit__(self, *exc):
        dsmod._FAST_PATHS = self._saved


def prefetch_threads():
    return [t for t in threading.enumerate() if t.name == "hpcdist-prefetch"]


# ----------------------------------------------------------------- TF's documented examples


def test_range_examples():
    assert ints(Dataset.range(5)) == [0, 1, 2, 3, 4]
    assert ints(Dataset.range(2, 5)) == [2, 3, 4]
    assert ints(Dataset.range(1, 5, 2)) == [1, 3]
    assert ints(Dataset.range(1, 5, -2)) == []
    assert ints(Dataset.range(5, 1)) == []
    assert ints(Dataset.range(5, 1, -2)) == [5, 3]
    assert all(type(x) is np.int64 for x in Dataset.range(3))
    assert [x.dtype for x in Dataset.range(2, output_type=np.int32)] == [np.int32] * 2


def test_batch_examples():
    assert ints(Dataset.range(8).batch(3)) == [[0, 1, 2], [3, 4, 5], [6, 7]]
    assert ints(Dataset.range(8).batch(3, drop_remainder=True)) == [[0, 1, 2], [3, 4, 5]]
    batches = list(Dataset.range(8).batch(3))
    assert all(b.dtype == np.int64 for b in batches)


def test_shard_examples():
    assert ints(Dataset.range(10).shard(num_shards=3, index=0)) == [0, 3, 6, 9]
    assert ints(Dataset.range(10).shard(num_shards=3, index=1)) == [1, 4, 7]
    assert ints(Dataset.range(10).shard(num_shards=3, index=2)) == [2, 5, 8]


def test_from_tensor_slices_examples():
    assert ints(Dataset.from_tensor_slices([1, 2, 3])) == [1, 2, 3]
    assert ints(Dataset.from_tensor_slices([[1, 2], [3, 4]])) == [[1, 2], [3, 4]]
    pairs = [
        (int(a), int(b), int(c)) for a, b, c in Dataset.from_tensor_slices(([1, 2], [3, 4], [5, 6]))
    ]
    assert pairs == [(1, 3, 5), (2, 4, 6)]
    dicts = list(Dataset.from_tensor_slices({"a": [1, 2], "b": [3, 4]}))
    assert [{k: int(v) for k, v in d.items()} for d in dicts] == [
        {"a": 1, "b": 3},
        {"a": 2, "b": 4},
    ]
    features, labels = [[1, 3], [2, 1], [3, 3]], ["A", "B", "A"]
    got = [(f.tolist(), str(label)) for f, label in Dataset.from_tensor_slices((features, labels))]
    assert got == [([1, 3], "A"), ([2, 1], "B"), ([3, 3], "A")]
    nested = list(Dataset.from_tensor_slices({"a": ([1, 2], [3, 4]), "b": [5, 6]}))
    assert (int(nested[1]["a"][1]), int(nested[1]["b"])) == (4, 6)


def test_from_tensors_examples():
    assert ints(Dataset.from_tensors([1, 2, 3])) == [[1, 2, 3]]
    (element,) = list(Dataset.from_tensors(([1, 2, 3], "A")))
    assert element[0].tolist() == [1, 2, 3] and str(element[1]) == "A"
    assert Dataset.from_tensors(np.zeros((2, 3))).cardinality() == 1


def test_map_filter_take_skip_repeat_examples():
    assert ints(Dataset.range(1, 6).map(lambda x: x * 2)) == [2, 4, 6, 8, 10]
    assert ints(Dataset.from_tensor_slices([1, 2, 3]).filter(lambda x: x < 3)) == [1, 2]
    assert ints(Dataset.from_tensor_slices([1, 2, 3]).filter(lambda x: x == 1)) == [1]
    assert ints(Dataset.range(10).take(3)) == [0, 1, 2]
    assert ints(Dataset.range(10).skip(7)) == [7, 8, 9]
    assert ints(Dataset.from_tensor_slices([1, 2, 3]).repeat(3)) == [1, 2, 3] * 3
    assert ints(Dataset.range(3).take(-1)) == [0, 1, 2]
    assert ints(Dataset.range(3).skip(-1)) == []
    assert ints(Dataset.range(5).batch(2).unbatch()) == [0, 1, 2, 3, 4]


def test_map_calling_convention():
    pairs = Dataset.from_tensor_slices(([1, 2], [10, 20]))
    assert ints(pairs.map(lambda a, b: a + b)) == [11, 22]
    records = Dataset.from_tensor_slices({"a": [1, 2], "b": [10, 20]})
    assert ints(records.map(lambda d: d["a"] * d["b"])) == [10, 40]
    out = list(Dataset.range(2).map(lambda x: (x, 1, [x, x])))
    assert type(out[0][1]) is np.int64, "Python values become NumPy values, as TF makes tensors"
    assert out[1][2].tolist() == [1, 1]


def test_cardinality_examples():
    ds = Dataset.range(42)
    assert ds.cardinality() == 42
    assert ds.repeat().cardinality() == INFINITE
    assert ds.filter(lambda x: True).cardinality() == UNKNOWN
    assert (INFINITE, UNKNOWN) == (-1, -2)


@pytest.mark.parametrize(
    "make,expected",
    [
        (lambda d: d.batch(3), 4),
        (lambda d: d.batch(3, drop_remainder=True), 3),
        (lambda d: d.batch(20), 1),
        (lambda d: d.batch(20, drop_remainder=True), 0),
        (lambda d: d.take(4), 4),
        (lambda d: d.take(40), 10),
        (lambda d: d.skip(4), 6),
        (lambda d: d.skip(40), 0),
        (lambda d: d.skip(-1), 0),
        (lambda d: d.repeat(3), 30),
        (lambda d: d.repeat(0), 0),
        (lambda d: d.shard(3, 0), 4),
        (lambda d: d.shard(3, 1), 3),
        (lambda d: d.shard(3, 2), 3),
        (lambda d: d.map(lambda x: x), 10),
        (lambda d: d.prefetch(2), 10),
        (lambda d: d.shuffle(4), 10),
        (lambda d: d.with_options(Options()), 10),
        (lambda d: d.repeat().take(25), 25),
        (lambda d: d.repeat().batch(4), INFINITE),
        (lambda d: d.repeat().skip(3), INFINITE),
        (lambda d: d.filter(bool).batch(2), UNKNOWN),
        (lambda d: d.filter(bool).take(3), UNKNOWN),
        (lambda d: d.filter(bool).repeat(2), UNKNOWN),
        (lambda d: d.batch(2).unbatch(), UNKNOWN),
        (lambda d: d.take(0).repeat(), 0),
    ],
)
def test_cardinality_of_every_node(make, expected):
    ds = make(Dataset.range(10))
    assert ds.cardinality() == expected
    if expected >= 0:
        assert len(list(ds)) == expected == len(ds)


def test_cardinality_of_sources():
    assert Dataset.from_tensor_slices(np.zeros((7, 2))).cardinality() == 7
    assert Dataset.range(0, 10, 4).cardinality() == 3
    assert Dataset.from_generator(lambda: iter([1])).cardinality() == UNKNOWN
    with pytest.raises(TypeError, match="infinite"):
        len(Dataset.range(2).repeat())
    with pytest.raises(TypeError, match="unknown"):
        len(Dataset.range(2).filter(bool))
    assert bool(Dataset.range(0).filter(bool))


# --------------------------------------------------------------------------------- element_spec


def test_element_spec_of_sources_and_batches():
    ds = Dataset.from_tensor_slices({"x": np.zeros((4, 3), np.float32), "y": np.arange(4)})
    assert ds.element_spec == {"x": TensorSpec((3,), np.float32), "y": TensorSpec((), np.int64)}
    assert ds.batch(2).element_spec["x"] == TensorSpec((None, 3), np.float32)
    assert ds.batch(2, drop_remainder=True).element_spec["y"] == TensorSpec((2,), np.int64)
    assert ds.batch(2).unbatch().element_spec == ds.element_spec
    assert Dataset.range(3).element_spec == TensorSpec((), np.int64)
    assert Dataset.from_tensors(([1, 2], 1.5)).element_spec == (
        TensorSpec((2,), np.int64),
        TensorSpec((), np.float64),
    )
    shuffled = (
        ds.shuffle(3).take(2).skip(1).shard(2, 0).repeat(2).prefetch(1).filter(lambda d: True)
    )
    assert shuffled.element_spec == ds.element_spec


def test_element_spec_of_map_keeps_unknown_dimensions():
    ds = Dataset.range(4).batch(2).map(lambda x: x * 2)
    assert ds.element_spec == TensorSpec((None,), np.int64)
    pairs = Dataset.range(4).batch(2).map(lambda x: (x.astype(np.float32), x[:1], 7))
    assert pairs.element_spec == (
        TensorSpec((None,), np.float32),
        TensorSpec((1,), np.int64),
        TensorSpec((), np.int64),
    )


def test_element_spec_of_map_falls_back_to_a_real_element():
    seen = []

    def picky(x):
        if x == 0:
            raise ZeroDivisionError("zeros are not traceable")
        seen.append(int(x))
        return np.full(3, x, np.int16)

    shuffled = Dataset.range(1, 20).shuffle(19, seed=5)
    ds = shuffled.map(picky)
    assert ds.element_spec == TensorSpec((3,), np.int16)
    first_epoch = ints(shuffled)
    assert first_epoch == (np.random.default_rng(5).permutation(19) + 1).tolist(), (
        "peeking for the spec must not use up an iteration of the shuffle"
    )


def test_element_spec_of_generators():
    def gen():
        yield np.ones(2, np.float32), 1
        yield np.ones(2, np.float32), 2

    assert Dataset.from_generator(gen).element_spec == (
        TensorSpec((2,), np.float32),
        TensorSpec((), np.int64),
    )
    signature = (TensorSpec((None,), np.float64), TensorSpec((), np.int32))
    ds = Dataset.from_generator(gen, output_signature=signature)
    assert ds.element_spec == signature
    first = next(iter(ds))
    assert first[0].dtype == np.float64 and first[1].dtype == np.int32
    typed = Dataset.from_generator(gen, output_types=(np.float64, np.int8))
    assert typed.element_spec == (TensorSpec((2,), np.float64), TensorSpec((), np.int8))
    shaped = Dataset.from_generator(
        gen, output_types=(np.float64, np.int8), output_shapes=((2,), ())
    )
    assert shaped.element_spec == (TensorSpec((2,), np.float64), TensorSpec((), np.int8))
    with pytest.raises(ValueError, match="output_signature"):
        _ = Dataset.from_generator(lambda: iter([])).element_spec


def test_tensor_spec_normalises_and_checks():
    spec = TensorSpec([None, 3], "float32")
    assert spec.shape == (None, 3) and spec.dtype == np.dtype(np.float32)
    assert spec.is_compatible_with(np.zeros((7, 3), np.float32))
    assert not spec.is_compatible_with(np.zeros((7, 4), np.float32))
    assert not spec.is_compatible_with(np.zeros((7, 3), np.float64))
    assert TensorSpec.from_value(np.int64(2)) == TensorSpec((), np.int64)
    with pytest.raises(TypeError, match="shape"):
        TensorSpec((1.5,), np.float32)


# -------------------------------------------------------------------------------------- shuffle


def reference_shuffle(values, buffer_size, rng, chunk):
    """The documented order: TF's buffer algorithm, slot draws in chunks, final permutation."""
    buffer, out, picks, used = [], [], [], 0
    for v in values:
        if len(buffer) < buffer_size:
            buffer.append(v)
            continue
        if used == len(picks):
            picks, used = rng.integers(0, buffer_size, size=chunk), 0
        slot = picks[used]
        used += 1
        out.append(buffer[slot])
        buffer[slot] = v
    out.extend(buffer[i] for i in rng.permutation(len(buffer)))
    return out


def test_shuffle_with_a_large_buffer_is_the_seeded_permutation():
    for n, buffer_size in [(10, 10), (10, 1000), (1, 5), (0, 3)]:
        got = ints(Dataset.range(n).shuffle(buffer_size, seed=7))
        assert got == np.random.default_rng(7).permutation(n).tolist()


def test_shuffle_follows_the_documented_buffer_algorithm(monkeypatch):
    monkeypatch.setattr(dsmod, "_SHUFFLE_CHUNK", 4)
    expected = reference_shuffle(list(range(50)), 8, np.random.default_rng(11), 4)
    assert ints(Dataset.range(50).shuffle(8, seed=11)) == expected
    with generic_paths():
        assert ints(Dataset.range(50).shuffle(8, seed=11)) == expected
    gen = Dataset.from_generator(lambda: iter(range(50)))
    assert ints(gen.shuffle(8, seed=11)) == expected


def test_shuffle_buffer_of_one_keeps_the_order():
    assert ints(Dataset.range(6).shuffle(1, seed=3)) == list(range(6))


def test_small_buffers_only_move_elements_a_little():
    order = ints(Dataset.range(1000).shuffle(10, seed=0))
    assert sorted(order) == list(range(1000))
    assert all(order[i] < i + 10 for i in range(1000)), "element i is not out before it is read"


def test_shuffle_is_reproducible_with_a_seed():
    a = ints(Dataset.range(100).shuffle(30, seed=42))
    assert a == ints(Dataset.range(100).shuffle(30, seed=42))
    assert a != ints(Dataset.range(100).shuffle(30, seed=43))
    assert sorted(a) == list(range(100))


def test_reshuffle_each_iteration():
    ds = Dataset.range(20).shuffle(20, seed=1)
    epochs = [ints(ds) for _ in range(3)]
    assert epochs[0] != epochs[1] != epochs[2]
    assert epochs[0] == np.random.default_rng(1).permutation(20).tolist()
    assert epochs[1] == np.random.default_rng((1, 1)).permutation(20).tolist()
    again = Dataset.range(20).shuffle(20, seed=1)
    assert [ints(again) for _ in range(3)] == epochs, "every epoch is reproducible"
    repeated = ints(Dataset.range(20).shuffle(20, seed=1).repeat(3))
    assert repeated == epochs[0] + epochs[1] + epochs[2]
    fixed = Dataset.range(20).shuffle(20, seed=1, reshuffle_each_iteration=False)
    assert ints(fixed) == ints(fixed) == epochs[0]


def test_unseeded_shuffles():
    fixed = Dataset.range(30).shuffle(30, reshuffle_each_iteration=False)
    first = ints(fixed)
    assert ints(fixed) == first and sorted(first) == list(range(30))
    changing = Dataset.range(30).shuffle(30)
    orders = {tuple(ints(changing)) for _ in range(3)}
    assert len(orders) > 1


def test_shuffle_before_batch_matches_the_element_path_across_chunks(monkeypatch):
    monkeypatch.setattr(dsmod, "_SHUFFLE_CHUNK", 5)
    x = np.arange(200, dtype=np.float32).reshape(100, 2)
    make = lambda: Dataset.from_tensor_slices((x, np.arange(100))).shuffle(13, seed=9).batch(7)  # noqa: E731
    fast = [(a.tolist(), b.tolist()) for a, b in make()]
    with generic_paths():
        slow = [(a.tolist(), b.tolist()) for a, b in make()]
    assert fast == slow
    assert sorted(v for _, b in fast for v in b) == list(range(100))


pipelines = st.lists(
    st.one_of(
        st.tuples(st.just("shuffle"), st.integers(1, 40), st.integers(0, 3)),
        st.tuples(st.just("take"), st.integers(-1, 40)),
        st.tuples(st.just("skip"), st.integers(-1, 10)),
        st.tuples(st.just("shard"), st.integers(1, 4), st.integers(0, 3)),
        st.tuples(st.just("repeat"), st.integers(0, 3)),
        st.tuples(st.just("options")),
    ),
    max_size=4,
)


def build(source, steps, batch_size, drop):
    ds = source
    for step in steps:
        if step[0] == "shuffle":
            ds = ds.shuffle(step[1], seed=step[2])
        elif step[0] == "take":
            ds = ds.take(step[1])
        elif step[0] == "skip":
            ds = ds.skip(step[1])
        elif step[0] == "shard":
            ds = ds.shard(step[1], step[2] % step[1])
        elif step[0] == "repeat":
            ds = ds.repeat(step[1])
        else:
            ds = ds.with_options(Options(deterministic=True))
    return ds.batch(batch_size, drop) if batch_size else ds


def as_lists(ds, epochs=2):
    out = []
    for _ in range(epochs):
        for element in ds:
            out.append(tuple(np.asarray(v).tolist() for v in element))
    return out


@settings(deadline=None, max_examples=100)
@given(
    n=st.integers(0, 40),
    steps=pipelines,
    batch_size=st.integers(0, 9),
    drop=st.booleans(),
    chunk=st.integers(1, 9),
)
def test_fast_paths_give_the_element_path_exactly(n, steps, batch_size, drop, chunk):
    saved = dsmod._SHUFFLE_CHUNK
    dsmod._SHUFFLE_CHUNK = chunk
    try:
        x = np.arange(n * 3, dtype=np.float32).reshape(n, 3)

        def source():
            return Dataset.from_tensor_slices((x, np.arange(n) * 10))

        fast = as_lists(build(source(), steps, batch_size, drop))
        with generic_paths():
            slow = as_lists(build(source(), steps, batch_size, drop))
        assert fast == slow
        ranged = as_lists(build(Dataset.range(n).map(lambda i: (i,)), steps, batch_size, drop))
        direct = as_lists(build(Dataset.range(n), steps, batch_size, drop).map(lambda i: (i,)))
        assert ranged == direct
        if batch_size:
            card = build(source(), steps, batch_size, drop).cardinality()
            assert card == len(fast) // 2
    finally:
        dsmod._SHUFFLE_CHUNK = saved


@settings(deadline=None, max_examples=50)
@given(n=st.integers(0, 60), buffer_size=st.integers(1, 80), seed=st.integers(0, 2**32))
def test_shuffle_is_a_permutation(n, buffer_size, seed):
    got = ints(Dataset.range(n).shuffle(buffer_size, seed=seed))
    assert sorted(got) == list(range(n))


def test_shuffle_of_slices_does_not_alias_the_source():
    x = np.arange(6.0).reshape(3, 2)
    rows = list(Dataset.from_tensor_slices(x).shuffle(3, seed=0))
    rows[0][:] = -1
    assert (x >= 0).all()


# ------------------------------------------------------------------------------- batch details


def test_batch_of_structures_and_generic_inputs():
    ds = Dataset.from_generator(lambda: ({"a": np.full(2, i), "b": (i, i * 0.5)} for i in range(5)))
    batches = list(ds.batch(2))
    assert batches[0]["a"].tolist() == [[0, 0], [1, 1]]
    assert batches[2]["b"][1].tolist() == [2.0]
    assert batches[0]["b"][0].dtype == np.int64


def test_batch_of_ragged_elements_says_what_to_do():
    ragged = Dataset.from_generator(lambda: (np.zeros(i) for i in range(1, 4)))
    with pytest.raises(ValueError, match="different shapes.*common shape"):
        list(ragged.batch(3))


def test_batches_are_copies_of_the_source():
    x = np.arange(8.0).reshape(4, 2)
    b = next(iter(Dataset.from_tensor_slices(x).batch(2)))
    b[:] = -1
    assert (x >= 0).all()
    row = next(iter(Dataset.from_tensor_slices(x)))
    row[:] = -1
    assert (x >= 0).all()


def test_from_tensor_slices_does_not_copy_the_input():
    x = np.zeros((1000, 4))
    ds = Dataset.from_tensor_slices((x, x[:, 0]))
    assert ds._arrays[0] is x and np.shares_memory(ds._arrays[1], x)


def test_batch_pulls_only_what_it_needs():
    pulled = []

    def endless():
        i = 0
        while True:
            pulled.append(i)
            yield i
            i += 1

    assert ints(Dataset.from_generator(endless).batch(3).take(2)) == [[0, 1, 2], [3, 4, 5]]
    assert len(pulled) <= 7


# ---------------------------------------------------------------------------------- map / filter


def test_parallel_map_keeps_order_and_raises_errors():
    for calls in (2, 4, AUTOTUNE):
        ds = Dataset.range(50).map(lambda x: x * x, num_parallel_calls=calls)
        assert ints(ds) == [i * i for i in range(50)]

    def fail_at_7(x):
        if x == 7:
            raise RuntimeError("element 7 is bad")
        return x

    got = []
    with pytest.raises(RuntimeError, match="element 7"):
        for x in Dataset.range(20).map(fail_at_7, num_parallel_calls=3):
            got.append(int(x))
    assert got == list(range(7))
    gc.collect()
    assert not [t for t in threading.enumerate() if t.name.startswith("hpcdist-map")]


def test_filter_needs_a_scalar_predicate():
    with pytest.raises(TypeError, match="one boolean per element"):
        list(Dataset.from_tensor_slices(np.zeros((2, 3))).filter(lambda x: x > 0))
    assert ints(Dataset.range(6).filter(lambda x: np.bool_(x % 3 == 0))) == [0, 3]


def test_take_stops_pulling_and_repeat_of_empty_ends():
    pulled = []

    def gen():
        for i in range(100):
            pulled.append(i)
            yield i

    assert ints(Dataset.from_generator(gen).take(3)) == [0, 1, 2]
    assert pulled == [0, 1, 2]
    assert ints(Dataset.range(0).repeat()) == []
    assert ints(Dataset.range(3).repeat().take(7)) == [0, 1, 2, 0, 1, 2, 0]


def test_generator_is_called_per_iteration_and_checked():
    calls = []

    def gen():
        calls.append(1)
        yield from [[1, 2], [3, 4]]

    ds = Dataset.from_generator(gen, output_signature=TensorSpec((2,), np.int64))
    assert ints(ds) == ints(ds) == [[1, 2], [3, 4]]
    assert len(calls) == 2
    bad = Dataset.from_generator(lambda: iter([[1, 2, 3]]), output_signature=TensorSpec((2,), "i8"))
    with pytest.raises(ValueError, match=r"shape \(3,\).*expects \(2,\)"):
        list(bad)
    wrong = Dataset.from_generator(lambda: iter([1]), output_signature=(TensorSpec((), "i8"),) * 2)
    with pytest.raises(TypeError, match="structure"):
        list(wrong)
    with pytest.raises(TypeError, match=r"from_generator\(gen\), not gen\(\)"):
        Dataset.from_generator(gen())
    with pytest.raises(TypeError, match="not both"):
        Dataset.from_generator(gen, output_types=np.int64, output_signature=TensorSpec((), "i8"))
    with pytest.raises(TypeError, match="expected a TensorSpec"):
        Dataset.from_generator(gen, output_signature=(np.int64,))
    args = Dataset.from_generator(lambda a, b: iter(range(a, b)), args=(2, 4))
    assert ints(args) == [2, 3]


# -------------------------------------------------------------------------------------- prefetch


def test_prefetch_yields_everything_and_leaves_no_thread():
    assert ints(Dataset.range(100).batch(7).prefetch(2)) == ints(Dataset.range(100).batch(7))
    assert ints(Dataset.range(5).prefetch(AUTOTUNE)) == list(range(5))
    assert ints(Dataset.range(5).prefetch(0)) == list(range(5))
    assert not prefetch_threads()


def test_prefetch_thread_stops_when_the_iterator_is_dropped():
    it = iter(Dataset.range(10**9).prefetch(3))
    assert int(next(it)) == 0
    assert len(prefetch_threads()) == 1
    del it
    gc.collect()
    assert not prefetch_threads()
    for x in Dataset.range(10**9).prefetch(2):
        if x == 5:
            break
    gc.collect()
    assert not prefetch_threads()


def test_prefetch_reraises_producer_errors():
    def gen():
        yield 1
        yield 2
        raise OSError("disk went away")

    got = []
    with pytest.raises(OSError, match="disk went away"):
        for x in Dataset.from_generator(gen).prefetch(4):
            got.append(int(x))
    assert got == [1, 2]
    gc.collect()
    assert not prefetch_threads()


# ------------------------------------------------------------------------------------- errors


@pytest.mark.parametrize(
    "make,error,match",
    [
        (lambda: Dataset.range(4).batch(0), ValueError, "batch_size >= 1"),
        (lambda: Dataset.range(4).batch(-3), ValueError, "batch_size >= 1"),
        (lambda: Dataset.range(4).batch(2.5), TypeError, "batch_size"),
        (lambda: Dataset.range(4).batch(True), TypeError, "batch_size"),
        (lambda: Dataset.range(4).shard(0, 0), ValueError, "num_shards >= 1"),
        (lambda: Dataset.range(4).shard(2, 2), ValueError, "0 <= index < num_shards"),
        (lambda: Dataset.range(4).shard(2, -1), ValueError, "0 <= index < num_shards"),
        (lambda: Dataset.range(4).shuffle(0), ValueError, "buffer_size >= 1"),
        (lambda: Dataset.range(4).shuffle(4, seed=-1), ValueError, "seed >= 0"),
        (lambda: Dataset.range(4).take(-2), ValueError, "count >= 0"),
        (lambda: Dataset.range(4).skip(-2), ValueError, "count >= 0"),
        (lambda: Dataset.range(4).repeat(-2), ValueError, "count >= 0"),
        (lambda: Dataset.range(4).prefetch(-2), ValueError, "AUTOTUNE"),
        (lambda: Dataset.range(4).map(abs, num_parallel_calls=0), ValueError, "AUTOTUNE"),
        (lambda: Dataset.range(4).map(3), TypeError, "callable"),
        (lambda: Dataset.range(4).filter(None), TypeError, "callable"),
        (lambda: Dataset.range(0, 4, 0), ValueError, "non-zero step"),
        (lambda: Dataset.range(), TypeError, "1 to 3 arguments"),
        (lambda: Dataset.from_tensor_slices(5), ValueError, "scalar"),
        (lambda: Dataset.from_tensor_slices(()), ValueError, "no arrays"),
        (lambda: Dataset.range(2).apply(lambda d: 3), TypeError, "expected a Dataset"),
        (lambda: BatchDataset([1, 2], 2), TypeError, "expected a Dataset"),
    ],
)
def test_bad_arguments(make, error, match):
    with pytest.raises(error, match=match):
        make()


def test_mismatched_slices_name_the_sizes():
    with pytest.raises(ValueError, match=r"\[0\]: 3, \[1\]: 4.*same number of rows"):
        Dataset.from_tensor_slices((np.zeros(3), np.zeros(4)))
    with pytest.raises(ValueError, match=r"\['x'\]: 2, \['y'\]: 5"):
        Dataset.from_tensor_slices({"x": [1, 2], "y": [1, 2, 3, 4, 5]})


def test_unbatch_of_scalars():
    with pytest.raises(ValueError, match="scalar"):
        list(Dataset.range(3).unbatch())


# ------------------------------------------------------------------------------ node protocol


def test_every_node_links_to_its_input():
    src = Dataset.range(20)
    ds = (
        src.shuffle(5, seed=1)
        .map(lambda x: x)
        .filter(lambda x: True)
        .take(15)
        .skip(1)
        .shard(2, 0)
        .repeat(2)
        .batch(2)
        .unbatch()
        .prefetch(1)
        .with_options(Options())
    )
    kinds = []
    node = ds
    while node is not None:
        kinds.append(type(node))
        node = node._input
    assert kinds == [
        _OptionsDataset,
        PrefetchDataset,
        UnbatchDataset,
        BatchDataset,
        RepeatDataset,
        ShardDataset,
        SkipDataset,
        TakeDataset,
        FilterDataset,
        MapDataset,
        ShuffleDataset,
        RangeDataset,
    ]
    assert "BatchDataset(batch_size=2, drop_remainder=False)" in repr(ds)
    for source in (
        Dataset.range(2),
        Dataset.from_tensors(1),
        Dataset.from_tensor_slices([1]),
        Dataset.from_generator(lambda: iter([1])),
    ):
        assert source._input is None
        assert isinstance(
            source, (RangeDataset, TensorDataset, TensorSliceDataset, GeneratorDataset)
        )
        with pytest.raises(TypeError, match="source"):
            source._with_input(Dataset.range(3))


def test_with_input_copies_the_parameters():
    batch = Dataset.range(10).batch(4, drop_remainder=True)
    copy = batch._with_input(Dataset.range(100, 113))
    assert isinstance(copy, BatchDataset) and copy is not batch
    assert (copy.batch_size, copy.drop_remainder) == (4, True)
    assert ints(copy) == [[100, 101, 102, 103], [104, 105, 106, 107], [108, 109, 110, 111]]
    assert ints(batch) == [[0, 1, 2, 3], [4, 5, 6, 7]], "the original is unchanged"
    shard = Dataset.range(10).shard(3, 2)._with_input(Dataset.range(20, 26))
    assert (shard.num_shards, shard.index, ints(shard)) == (3, 2, [22, 25])
    shuffle = Dataset.range(5).shuffle(7, seed=4, reshuffle_each_iteration=False)
    moved = shuffle._with_input(Dataset.range(5))
    assert (moved.buffer_size, moved.seed, moved.reshuffle_each_iteration) == (7, 4, False)
    assert ints(moved) == ints(shuffle)
    opts = Options()
    opts.distribute.auto_shard_policy = AutoShardPolicy.OFF
    with_opts = Dataset.range(3).with_options(opts)
    rebuilt = with_opts._with_input(Dataset.range(2))
    assert rebuilt.options().distribute.auto_shard_policy is AutoShardPolicy.OFF
    mapped = Dataset.range(3).map(lambda x: x + 1, num_parallel_calls=2)
    assert ints(mapped._with_input(Dataset.range(10, 12))) == [11, 12]
    with pytest.raises(TypeError, match="expected a Dataset"):
        batch._with_input([1, 2])


def test_with_input_shares_the_shuffle_epoch_counter():
    shuffle = Dataset.range(10).shuffle(10, seed=2)
    first = ints(shuffle._with_input(Dataset.range(10)))
    second = ints(shuffle._with_input(Dataset.range(10)))
    assert first == np.random.default_rng(2).permutation(10).tolist()
    assert second == np.random.default_rng((2, 1)).permutation(10).tolist(), (
        "a pipeline rebuilt every epoch still reshuffles every epoch"
    )


def test_element_spec_is_recomputed_for_a_new_input():
    batch = Dataset.from_tensor_slices(np.zeros((4, 3))).batch(2)
    assert batch.element_spec.shape == (None, 3)
    other = batch._with_input(Dataset.from_tensor_slices(np.zeros((4, 5), np.int8)))
    assert other.element_spec == TensorSpec((None, 5), np.int8)


def test_as_numpy_iterator_and_iter_give_fresh_epochs():
    ds = Dataset.from_tensor_slices({"a": [1, 2]})
    assert [int(e["a"]) for e in ds.as_numpy_iterator()] == [1, 2]
    it1, it2 = iter(ds), iter(ds)
    assert int(next(it1)["a"]) == 1 and int(next(it2)["a"]) == 1


def test_named_tuples_keep_their_type():
    Point = collections.namedtuple("Point", "x y")
    ds = Dataset.from_tensor_slices(Point(np.arange(3), np.arange(3) * 2))
    first = next(iter(ds))
    assert isinstance(first, Point) and int(first.y) == 0
    assert isinstance(next(iter(ds.batch(2))), Point)
    assert ints(ds.map(lambda x, y: x + y)) == [0, 3, 6]


def test_string_specs_ignore_the_length():
    names = Dataset.from_tensor_slices(np.array(["a", "bbb"]))
    assert names.element_spec == TensorSpec((), np.str_)
    assert names.map(lambda s: s).element_spec == names.element_spec
    assert TensorSpec((), "U7").is_compatible_with(np.str_("abc"))


def test_from_generator_takes_a_signature_given_second():
    spec = TensorSpec((), np.int16)
    ds = Dataset.from_generator(lambda: iter([1, 2]), spec)
    assert ds.output_signature == spec and [x.dtype for x in ds] == [np.int16] * 2
    typed = Dataset.from_generator(lambda: iter([1, 2]), np.int8)
    assert [x.dtype for x in typed] == [np.int8] * 2
