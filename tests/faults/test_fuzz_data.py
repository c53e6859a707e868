"""Fuzzing the input pipeline's arguments: typed errors for bad values, exact counts for good ones.

Batch sizes, shuffle buffers, seeds, counts of ``take``/``skip``/``repeat``,
shard arguments, ``range`` bounds and types, rebatch splits, ``InputContext``,
``InputOptions`` and ``Options`` fields are drawn from a mix of good values and
bad ones (negative, huge, NumPy integers of every width, bools, floats, NaN,
strings, ``None``...). A bad value must raise ``TypeError`` or ``ValueError``
(or an hpcdist error) with a message; nothing else may leak (``OverflowError``,
``MemoryError``, ``IndexError``, NumPy's wrap-around). A good value must give
exactly the elements a plain Python model of the pipeline gives (counts and
order; with a shuffle, the same order on the fast and the element-by-element
paths, and the model's counts and multiset), and the rebatch must hand every
element to exactly one replica.
"""

from __future__ import annotations

import itertools
from decimal import Decimal
from fractions import Fraction
from typing import Any
from unittest import mock

import numpy as np
import pytest
from hypothesis import HealthCheck, event, example, given, settings
from hypothesis import strategies as st

import hpcdist.data.dataset as dsmod
from hpcdist.data.dataset import INFINITE, UNKNOWN, Dataset
from hpcdist.data.distributed import (
    distribute_dataset,
    distribute_datasets_from_function,
    worker_batches,
)
from hpcdist.data.input_context import InputContext, InputOptions, InputReplicationMode
from hpcdist.data.options import AutoShardPolicy, DistributeOptions, Options
from hpcdist.data.rebatch import batch_sizes_for_worker, split_batch, worker_sub_batches
from hpcdist.errors import HpcdistError

pytestmark = pytest.mark.timeout(180)  # a regression that hangs fails instead

FUZZ = settings(
    deadline=None,
    max_examples=300,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
#: The most elements a test iterates (a huge ``repeat`` count is only checked by cardinality).
LIMIT = 400
INT64_MAX = 2**63 - 1
TYPED = (TypeError, ValueError, HpcdistError)


def typed(fn: Any, allowed: tuple[type[BaseException], ...] = ()) -> Any:
    """``fn()``, or ``None`` when it raised a typed error with a message."""
    try:
        return fn()
    except (*TYPED, *allowed) as e:
        assert not isinstance(e, (OverflowError, MemoryError, IndexError, KeyError)), repr(e)
        text = str(e)
        assert text.strip(), f"{type(e).__name__} without a message"
        assert len(text) < 3000, f"{type(e).__name__} message of {len(text)} characters"
        return None


# Integer-like arguments: good ones, huge ones, NumPy ones, and values of the wrong type.
ODD_ARGS = st.sampled_from(
    [True, False, 2.0, 2.5, float("nan"), float("inf"), "3", None, b"1", 1 + 0j,
     Fraction(3, 1), Decimal(3), [2], np.float64(2.0), np.array(3), np.array([3])]
)
HUGE = st.sampled_from(
    [2**31, 2**62, INT64_MAX, 2**63, 2**64, 10**30, -(2**63), -(2**63) - 1, -(10**30)]
)
NP_INTS = st.sampled_from(
    [np.int8(3), np.int64(5), np.uint64(2**64 - 1), np.uint8(0), np.int32(-1), np.int16(2),
     np.uint32(7), np.int64(-(2**63))]
)
ARGS = st.one_of(st.integers(-3, 12), st.integers(-3, 12), HUGE, NP_INTS, ODD_ARGS)


# -- a model of the pipeline -------------------------------------------------------------------


def _as_int(value: Any) -> int | None:
    """The integer a good argument stands for (bools and non-integers are not)."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        return None
    return int(value)


class Model:
    """The element count of a pipeline, its elements while no shuffle came before, and its
    multiset of elements while that does not depend on a shuffled order."""

    def __init__(self, values: list[int]) -> None:
        self.elements: list[Any] | None = list(values)
        self.count: float = len(values)  # math.inf for repeat forever
        self.multiset: list[Any] | None = sorted(values)

    def _after(self, count: float, elements: list[Any] | None, keeps_content: bool) -> None:
        """Set the new count and elements; the multiset is recomputed or kept or lost."""
        unchanged = count == self.count and keeps_content
        self.count, self.elements = count, elements
        if elements is not None:
            self.multiset = sorted(elements, key=repr)
        elif count == 0:
            self.multiset = []
        elif not unchanged:
            self.multiset = None

    def take(self, c: int) -> None:
        n = self.count if c < 0 else min(self.count, c)
        elements = self.elements if self.elements is None or c < 0 else self.elements[:c]
        self._after(n, elements, True)

    def skip(self, c: int) -> None:
        # skipping from an infinite pipeline leaves it infinite, even skip(-1) (tf.data's
        # cardinality; iterating it would never end)
        n = self.count if self.count == float("inf") else 0 if c < 0 else max(0, self.count - c)
        elements = None if self.elements is None else ([] if c < 0 else self.elements[c:])
        self._after(n, elements, c == 0)

    def shard(self, k: int, i: int) -> None:
        n = self.count if self.count == float("inf") else len(range(i, int(self.count), k))
        elements = None if self.elements is None else self.elements[i::k]
        self._after(n, elements, k == 1)

    def batch(self, b: int, drop: bool) -> None:
        n = self.count
        if n != float("inf"):
            n = n // b if drop else -(-int(n) // b)
        elements = None
        if self.elements is not None:
            last = len(self.elements) // b * b if drop else len(self.elements)
            elements = [self.elements[j : j + b] for j in range(0, last, b)]
        self._after(n, elements, False)

    def repeat(self, c: int) -> None:
        if self.count == 0:
            return
        # repeat(0) of an infinite pipeline is empty (inf * 0 would be NaN)
        n = float("inf") if c < 0 else 0 if c == 0 else self.count * c
        if c < 0 or c > LIMIT:
            self.count, self.elements, self.multiset = n, None, None
            return
        multiset = None if self.multiset is None else self.multiset * c
        elements = None if self.elements is None else self.elements * c
        self._after(n, elements, False)
        if elements is None and multiset is not None:
            self.multiset = sorted(multiset, key=repr)

    def shuffle(self) -> None:
        if self.elements is not None:
            self.multiset = sorted(self.elements, key=repr)
        self.elements = None


OPS = st.sampled_from(["batch", "shuffle", "take", "skip", "shard", "repeat", "prefetch", "map"])


@st.composite
def pipelines(draw: st.DrawFn) -> tuple[tuple[Any, ...], list[tuple[str, tuple[Any, ...]]]]:
    """``range`` arguments and a chain of up to four transformations with fuzzed arguments."""
    args = draw(
        st.one_of(
            st.tuples(st.integers(0, 30)),
            st.tuples(st.integers(-10, 10), st.integers(-10, 30)),
            st.tuples(
                st.integers(-10, 30), st.integers(-10, 30), st.sampled_from([1, 2, 3, -1, -2])
            ),
            st.tuples(ARGS),
            st.tuples(ARGS, ARGS, ARGS),
        )
    )
    ops = []
    for op in draw(st.lists(OPS, max_size=4)):
        if op == "batch":
            params: tuple[Any, ...] = (draw(st.integers(1, 7) | ARGS), draw(st.booleans()))
        elif op == "shuffle":
            params = (draw(st.integers(1, 40) | ARGS), draw(st.integers(0, 99) | ARGS),
                      draw(st.sampled_from([None, True, False])))
        elif op == "shard":
            k = draw(st.integers(1, 4) | ARGS)
            params = (k, draw(st.integers(0, 3) | ARGS))
        elif op == "map":
            params = (draw(st.sampled_from([None, 1, 2, -1]) | ARGS),)
        else:
            params = (draw(st.integers(-1, 5) | ARGS),)
        ops.append((op, params))
    return args, ops


def _build(args: tuple[Any, ...], ops: list[tuple[str, tuple[Any, ...]]]) -> Dataset:
    ds: Dataset = Dataset.range(*args)
    for op, params in ops:
        if op == "map":
            ds = ds.map(lambda x: x, num_parallel_calls=params[0])
        elif op == "shuffle":
            ds = ds.shuffle(params[0], seed=params[1], reshuffle_each_iteration=params[2])
        else:
            ds = getattr(ds, op)(*params)
    return ds


#: Pipelines over larger ranges are only checked by cardinality (a batch or a shuffle buffer
#: of 2**62 elements runs out of memory, as it would in tf.data).
MAX_SOURCE = 10_000


def _walks_too_far(ops: list[tuple[str, tuple[Any, ...]]]) -> bool:
    """Whether iterating would walk more than :data:`MAX_SOURCE` elements for one output:
    after a ``repeat`` forever or of more than that many, a ``skip`` of all (-1) or of more
    than that many, or a ``shard``, ``batch`` or shuffle buffer of more than that many
    (``range(14).repeat(2**63 - 1).skip(2**63 - 1)`` steps through its elements one by
    one, as tf.data does). Such pipelines are checked by cardinality only.
    """
    repeated = False
    for op, params in ops:
        count = None if params[0] is None else int(params[0])
        if op == "repeat":
            repeated = repeated or count is None or count < 0 or count > MAX_SOURCE
        elif repeated and op in ("skip", "shard", "batch", "shuffle") and count is not None:
            if count > MAX_SOURCE or (op == "skip" and count < 0):
                return True
    return False


def _model(args: tuple[Any, ...], ops: list[tuple[str, tuple[Any, ...]]]) -> Model:
    source = range(*(int(a) for a in args))
    model = Model(list(source) if len(source) <= MAX_SOURCE else [])
    if len(source) > MAX_SOURCE:
        model.count, model.elements, model.multiset = len(source), None, None
    for op, params in ops:
        if op == "take":
            model.take(int(params[0]))
        elif op == "skip":
            model.skip(int(params[0]))
        elif op == "shard":
            model.shard(int(params[0]), int(params[1]))
        elif op == "batch":
            model.batch(int(params[0]), params[1])
        elif op == "repeat":
            model.repeat(-1 if params[0] is None else int(params[0]))  # None: forever, as TF
        elif op == "shuffle":
            model.shuffle()
    return model


def _plain(element: Any) -> Any:
    return np.asarray(element).tolist()


def _elements(ds: Dataset) -> list[Any]:
    return [_plain(e) for e in itertools.islice(iter(ds), LIMIT + 1)]


@FUZZ
@given(pipelines())
@example(((0,), [("repeat", (None,))]))  # repeat(None) repeats forever; once found by the fuzzer
@example(((3,), [("repeat", (None,)), ("take", (7,))]))
@example(((2,), [("repeat", (None,)), ("repeat", (0,))]))  # forever, then none: empty
@example(((14,), [("skip", (12,)), ("take", (3,)), ("repeat", (INT64_MAX,)), ("skip", (INT64_MAX,))]))  # noqa: E501 (once hung: walked 2**63 elements)
@example(((1,), [("repeat", (-1,)), ("skip", (-1,))]))  # infinite: skip(-1) never ends
@example(((28, 20, -2), [("repeat", (2**62,)), ("shuffle", (2**31, 1, True))]))  # 2**31 buffered
def test_pipeline_arguments_are_typed_errors_or_exact_elements(case: Any) -> None:
    args, ops = case
    ds = typed(lambda: _build(args, ops))
    event(f"pipeline: {'built' if ds is not None else 'refused'}")
    if ds is None:
        return
    # Every argument of a built pipeline is a good integer within int64 (or repeat's None).
    model = _model(args, ops)
    card = typed(ds.cardinality)
    assert card is not None, "cardinality() of a built pipeline must not fail"
    expected = -1 if model.count == float("inf") else model.count
    assert card == expected or (card == UNKNOWN and expected >= 0), (card, model.count)
    if 0 <= card <= INT64_MAX:
        assert typed(lambda: len(ds)) == card  # len() of a finite dataset
    else:
        assert typed(lambda: len(ds)) is None  # TypeError: infinite, unknown or too long
    if len(range(*(int(a) for a in args))) > MAX_SOURCE or _walks_too_far(ops):
        return
    batches = [op for op, params in ops if op == "batch"]
    try:
        got = _elements(ds)
    except ValueError as e:  # a batch of batches of different sizes cannot be stacked
        assert "cannot stack elements of different shapes" in str(e) and len(batches) >= 2
        return
    if model.count <= LIMIT:
        assert len(got) == model.count
    else:
        assert len(got) == LIMIT + 1
    if model.elements is not None and model.count <= LIMIT:
        assert got == [_plain(e) for e in model.elements]
    if model.multiset is not None and model.count <= LIMIT:
        assert sorted(got, key=repr) == sorted((_plain(e) for e in model.multiset), key=repr)
    # The fast paths give exactly the element-by-element order (seeded shuffles only).
    if all(op != "shuffle" or params[1] is not None for op, params in ops):
        with mock.patch.object(dsmod, "_FAST_PATHS", False):
            slow = _elements(_build(args, ops))
        assert slow == got


@FUZZ
@given(
    st.integers(-3, 3) | HUGE | NP_INTS | ODD_ARGS,
    st.sampled_from([np.int64, np.int8, np.uint8, np.int32, np.float16, np.float64, "int64",
                     "foo", object, np.str_, bool, np.complex64, None]),
)
def test_range_values_fit_their_type(bound: Any, output_type: Any) -> None:
    """``range`` refuses values its output type cannot hold, instead of wrapping them."""
    stop = _as_int(bound)
    for args in ((bound,), (bound, stop + 3 if stop is not None else 3),
                 (-3, bound) if stop is not None else (bound,)):
        ds = typed(lambda args=args: Dataset.range(*args, output_type=output_type))
        if ds is None:
            continue
        values = range(*(int(a) for a in args))  # never a list: the bounds may be huge
        dtype = np.dtype(output_type)
        assert dtype.kind in "iuf"
        expected = [float(np.float64(v).astype(dtype)) if dtype.kind == "f" else v
                    for v in values[:5]]  # integers exactly; floats rounded as a cast does
        got = [e.item() for e in itertools.islice(iter(ds), 5)]
        assert got == expected  # nothing wrapped around
        batched = next(iter(ds.batch(5)), np.empty(0)).tolist()
        assert batched == expected
        assert ds.cardinality() == len(values)


# -- rebatch -------------------------------------------------------------------------------------


@FUZZ
@given(
    st.integers(0, 40) | ARGS,
    st.integers(1, 4) | ARGS,
    st.integers(1, 4) | ARGS,
    st.integers(0, 4) | ARGS,
)
def test_batch_sizes_for_worker(g: Any, w_count: Any, r: Any, w: Any) -> None:
    sizes = typed(lambda: batch_sizes_for_worker(g, w_count, r, w))
    if sizes is None:
        return
    n = int(w_count) * int(r)
    assert len(sizes) == n and sum(sizes) == int(g)
    assert max(sizes) - min(sizes) <= 1
    global_sizes = [int(g) // n + (1 if i < int(g) % n else 0) for i in range(n)]
    shift = int(w) * int(r)
    assert sizes == global_sizes[shift:] + global_sizes[:shift]


@FUZZ
@given(st.integers(0, 12), st.lists(st.integers(-2, 8) | ARGS, max_size=5))
def test_split_batch_takes_consecutive_rows(b: int, sizes: list[Any]) -> None:
    element = {"x": np.arange(b), "y": np.arange(b * 2).reshape(b, 2)}
    pieces = typed(lambda: split_batch(element, sizes))
    if pieces is None:
        return
    assert [len(p["x"]) for p in pieces] == [int(s) for s in sizes]
    assert [x for p in pieces for x in p["x"].tolist()] == list(range(b))
    assert [x for p in pieces for x in p["y"].reshape(-1).tolist()] == list(range(2 * b))


@FUZZ
@given(st.integers(0, 30), st.integers(1, 4), st.integers(1, 4), st.booleans())
def test_every_row_goes_to_exactly_one_replica(b: int, w_count: int, r: int, own: bool) -> None:
    rows = np.arange(b)
    seen: list[int] = []
    for w in range(w_count):
        pieces = worker_sub_batches(rows, w_count, r, w, own_part_only=own)
        if own:
            assert len(pieces) == r
            seen += [int(x) for p in pieces for x in p]
        else:  # every worker gets all rows, in its rotated order
            assert sorted(int(x) for p in pieces for x in p) == list(range(b))
            sizes = [len(p) for p in pieces]
            assert max(sizes) - min(sizes) <= 1
    if own:
        assert seen == list(range(b))


# -- distributing --------------------------------------------------------------------------------

# Replica counts: no huge ones, which the strategy's layout would build tuples of (reported).
SAFE_REPLICAS = st.one_of(ODD_ARGS, st.sampled_from([np.int8(3), np.uint32(2), np.int64(-1), 0]))
OPTION_VALUES = st.one_of(st.booleans(), st.none(), st.integers(-1, 3), ODD_ARGS, HUGE,
                          st.sampled_from(list(InputReplicationMode) + ["PER_WORKER", "x"]))


@st.composite
def input_options(draw: st.DrawFn) -> dict[str, Any]:
    fields = {}
    for name in ("experimental_fetch_to_device", "experimental_replication_mode",
                 "experimental_place_dataset_on_device", "experimental_per_replica_buffer_size"):
        if draw(st.integers(0, 2)) == 0:
            fields[name] = draw(OPTION_VALUES)
    return fields


def _per_replica_values(step: Any, r: int) -> list[np.ndarray]:
    return [step] if r == 1 else list(step.values)


@FUZZ
@given(
    st.integers(0, 40),
    st.integers(1, 9) | ARGS,
    st.booleans(),
    st.integers(1, 4) | SAFE_REPLICAS,
    input_options(),
    st.booleans(),
)
def test_distribute_dataset_feeds_every_element_once(
    n: int, g: Any, drop: bool, r: Any, option_fields: dict[str, Any], shuffled: bool
) -> None:
    options = typed(lambda: InputOptions(**option_fields))
    if options is None:
        return
    ds = Dataset.range(n)
    if shuffled:
        ds = ds.shuffle(7, seed=3)
    ds = typed(lambda: ds.batch(g, drop_remainder=drop))
    if ds is None:
        return
    dist = typed(
        lambda: distribute_dataset(ds, num_replicas_per_worker=r, options=options),
        allowed=(NotImplementedError,),
    )
    if dist is None:
        return
    r, g = (1 if r is None else int(r)), int(g)  # None: one replica per device, one device
    got: list[int] = []
    for step in dist:
        values = _per_replica_values(step, r)
        sizes = [len(v) for v in values]
        assert max(sizes) - min(sizes) <= 1, sizes
        assert sizes == sorted(sizes, reverse=True)  # the larger sub-batches first
        got += [int(x) for v in values for x in v]
    total = n // g * g if drop else n
    assert len(got) == total
    if shuffled:
        assert set(got) <= set(range(n)) and len(set(got)) == total
    else:
        assert got == list(range(total))


@FUZZ
@given(
    st.integers(0, 40),
    st.integers(1, 9),
    st.integers(1, 4),
    st.integers(1, 3),
    st.sampled_from(["DATA", "OFF", "AUTO", "HINT", "FILE", 2, -1, 7, "x", None, 1.0, True]),
)
def test_worker_batches_share_the_data_out(
    n: int, g: int, w_count: int, r: int, policy: Any
) -> None:
    ds = Dataset.range(n).batch(g)
    per_worker = []
    for w in range(w_count):
        steps = typed(lambda w=w: list(worker_batches(ds, w_count, w, r, policy=policy)))
        if steps is None:
            return
        per_worker.append([int(x) for step in steps for v in step for x in v])
    chosen = AutoShardPolicy.from_any(policy) if policy is not None else AutoShardPolicy.AUTO
    if w_count == 1 or chosen in (AutoShardPolicy.OFF, AutoShardPolicy.HINT):
        for elements in per_worker:  # every worker reads everything
            assert sorted(elements) == list(range(n))
    else:  # DATA (AUTO on a dataset without files): each element goes to one worker
        assert sorted(x for elements in per_worker for x in elements) == list(range(n))


@FUZZ
@given(
    st.integers(0, 30),
    st.integers(1, 8) | ARGS,
    st.integers(1, 4),
    input_options(),
)
def test_distribute_datasets_from_function_reads_each_pipeline(
    n: int, g: Any, r: int, option_fields: dict[str, Any]
) -> None:
    options = typed(lambda: InputOptions(**option_fields))
    if options is None:
        return
    contexts: list[InputContext] = []

    def dataset_fn(ctx: InputContext) -> Dataset:
        contexts.append(ctx)
        size = ctx.get_per_replica_batch_size(g)
        return Dataset.range(n).shard(ctx.num_input_pipelines, ctx.input_pipeline_id).batch(size)

    dist = typed(
        lambda: distribute_datasets_from_function(
            dataset_fn, num_replicas_per_worker=r, options=options
        )
    )
    if dist is None:
        return
    got = [int(x) for step in dist for v in _per_replica_values(step, r) for x in v]
    assert sorted(got) == list(range(n))
    per_replica = options.experimental_replication_mode is InputReplicationMode.PER_REPLICA
    assert [(c.num_input_pipelines, c.input_pipeline_id) for c in contexts] == (
        [(r, i) for i in range(r)] if per_replica else [(1, 0)]
    )
    assert all(c.num_replicas_in_sync == r for c in contexts)


@FUZZ
@given(st.integers(1, 4) | ARGS, st.integers(0, 4) | ARGS, st.integers(1, 8) | ARGS,
       st.integers(0, 64) | ARGS)
def test_input_context(pipelines_: Any, pipeline_id: Any, replicas: Any, batch: Any) -> None:
    ctx = typed(lambda: InputContext(pipelines_, pipeline_id, replicas))
    if ctx is None:
        return
    assert 0 <= ctx.input_pipeline_id < ctx.num_input_pipelines
    size = typed(lambda: ctx.get_per_replica_batch_size(batch))
    if size is not None:
        assert size * ctx.num_replicas_in_sync == int(batch)


@FUZZ
@given(
    st.one_of(st.sampled_from(list(AutoShardPolicy)), st.sampled_from(
        ["data", " FILE ", "off", "Auto", "hint", "none", ""]), st.integers(-3, 5), ODD_ARGS,
        HUGE, NP_INTS),
    st.one_of(st.none(), st.integers(-1, 4), ODD_ARGS, HUGE),
    st.one_of(st.none(), st.booleans(), ODD_ARGS),
)
def test_options_fields(policy: Any, num_devices: Any, deterministic: Any) -> None:
    dist = typed(lambda: DistributeOptions(auto_shard_policy=policy, num_devices=num_devices))
    options = Options()
    for name, value in (("auto_shard_policy", policy), ("num_devices", num_devices)):
        typed(lambda name=name, value=value: setattr(options.distribute, name, value))
    typed(lambda: setattr(options, "deterministic", deterministic))
    typed(lambda: setattr(options, "experimental_deterministic", deterministic))
    if dist is not None:
        assert isinstance(dist.auto_shard_policy, AutoShardPolicy)
        assert dist.num_devices is None or dist.num_devices >= 1
        options.distribute = dist
        ds = Dataset.range(4).batch(2).with_options(options)
        merged = ds.options()
        assert merged.distribute.auto_shard_policy == dist.auto_shard_policy
        assert merged.distribute.num_devices == dist.num_devices
    assert options.deterministic in (None, True, False)
    typed(lambda: setattr(options, "distribute", policy))
    with pytest.raises(AttributeError, match="has no option"):
        options.no_such_option = 1  # a misspelt option name is an AttributeError, as in Python


@pytest.mark.parametrize(
    ("make", "error"),
    [
        (lambda: Dataset.range(10**30), ValueError),
        (lambda: Dataset.range(-(2**63), INT64_MAX), ValueError),
        (lambda: Dataset.range(2**62, 2**63 + 2**62, 2**62), ValueError),
        (lambda: Dataset.range(250, 260, output_type=np.int8), ValueError),
        (lambda: Dataset.range(-1, 2, output_type=np.uint8), ValueError),
        (lambda: Dataset.range(70000, output_type=np.float16), ValueError),
        (lambda: Dataset.range(3, output_type="foo"), TypeError),
        (lambda: Dataset.range(5).repeat(10**30), ValueError),
        (lambda: Dataset.range(5).take(2**63), ValueError),
        (lambda: Dataset.from_generator(lambda: iter([1, 2])).skip(10**30), ValueError),
        (lambda: Dataset.range(5).shuffle(4, seed=2**64), ValueError),
        (lambda: batch_sizes_for_worker(10, 10**12, 2, 1), ValueError),
        (lambda: split_batch(np.arange(2), [-1, 3]), ValueError),
        (lambda: split_batch(np.arange(2), [1.0, 1.0]), TypeError),
    ],
    ids=["range-huge", "range-len", "range-wraps", "int8", "uint8", "float16-inf", "dtype",
         "repeat", "take", "skip", "seed", "replicas", "negative-split", "float-split"],
)
def test_out_of_range_arguments(make: Any, error: type[Exception]) -> None:
    with pytest.raises(error) as info:
        make()
    assert len(str(info.value)) > 20


def test_len_of_a_huge_finite_dataset() -> None:
    ds = Dataset.range(2**40).repeat(2**40)  # cardinality 2**80: larger than len() can return
    assert ds.cardinality() == 2**80
    with pytest.raises(TypeError, match="cardinality"):
        len(ds)


@pytest.mark.timeout(30)
def test_map_with_huge_parallelism_yields_from_an_infinite_dataset() -> None:
    """``num_parallel_calls`` is capped: the pool does not wait for 2**62 elements in flight."""
    ds = Dataset.range(3).repeat().map(lambda x: x * 2, num_parallel_calls=2**62)
    assert [int(x) for x in itertools.islice(iter(ds), 7)] == [0, 2, 4, 0, 2, 4, 0]


def test_cardinality_constants() -> None:
    assert Dataset.range(3).repeat().cardinality() == INFINITE
    assert Dataset.range(3).filter(lambda x: True).cardinality() == UNKNOWN


@pytest.mark.parametrize("replicas", [2**40, 10**30, np.uint64(2**64 - 1)])
def test_huge_replica_counts_are_refused(replicas: Any) -> None:
    with pytest.raises(ValueError):
        distribute_dataset(Dataset.range(4).batch(2), num_replicas_per_worker=replicas)
