"""Variables: plain, mirrored and sync-on-read, in both contexts, for every aggregation."""

from __future__ import annotations

import contextlib

import numpy as np
import pytest

import hpcdist as hd
from hpcdist.distribute.values import Mirrored, PerReplica
from tests.unit.distribute.conftest import rid

AGGREGATIONS = ["NONE", "SUM", "MEAN", "ONLY_FIRST_REPLICA"]
CPU = "/job:localhost/replica:0/task:0/device:CPU:"


def make(strategy, initial=1.0, **kwargs):
    with strategy.scope():
        return hd.Variable(initial, **kwargs)


def comps(v) -> list:
    return [c.numpy().tolist() for c in v.values]


# -- plain variables ---------------------------------------------------------------------------


def test_outside_a_scope_a_plain_variable():
    v = hd.Variable(np.arange(3.0), name="w")
    assert type(v) is hd.Variable and isinstance(v, hd.Variable)
    assert not isinstance(v, hd.DistributedVariable)
    assert (v.name, v.shape, v.dtype, v.ndim, v.size, len(v)) == ("w", (3,), np.float64, 1, 3, 3)
    assert v.trainable is True
    assert v.synchronization is hd.VariableSynchronization.AUTO
    assert v.aggregation is hd.VariableAggregation.NONE
    assert v.device == "/device:CPU:0"
    assert hd.Variable(1.0).name == "Variable"


def test_trainable_defaults_to_false_for_on_read():
    assert hd.Variable(1.0, synchronization="ON_READ").trainable is False
    assert hd.Variable(1.0, synchronization="ON_READ", trainable=True).trainable is True
    assert hd.Variable(1.0, trainable=False).trainable is False


def test_initial_values():
    assert hd.Variable(lambda: np.zeros(2)).numpy().tolist() == [0.0, 0.0]
    assert hd.Variable(1, dtype=np.float32).dtype == np.float32
    assert hd.Variable(np.zeros(2), shape=(2,)).shape == (2,)
    assert hd.Variable(hd.Variable(3.0)).numpy() == 3.0
    with pytest.raises(ValueError, match=r"shape \(2,\), but shape=\(3,\)"):
        hd.Variable(np.zeros(2), shape=(3,))
    with pytest.raises(ValueError, match="initial_value must be given"):
        hd.Variable()


def test_the_initial_value_is_copied():
    source = np.arange(3.0)
    v = hd.Variable(source)
    source[0] = 99.0
    assert v.numpy().tolist() == [0.0, 1.0, 2.0]


def test_assign_copies_its_value():
    v = hd.Variable(np.zeros(3))
    source = np.full(3, 7.0)
    v.assign(source)
    source[0] = -1.0
    assert v.numpy().tolist() == [7.0, 7.0, 7.0]


def test_reads_are_read_only_snapshots():
    v = hd.Variable(np.arange(3.0))
    before = v.read_value()
    assert isinstance(before, np.ndarray) and not before.flags.writeable
    with pytest.raises(ValueError, match="read-only"):
        before[0] = 5.0
    v.assign(np.ones(3))
    value = v.value()
    v.assign_add(np.ones(3))
    v.assign_sub(np.full(3, 0.5))
    assert before.tolist() == [0.0, 1.0, 2.0]
    assert value.tolist() == [1.0, 1.0, 1.0]
    assert v.numpy().tolist() == [1.5, 1.5, 1.5]


def test_numpy_is_a_writeable_copy():
    v = hd.Variable(np.arange(3.0))
    n = v.numpy()
    n[0] = 100.0
    assert n.flags.writeable
    assert v.numpy()[0] == 0.0


def test_np_array_of_a_variable_is_a_writeable_copy():
    v = hd.Variable(np.arange(3.0))
    a = np.array(v)
    a[0] = 100.0
    assert v.numpy()[0] == 0.0


def test_np_asarray_of_a_variable_is_its_read_only_value():
    v = hd.Variable(np.arange(3.0))
    a = np.asarray(v)
    assert a.tolist() == [0.0, 1.0, 2.0]
    assert not a.flags.writeable
    assert np.asarray(v, dtype=np.float32).dtype == np.float32


def test_a_scalar_variable_reads_as_an_array_after_an_update():
    v = hd.Variable(1.0)
    assert isinstance(v.read_value(), np.ndarray)
    v.assign_add(1.0)
    value = v.read_value()
    assert isinstance(value, np.ndarray) and value.shape == ()
    assert not value.flags.writeable


def test_arithmetic_works_on_the_value():
    v = hd.Variable(np.array([1.0, 2.0, 3.0]))
    assert (v + 1).tolist() == [2.0, 3.0, 4.0]
    assert (2 * v).tolist() == [2.0, 4.0, 6.0]
    assert (v - v).tolist() == [0.0, 0.0, 0.0]
    assert (-v).tolist() == [-1.0, -2.0, -3.0]
    assert (v**2).tolist() == [1.0, 4.0, 9.0]
    assert (v @ np.ones(3)) == 6.0
    assert (v > 1.5).tolist() == [False, True, True]
    assert abs(-v).tolist() == [1.0, 2.0, 3.0]
    assert np.sum(v) == 6.0
    assert v[1] == 2.0 and v[1:].tolist() == [2.0, 3.0]
    assert float(hd.Variable(2.5)) == 2.5
    assert int(hd.Variable(3)) == 3
    assert bool(hd.Variable(0.0)) is False


def test_in_place_operators_rebind_and_leave_the_variable_alone():
    v = hd.Variable(np.ones(2))
    x = v
    x += 1
    assert isinstance(x, np.ndarray) and x.tolist() == [2.0, 2.0]
    assert v.numpy().tolist() == [1.0, 1.0]


def test_a_variable_cannot_be_the_output_of_a_ufunc():
    v = hd.Variable(np.ones(2))
    with pytest.raises(TypeError, match="use assign"):
        np.add(np.ones(2), 1.0, out=v)
    with pytest.raises(TypeError):
        np.add(np.ones(2), 1.0, out=(v,))


def test_variables_hash_by_identity():
    a, b = hd.Variable(1.0), hd.Variable(1.0)
    assert {a: "a", b: "b"}[a] == "a"
    assert len({a, b}) == 2


def test_repr():
    v = hd.Variable(np.array([1.0, 2.0]), name="w")
    assert repr(v) == "<hpcdist.Variable 'w' shape=(2,) dtype=float64, numpy=[1. 2.]>"


def test_assign_returns_the_variable_or_none():
    v = hd.Variable(1.0)
    assert v.assign(2.0) is v
    assert v.assign_add(1.0) is v
    assert v.assign_sub(1.0) is v
    assert v.assign(5.0, read_value=False) is None
    assert v.assign_add(1.0, read_value=False) is None
    assert v.assign_sub(1.0, read_value=False) is None
    assert v.numpy() == 5.0


@pytest.mark.parametrize("op", ["assign", "assign_add", "assign_sub"])
@pytest.mark.parametrize("value", [np.ones(2), 1.0, np.ones((3, 1)), np.ones((1, 3))])
def test_assign_checks_the_shape(op, value):
    v = hd.Variable(np.zeros(3), name="w")
    with pytest.raises(ValueError, match=r"to variable 'w' of shape \(3,\)"):
        getattr(v, op)(value)
    assert v.numpy().tolist() == [0.0, 0.0, 0.0]


@pytest.mark.parametrize(
    ("var_dtype", "value"),
    [
        (np.int32, np.array([1.5, 2.5])),
        (np.int64, np.array([1.0, 2.0])),
        (np.float32, np.array([1j, 1])),
        (np.int32, np.array(["a", "b"])),
        (np.bool_, np.array([1, 0])),
    ],
)
def test_assign_refuses_values_that_do_not_cast_safely(var_dtype, value):
    v = hd.Variable(np.zeros(2, dtype=var_dtype), name="w")
    with pytest.raises(TypeError, match=f"to variable 'w' of dtype {np.dtype(var_dtype)}"):
        v.assign(value)


@pytest.mark.parametrize(
    ("var_dtype", "value"),
    [
        (np.int32, np.array([3, 4], dtype=np.int64)),
        (np.int32, np.array([True, False])),
        (np.float32, np.array([0.5, 0.25])),
        (np.float32, np.array([1, 2])),
        (np.float64, np.array([1, 2], dtype=np.int8)),
    ],
)
def test_assign_casts_to_the_variables_dtype(var_dtype, value):
    v = hd.Variable(np.zeros(2, dtype=var_dtype))
    v.assign(value)
    assert v.dtype == var_dtype
    assert v.numpy().tolist() == value.astype(var_dtype).tolist()
    v.assign_add(value)
    assert v.dtype == var_dtype


def test_assign_from_another_variable():
    v = hd.Variable(np.zeros(2, dtype=np.float32))
    v.assign(hd.Variable(np.array([5.0, 6.0])))
    assert v.numpy().tolist() == [5.0, 6.0] and v.dtype == np.float32


@pytest.mark.parametrize(
    ("kwargs", "attr", "expected"),
    [
        ({"aggregation": "sum"}, "aggregation", hd.VariableAggregation.SUM),
        ({"aggregation": " Mean "}, "aggregation", hd.VariableAggregation.MEAN),
        ({"aggregation": "only_first_replica"}, "aggregation", "ONLY_FIRST_REPLICA"),
        ({"synchronization": "on_read"}, "synchronization", hd.VariableSynchronization.ON_READ),
        ({"synchronization": "ON_WRITE"}, "synchronization", "ON_WRITE"),
    ],
)
def test_aggregation_and_synchronization_accept_their_names(kwargs, attr, expected):
    got = getattr(hd.Variable(1.0, **kwargs), attr)
    assert got is expected or got.name == expected


@pytest.mark.parametrize(
    "kwargs",
    [
        {"aggregation": "bogus"},
        {"aggregation": 1},
        {"aggregation": hd.ReduceOp.SUM},
        {"synchronization": "sometimes"},
        {"synchronization": 3},
    ],
)
def test_invalid_aggregation_or_synchronization(kwargs):
    name = next(iter(kwargs))
    with pytest.raises(ValueError, match=f"{name} is .*expected a hpcdist.Variable"):
        hd.Variable(1.0, **kwargs)


def test_synchronization_none_is_refused_in_a_strategy_scope(s):
    assert hd.Variable(0.0, synchronization="NONE").numpy() == 0.0
    with pytest.raises(ValueError, match="synchronization NONE is not supported"):
        make(s, 0.0, synchronization="NONE")


# -- mirrored variables ----------------------------------------------------------------------


def test_in_a_mirrored_scope_a_mirrored_variable(s):
    v = make(s, 1.0)
    assert type(v) is hd.MirroredVariable
    assert isinstance(v, hd.DistributedVariable) and isinstance(v, hd.Variable)
    assert (v.synchronization, v.aggregation) == (
        hd.VariableSynchronization.AUTO,
        hd.VariableAggregation.NONE,
    )
    assert v.trainable is True and v.name == "Variable"
    assert [c.name for c in v.values] == ["Variable", "Variable/replica_1"]
    assert [c.device for c in v.values] == [CPU + "0", CPU + "1"]
    assert v.device == CPU + "0"
    assert all(type(c) is hd.Variable for c in v.values)
    assert v.primary is v.values[0]
    assert repr(v) == "<hpcdist.MirroredVariable 'Variable' shape=() dtype=float64, numpy=1.>"
    assert type(make(s, 1.0, synchronization="ON_WRITE")) is hd.MirroredVariable


def test_mirrored_components_are_separate_copies(s):
    source = np.arange(3.0)
    v = make(s, source, name="w")
    source[0] = 50.0
    a, b = (c.raw_value() for c in v.values)
    assert not np.shares_memory(a, b)
    assert comps(v) == [[0.0, 1.0, 2.0]] * 2
    assert v.shape == (3,) and v.dtype == np.float64


def test_mirrored_variable_reads_and_snapshots(s):
    v = make(s, np.arange(2.0))
    before = v.read_value()
    v.assign([5.0, 6.0])
    assert before.tolist() == [0.0, 1.0] and not before.flags.writeable
    assert v.numpy().tolist() == [5.0, 6.0]
    assert (v * 2).tolist() == [10.0, 12.0]
    assert float(make(s, 2.5)) == 2.5
    assert len(v) == 2


@pytest.mark.timeout(20)
def test_in_replica_context_a_mirrored_variable_reads_its_own_component(s):
    v = make(s, np.arange(2.0))
    v.values[1]._set("assign", np.array([10.0, 11.0]))  # make the copies differ, to tell them apart
    out = s.experimental_local_results(
        s.run(lambda: (v.read_value().tolist(), v.device, (v + rid()).tolist(), float(v[0])))
    )
    assert out == (
        ([0.0, 1.0], CPU + "0", [0.0, 1.0], 0.0),
        ([10.0, 11.0], CPU + "1", [11.0, 12.0], 10.0),
    )


# Replica-context writes: (aggregation, operation, the value each replica passes) -> components.
# Replica 0 passes a, replica 1 passes b; the variable starts at 1.0.
REPLICA_WRITES = {
    ("SUM", "assign_add", "const"): 3.0,  # 1 + (1 + 1): hpcdist sums every replica's 1.0
    ("SUM", "assign_add", "rid+1"): 4.0,  # 1 + (1 + 2)
    ("SUM", "assign", "rid+5"): 11.0,  # 5 + 6
    ("SUM", "assign_sub", "const"): -1.0,  # 1 - (1 + 1)
    ("MEAN", "assign_add", "const"): 2.0,
    ("MEAN", "assign_add", "rid+1"): 2.5,
    ("MEAN", "assign", "rid+5"): 5.5,
    ("MEAN", "assign_sub", "const"): 0.0,
    ("ONLY_FIRST_REPLICA", "assign_add", "const"): 2.0,
    ("ONLY_FIRST_REPLICA", "assign_add", "rid+1"): 2.0,
    ("ONLY_FIRST_REPLICA", "assign", "rid+5"): 5.0,
    ("ONLY_FIRST_REPLICA", "assign_sub", "const"): 0.0,
}
ARGUMENTS = {
    "const": lambda: 1.0,
    "rid+1": lambda: np.float32(rid() + 1),
    "rid+5": lambda: np.float32(rid() + 5),
}


@pytest.mark.timeout(20)
@pytest.mark.parametrize(("aggregation", "op", "arg"), sorted(REPLICA_WRITES))
def test_mirrored_write_in_replica_context(s, aggregation, op, arg):
    v = make(s, np.float32(1.0), aggregation=aggregation)
    out = s.run(lambda: getattr(v, op)(ARGUMENTS[arg]()))
    assert out is v
    expected = REPLICA_WRITES[(aggregation, op, arg)]
    assert comps(v) == [expected, expected]
    assert v.dtype == np.float32


@pytest.mark.timeout(20)
@pytest.mark.parametrize("op", ["assign", "assign_add", "assign_sub"])
@pytest.mark.parametrize("arg", ["const", "rid+1"])
def test_mirrored_write_in_replica_context_without_aggregation_raises(s, op, arg):
    v = make(s, np.float32(1.0))
    with pytest.raises(ValueError, match="You must specify an aggregation method") as info:
        s.run(lambda: getattr(v, op)(ARGUMENTS[arg]()))
    assert "cross-replica context" in str(info.value)
    assert comps(v) == [1.0, 1.0]


@pytest.mark.timeout(20)
def test_mirrored_write_in_replica_context_with_read_value_false(s):
    v = make(s, 1.0, aggregation="SUM")
    assert s.run(lambda: v.assign_add(1.0, read_value=False)) is None
    assert comps(v) == [3.0, 3.0]


@pytest.mark.timeout(20)
def test_sum_of_a_constant_counts_every_replica(s3):
    v = make(s3, 0.0, aggregation="SUM")
    s3.run(lambda: v.assign_add(1.0))
    assert comps(v) == [3.0, 3.0, 3.0]


@pytest.mark.timeout(20)
def test_a_sequence_of_replica_writes(s):
    v = make(s, 0.0, aggregation="MEAN")

    def step():
        for _ in range(5):
            v.assign_add(np.float64(rid() * 2))  # mean of 0 and 2 is 1
        return v.read_value()

    out = s.run(step)
    assert s.experimental_local_results(out) == (5.0, 5.0)
    assert comps(v) == [5.0, 5.0]


@pytest.mark.timeout(20)
def test_int_variable_with_sum_aggregation_keeps_its_dtype(s):
    v = make(s, np.int32(1), aggregation="SUM")
    s.run(lambda: v.assign_add(np.int32(rid() + 1)))
    assert comps(v) == [4, 4] and v.dtype == np.int32


@pytest.mark.parametrize("sync", ["ON_WRITE", "ON_READ"])
@pytest.mark.parametrize("initial", [1, np.int32(1), np.int64([1, 2])])
def test_mean_aggregation_needs_a_float_variable(s, sync, initial):
    with pytest.raises(ValueError, match="aggregation MEAN must have a floating dtype"):
        make(s, initial, aggregation="MEAN", synchronization=sync)
    assert make(s, np.float64(1.0), aggregation="MEAN").dtype == np.float64


@pytest.mark.timeout(20)
def test_mirrored_replica_write_of_a_wrong_dtype_or_shape_changes_nothing(s):
    v = make(s, np.int64([1, 2]), aggregation="SUM", name="n")
    with pytest.raises(TypeError, match="cast it first"):
        s.run(lambda: v.assign_add(np.array([1.5, 2.5])))
    with pytest.raises(ValueError, match="shapes must match"):
        s.run(lambda: v.assign(np.ones(3, dtype=np.int64)))
    assert comps(v) == [[1, 2], [1, 2]]


@pytest.mark.parametrize("aggregation", AGGREGATIONS)
@pytest.mark.parametrize("in_scope", [False, True])
def test_mirrored_write_in_cross_replica_context(s, aggregation, in_scope):
    v = make(s, np.float32(1.0), aggregation=aggregation)
    with s.scope() if in_scope else contextlib.nullcontext():
        assert v.assign(3.0) is v
        assert comps(v) == [3.0, 3.0]
        assert v.assign_add(1.0) is v
        assert comps(v) == [4.0, 4.0]
        assert v.assign_sub(0.5) is v
        assert comps(v) == [3.5, 3.5]
        assert v.assign_add(1.0, read_value=False) is None
        assert comps(v) == [4.5, 4.5]


@pytest.mark.parametrize("aggregation", AGGREGATIONS)
@pytest.mark.parametrize("op", ["assign", "assign_add", "assign_sub"])
def test_mirrored_cross_replica_write_of_a_per_replica_value_raises(s, aggregation, op):
    v = make(s, np.float32(1.0), aggregation=aggregation)
    with pytest.raises(TypeError, match="got a PerReplica") as info:
        getattr(v, op)(PerReplica((np.float32(10.0), np.float32(11.0))))
    assert "reduce it first" in str(info.value)
    assert comps(v) == [1.0, 1.0]


def test_mirrored_cross_replica_write_of_a_mirrored_value(s):
    v = make(s, np.float32(1.0))
    v.assign(Mirrored((np.float32(10.0), np.float32(10.0))))
    assert comps(v) == [10.0, 10.0]


def test_mirrored_cross_replica_write_checks_dtype_and_shape(s):
    v = make(s, np.zeros(2, dtype=np.int32), name="n")
    with pytest.raises(TypeError, match="cast it first"):
        v.assign(np.array([0.5, 0.5]))
    with pytest.raises(ValueError, match="shapes must match"):
        v.assign_add(np.ones(3, dtype=np.int32))
    assert comps(v) == [[0, 0], [0, 0]]


@pytest.mark.timeout(20)
def test_a_variable_created_inside_run_is_mirrored_from_replica_zero(s):
    out = s.run(lambda: hd.Variable(np.float64(rid() + 7)))
    assert type(out) is hd.MirroredVariable  # one variable, the same object for every replica
    assert comps(out) == [7.0, 7.0]


def test_reducing_a_mirrored_variable(s):
    v = make(s, 2.0)
    with pytest.raises(ValueError, match="cannot be SUM-reduced"):
        s.reduce("SUM", v, axis=None)
    assert s.reduce("MEAN", v, axis=None) == 2.0
    assert s.reduce("MAX", v, axis=None) == 2.0


@pytest.mark.timeout(20)
def test_a_variable_of_one_strategy_in_another_strategys_run_or_scope(s):
    v = make(s, 1.0, aggregation="SUM")
    other = hd.MirroredStrategy(["/cpu:0", "/cpu:1"])
    with pytest.raises(RuntimeError, match="Mixing different strategies"):
        other.run(lambda: v.assign_add(1.0))
    with other.scope():
        with pytest.raises(RuntimeError, match="Mixing"):
            v.read_value()
        with pytest.raises(RuntimeError, match="Mixing"):
            v.assign(2.0)
    assert comps(v) == [1.0, 1.0]


@pytest.mark.timeout(20)
def test_one_replica_mirrored_strategy_variables():
    m1 = hd.MirroredStrategy(["/cpu:0"])
    v = make(m1, 1.0, aggregation="SUM")
    assert type(v) is hd.MirroredVariable and len(v.values) == 1
    m1.run(lambda: v.assign_add(1.0))
    assert comps(v) == [2.0]
    w = make(m1, 1.0)
    with pytest.raises(ValueError, match="aggregation method"):
        m1.run(lambda: w.assign_add(1.0))


# -- sync-on-read variables ------------------------------------------------------------------------


@pytest.mark.parametrize("aggregation", AGGREGATIONS)
def test_sync_on_read_variable(s, aggregation):
    v = make(s, np.float32(0.0), synchronization="ON_READ", aggregation=aggregation)
    assert type(v) is hd.SyncOnReadVariable and isinstance(v, hd.DistributedVariable)
    assert v.trainable is False
    assert v.synchronization is hd.VariableSynchronization.ON_READ
    assert v.aggregation.name == aggregation
    assert [c.name for c in v.values] == ["Variable", "Variable/replica_1"]
    assert make(s, 0.0, synchronization="ON_READ", trainable=True).trainable is True
    assert make(s, 0.0, synchronization="ON_READ").aggregation is hd.VariableAggregation.NONE


def sync_on_read_with_1_and_2(s, aggregation, dtype=np.float32):
    """A sync-on-read variable whose replicas added 1 and 2 to 0."""
    v = make(s, dtype(0), synchronization="ON_READ", aggregation=aggregation)
    out = s.run(lambda: v.assign_add(dtype(rid() + 1)))
    assert out is v
    assert comps(v) == [1, 2]
    return v


@pytest.mark.timeout(20)
@pytest.mark.parametrize("aggregation", AGGREGATIONS)
def test_sync_on_read_replicas_write_and_read_their_own_copy(s, aggregation):
    v = sync_on_read_with_1_and_2(s, aggregation)
    reads = s.run(lambda: float(v.read_value()))
    assert s.experimental_local_results(reads) == (1.0, 2.0)
    assert s.experimental_local_results(v) == v.values
    assert s.reduce("SUM", v, axis=None) == 3.0
    assert s.reduce("MEAN", v, axis=None) == 1.5
    s.run(lambda: v.assign(np.float32(5.0)))
    assert comps(v) == [5.0, 5.0]


@pytest.mark.timeout(20)
@pytest.mark.parametrize(
    ("aggregation", "expected"), [("SUM", 3.0), ("MEAN", 1.5), ("ONLY_FIRST_REPLICA", 1.0)]
)
def test_sync_on_read_cross_replica_read_combines_the_copies(s, aggregation, expected):
    v = sync_on_read_with_1_and_2(s, aggregation)
    assert float(v.read_value()) == expected
    assert float(v) == expected
    assert float(v + 0) == expected
    assert float(s.extended.read_var(v)) == expected
    with s.scope():
        assert float(v.value()) == expected


@pytest.mark.timeout(20)
def test_sync_on_read_without_aggregation_has_no_cross_replica_value(s):
    v = sync_on_read_with_1_and_2(s, "NONE")
    for read in (v.read_value, v.value, lambda: float(v), lambda: v + 0):
        with pytest.raises(ValueError, match="aggregation NONE, so it has no value") as info:
            read()
        assert "inside strategy.run" in str(info.value)
    assert v.shape == () and v.dtype == np.float32
    assert "SyncOnReadVariable" in repr(v)


def test_sync_on_read_metadata_without_aggregation(s):
    v = make(s, np.zeros(3), synchronization="ON_READ")
    assert (v.shape, v.ndim, v.size, len(v)) == ((3,), 1, 3, 3)


def test_sync_on_read_metadata_does_not_reduce(s, monkeypatch):
    v = make(s, np.zeros(3), synchronization="ON_READ", aggregation="SUM")
    calls = []
    original = s.extended.reduce_leaves
    monkeypatch.setattr(
        s.extended, "reduce_leaves", lambda *a, **k: calls.append(1) or original(*a, **k)
    )
    assert (v.ndim, v.size, len(v)) == (1, 3, 3)
    assert calls == []


@pytest.mark.timeout(20)
def test_sync_on_read_mean_reads_as_an_array(s):
    v = sync_on_read_with_1_and_2(s, "MEAN")
    value = v.read_value()
    assert isinstance(value, np.ndarray) and value.shape == ()


@pytest.mark.parametrize("aggregation", ["NONE", "MEAN", "ONLY_FIRST_REPLICA"])
def test_sync_on_read_cross_replica_writes_set_every_copy(s, aggregation):
    v = make(s, np.float32(0.0), synchronization="ON_READ", aggregation=aggregation)
    assert v.assign(10.0) is v
    assert comps(v) == [10.0, 10.0]
    assert v.assign_add(1.0) is v
    assert comps(v) == [11.0, 11.0]
    assert v.assign_sub(1.0) is v
    assert comps(v) == [10.0, 10.0]
    assert v.assign(3.0, read_value=False) is None


def test_sync_on_read_sum_cross_replica_assign_splits_the_value(s):
    v = make(s, np.float32(0.0), synchronization="ON_READ", aggregation="SUM")
    assert v.assign(10.0) is v
    assert comps(v) == [5.0, 5.0]
    assert float(v.read_value()) == 10.0


@pytest.mark.parametrize("op", ["assign_add", "assign_sub"])
def test_sync_on_read_sum_cross_replica_add_and_sub_raise(s, op):
    v = make(s, np.float32(4.0), synchronization="ON_READ", aggregation="SUM")
    with pytest.raises(ValueError, match=f"does not support {op}") as info:
        getattr(v, op)(1.0)
    assert "inside strategy.run" in str(info.value)
    assert comps(v) == [4.0, 4.0]


@pytest.mark.timeout(20)
def test_sync_on_read_int_sum_assign_truncates_like_tf(s):
    v = make(s, np.int32(1), synchronization="ON_READ", aggregation="SUM")
    s.run(lambda: v.assign_add(np.int32(rid() + 1)))
    assert comps(v) == [2, 3] and int(v.read_value()) == 5
    v.assign(5)  # 5 // 2 on each of the two replicas
    assert comps(v) == [2, 2] and int(v.read_value()) == 4
    assert v.dtype == np.int32


@pytest.mark.parametrize("aggregation", AGGREGATIONS)
def test_sync_on_read_cross_replica_write_of_a_per_replica_value_raises(s, aggregation):
    v = make(s, np.float32(1.0), synchronization="ON_READ", aggregation=aggregation)
    with pytest.raises(TypeError):
        v.assign(PerReplica((np.float32(10.0), np.float32(11.0))))
    assert comps(v) == [1.0, 1.0]


# -- one device and the default strategy -----------------------------------------------------------


@pytest.mark.timeout(20)
@pytest.mark.parametrize("aggregation", AGGREGATIONS)
def test_one_device_variables_are_plain_variables_on_the_device(aggregation):
    o = hd.OneDeviceStrategy("/cpu:1")
    v = make(o, 1.0, aggregation=aggregation)
    assert type(v) is hd.Variable
    assert v.device == CPU + "1"
    assert o.extended.variable_created_in_scope(v)
    assert o.run(lambda: v.assign_add(1.0)) is v
    assert v.numpy() == 2.0


def test_default_strategy_variables_are_plain(s):
    with hd.get_strategy().scope():
        v = hd.Variable(1.0)
    assert type(v) is hd.Variable
    assert not s.extended.variable_created_in_scope(v)


# -- extended: update, value_container, variable_created_in_scope, colocate_vars_with ----------


def test_update_runs_fn_on_each_component(s):
    v = make(s, np.float32(1.0))
    assert s.extended.update(v, lambda c, x: c.assign_add(x), args=(1.0,)) is v
    assert comps(v) == [2.0, 2.0]
    seen = s.extended.update(v, lambda c: c.device)
    assert isinstance(seen, Mirrored) and seen.values == (CPU + "0", CPU + "1")
    assert s.extended.update(v, lambda c: c.numpy().tolist(), group=False) == (2.0, 2.0)
    assert s.extended.update(v, lambda c: 7) == 7


def test_update_with_per_replica_and_keyword_arguments(s):
    v = make(s, np.float32(0.0))
    s.extended.update(
        v, lambda c, x, y=0: c.assign_add(x + y), args=(PerReplica((1.0, 2.0)),), kwargs={"y": 10.0}
    )
    assert comps(v) == [11.0, 12.0]  # as TF: a per-replica argument updates each copy with its own


def test_update_of_a_plain_value_calls_fn_once(s):
    assert s.extended.update(np.float32(1.0), lambda x: x + 1) == 2.0


@pytest.mark.timeout(20)
def test_update_inside_run_is_a_merge_call(s):
    v = make(s, np.float32(0.0))
    out = s.run(
        lambda: s.extended.update(v, lambda c, x: c.assign_add(x), args=(np.float32(rid() + 1),))
    )
    assert out is v
    assert comps(v) == [1.0, 2.0]
    reads = s.run(lambda: s.extended.update(v, lambda c: float(c.numpy())))
    assert s.experimental_local_results(reads) == (1.0, 2.0)


def test_update_fn_runs_in_cross_replica_context_inside_scope(s):
    v = make(s, 1.0)
    with s.scope():
        seen = s.extended.update(
            v,
            lambda c: (hd.in_cross_replica_context(), hd.get_replica_context(), hd.get_strategy()),
            group=False,
        )
    assert seen == ((True, None, s), (True, None, s))


def test_update_fn_runs_in_cross_replica_context_outside_scope(s):
    v = make(s, 1.0)
    seen = s.extended.update(
        v,
        lambda c: (hd.in_cross_replica_context(), hd.get_replica_context(), hd.get_strategy()),
        group=False,
    )
    assert seen == ((True, None, s), (True, None, s))


def test_value_container(s):
    v = make(s, 1.0)
    ext = s.extended
    assert ext.value_container(v.values[0]) is v
    assert ext.value_container(v.values[1]) is v
    assert ext.value_container(v) is v
    x = np.ones(1)
    assert ext.value_container(x) is x
    plain = hd.Variable(1.0)
    assert ext.value_container(plain) is plain


def test_variable_created_in_scope(s):
    v = make(s, 1.0)
    assert s.extended.variable_created_in_scope(v)
    assert s.extended.variable_created_in_scope(v.values[1])
    assert not s.extended.variable_created_in_scope(hd.Variable(1.0))
    assert not s.extended.variable_created_in_scope(np.ones(1))
    other = hd.MirroredStrategy(["/cpu:0", "/cpu:1"])
    assert not other.extended.variable_created_in_scope(v)


def test_colocate_vars_with(s):
    v = make(s, 1.0)
    with s.scope():
        with s.extended.colocate_vars_with(v):
            slot = hd.Variable(0.0)
    assert type(slot) is hd.MirroredVariable
    assert [c.device for c in slot.values] == [c.device for c in v.values]
    with pytest.raises(TypeError, match="needs a variable, got ndarray"):
        with s.extended.colocate_vars_with(np.ones(1)):
            pass
