"""Distributed values (hpcdist.distribute.values) and how strategies hand them out and back."""

from __future__ import annotations

import collections

import numpy as np
import pytest

import hpcdist as hd
from hpcdist.distribute.values import (
    DistributedValues,
    Mirrored,
    PerReplica,
    is_distributed,
    local_results,
    regroup,
    select_mirrored,
    select_replica,
)
from tests.unit.distribute.conftest import rid

Pair = collections.namedtuple("Pair", "x y")


# -- the value classes -------------------------------------------------------------------


@pytest.mark.parametrize("cls", [PerReplica, Mirrored])
def test_values_are_a_tuple_of_the_components(cls):
    a, b = np.ones(2), np.zeros(2)
    value = cls([a, b])
    assert isinstance(value.values, tuple)
    assert value.values[0] is a and value.values[1] is b
    assert value.primary is a
    assert isinstance(value, DistributedValues)


@pytest.mark.parametrize("cls", [PerReplica, Mirrored])
def test_a_value_needs_at_least_one_component(cls):
    with pytest.raises(ValueError, match="at least one"):
        cls(())


def test_exported_under_hd():
    assert hd.PerReplica is PerReplica
    assert hd.Mirrored is Mirrored
    assert hd.DistributedValues is DistributedValues


@pytest.mark.parametrize("cls", [PerReplica, Mirrored])
def test_len_is_a_type_error_that_points_at_local_results(cls):
    with pytest.raises(TypeError, match="experimental_local_results") as info:
        len(cls((1, 2)))
    assert cls.__name__ in str(info.value)


@pytest.mark.parametrize("cls", [PerReplica, Mirrored])
def test_iter_is_a_type_error(cls):
    with pytest.raises(TypeError, match="not iterable"):
        iter(cls((1, 2)))
    with pytest.raises(TypeError):
        list(cls((1, 2)))
    with pytest.raises(TypeError):
        a, b = cls((1, 2))


@pytest.mark.parametrize("cls", [PerReplica, Mirrored])
def test_truth_value_is_a_type_error(cls):
    with pytest.raises(TypeError, match="ambiguous"):
        bool(cls((1, 2)))
    with pytest.raises(TypeError):
        if cls((0, 0)):
            pass


def test_repr_lists_each_component_with_its_index():
    text = repr(PerReplica((np.float64(1.5), "b")))
    assert text == "PerReplica:{\n  0: np.float64(1.5),\n  1: 'b'\n}"
    assert repr(Mirrored((7,))) == "Mirrored:{\n  0: 7\n}"


def test_is_distributed():
    s = hd.MirroredStrategy(["/cpu:0", "/cpu:1"])
    with s.scope():
        v = hd.Variable(1.0)
    assert is_distributed(PerReplica((1, 2)))
    assert is_distributed(Mirrored((1, 2)))
    assert is_distributed(v)
    assert not is_distributed(v.values[0])
    assert not is_distributed(np.ones(2))
    assert not is_distributed([PerReplica((1, 2))])


# -- select_replica / select_mirrored / local_results --------------------------------------


def test_select_replica_picks_the_component_everywhere_in_a_structure():
    pr = PerReplica(("a0", "a1"))
    m = Mirrored(("m0", "m1"))
    structure = {"a": pr, "b": [m, 5], "c": Pair(pr, None)}
    assert select_replica(1, structure) == {"a": "a1", "b": ["m1", 5], "c": Pair("a1", None)}
    assert select_replica(0, pr) == "a0"


def test_select_replica_leaves_plain_values_and_variables_alone():
    s = hd.MirroredStrategy(["/cpu:0", "/cpu:1"])
    with s.scope():
        v = hd.Variable(1.0)
    x = np.ones(3)
    out = select_replica(1, (x, v))
    assert out[0] is x
    assert out[1] is v


def test_select_mirrored_refuses_per_replica_values():
    assert select_mirrored(1, Mirrored((1, 2))) == 2
    assert select_mirrored(0, [3.0]) == [3.0]
    with pytest.raises(TypeError, match="PerReplica") as info:
        select_mirrored(0, {"x": PerReplica((1, 2))})
    assert "reduce it first" in str(info.value)


def test_local_results_of_values_variables_and_plain_values():
    s = hd.MirroredStrategy(["/cpu:0", "/cpu:1"])
    with s.scope():
        v = hd.Variable(1.0)
    assert local_results(PerReplica((1, 2))) == (1, 2)
    assert local_results(v) == v.values
    assert local_results(5) == (5,)
    assert local_results(None) == (None,)


# -- regroup ---------------------------------------------------------------------------------


def test_regroup_wraps_leaves_that_differ():
    a, b = np.ones(1), np.zeros(1)
    out = regroup([{"x": a, "k": 1}, {"x": b, "k": 2}])
    assert isinstance(out["x"], PerReplica)
    assert out["x"].values[0] is a and out["x"].values[1] is b
    assert out["k"].values == (1, 2)


def test_regroup_keeps_a_leaf_that_is_the_same_object_everywhere():
    shared = object()
    out = regroup([(shared, 1.5), (shared, 2.5)])
    assert out[0] is shared
    assert isinstance(out[1], PerReplica)


def test_regroup_always_wrap_wraps_identical_objects_too():
    shared = object()
    out = regroup([[shared], [shared]], always_wrap=True)
    assert isinstance(out[0], PerReplica)
    assert out[0].values == (shared, shared)


def test_regroup_of_one_replica_returns_its_structure():
    x = {"a": np.ones(1)}
    assert regroup([x]) is x


def test_regroup_keeps_container_types_and_can_make_mirrored_values():
    out = regroup([Pair(1, "s"), Pair(2, "s")])
    assert type(out) is Pair
    assert out.x.values == (1, 2) and out.y == "s"
    m = regroup([(1,), (2,)], wrap=Mirrored)
    assert type(m) is tuple and isinstance(m[0], Mirrored)


def test_regroup_of_different_structures_raises():
    with pytest.raises(ValueError, match="lengths differ"):
        regroup([[1], [1, 2]])
    with pytest.raises(TypeError, match="types differ"):
        regroup([[1], (1,)])


# -- what run returns --------------------------------------------------------------------------


@pytest.mark.timeout(20)
def test_run_returns_per_replica_for_values_that_differ(s2):
    out = s2.run(rid)
    assert isinstance(out, PerReplica)
    assert out.values == (0, 1)


@pytest.mark.timeout(20)
def test_run_returns_a_shared_object_as_it_is(s2):
    marker = object()
    assert s2.run(lambda: marker) is marker
    assert s2.run(lambda: None) is None
    assert s2.run(lambda: 1.0) == 1.0  # the same constant object in both replicas


@pytest.mark.timeout(20)
def test_run_regroups_nested_results_leaf_by_leaf(s2):
    marker = object()
    out = s2.run(lambda: {"id": rid(), "same": marker, "pair": (rid() * 10, marker)})
    assert out["id"].values == (0, 1)
    assert out["same"] is marker
    assert out["pair"][0].values == (0, 10)
    assert out["pair"][1] is marker


@pytest.mark.timeout(20)
def test_run_gives_each_replica_its_component_of_args_and_kwargs(s2):
    out = s2.run(
        lambda x, y=0: x + y, args=(PerReplica((1, 2)),), kwargs={"y": PerReplica((10, 20))}
    )
    assert out.values == (11, 22)


@pytest.mark.timeout(20)
def test_run_passes_mirrored_args_componentwise(s2):
    a, b = np.ones(1), np.ones(1)
    out = s2.run(lambda x: x, args=(Mirrored((a, b)),))
    assert out.values[0] is a and out.values[1] is b


@pytest.mark.timeout(20)
def test_run_refuses_a_distributed_arg_with_too_many_components(s2):
    with pytest.raises(ValueError, match="components"):
        s2.run(lambda x: x, args=(PerReplica((1, 2, 3)),))


@pytest.mark.timeout(20)
def test_run_refuses_a_distributed_arg_with_too_few_components(s3):
    with pytest.raises(ValueError, match="components"):
        s3.run(lambda x: x, args=(PerReplica((1, 2)),))


def test_reduce_refuses_a_value_of_another_replica_count(s2):
    with pytest.raises(ValueError, match="3 components but this strategy has 2"):
        s2.reduce("SUM", PerReplica((1.0, 2.0, 3.0)), axis=None)


# -- experimental_local_results --------------------------------------------------------------------


@pytest.mark.timeout(20)
def test_local_results_of_a_per_replica(s2):
    assert s2.experimental_local_results(s2.run(rid)) == (0, 1)


def test_local_results_of_plain_values(s2):
    x = np.ones(1)
    assert s2.experimental_local_results(x)[0] is x
    assert len(s2.experimental_local_results(x)) == 1
    assert s2.experimental_local_results(None) == (None,)
    assert s2.experimental_local_results(1.0) == (1.0,)


def test_local_results_of_a_nested_structure_is_one_structure_per_replica(s2):
    out = s2.experimental_local_results({"a": 1.0, "b": PerReplica((0, 1))})
    assert out == ({"a": 1.0, "b": 0}, {"a": 1.0, "b": 1})
    assert s2.experimental_local_results([1.0, 2.0]) == ([1.0, 2.0], [1.0, 2.0])


def test_local_results_of_a_mirrored_variable_are_its_components(s2):
    with s2.scope():
        v = hd.Variable(2.0)
    comps = s2.experimental_local_results(v)
    assert comps == v.values
    assert [type(c).__name__ for c in comps] == ["Variable", "Variable"]


@pytest.mark.timeout(20)
def test_local_results_inside_run(s2):
    out = s2.run(lambda: s2.experimental_local_results(np.float64(rid())))
    assert isinstance(out, tuple) and len(out) == 1  # one local result per replica
    assert out[0].values == (0.0, 1.0)


def test_local_results_on_three_devices(s3):
    assert s3.experimental_local_results(s3.run(rid)) == (0, 1, 2)


def test_local_results_one_device():
    s = hd.OneDeviceStrategy("/cpu:0")
    x = np.ones(1)
    out = s.experimental_local_results(s.run(lambda: x))
    assert len(out) == 1 and out[0] is x


# -- experimental_distribute_values_from_function -------------------------------------------------


def test_values_from_function_gets_each_replica_id(s3):
    out = s3.experimental_distribute_values_from_function(lambda ctx: ctx.replica_id_in_sync_group)
    assert isinstance(out, PerReplica)
    assert out.values == (0, 1, 2)


def test_values_from_function_context(s2):
    seen = []
    s2.experimental_distribute_values_from_function(lambda ctx: seen.append(ctx))
    assert [(c.replica_id_in_sync_group, c.num_replicas_in_sync) for c in seen] == [(0, 2), (1, 2)]
    assert isinstance(seen[0], hd.ValueContext)
    assert repr(seen[1]) == "ValueContext(replica_id_in_sync_group=1, num_replicas_in_sync=2)"


def test_values_from_function_wraps_even_identical_values(s2):
    out = s2.experimental_distribute_values_from_function(lambda ctx: 7)
    assert isinstance(out, PerReplica) and out.values == (7, 7)
    none = s2.experimental_distribute_values_from_function(lambda ctx: None)
    assert isinstance(none, PerReplica) and none.values == (None, None)


def test_values_from_function_nested(s2):
    out = s2.experimental_distribute_values_from_function(
        lambda ctx: {"a": np.array([ctx.replica_id_in_sync_group])}
    )
    assert isinstance(out, dict)
    assert [v.tolist() for v in out["a"].values] == [[0], [1]]


@pytest.mark.timeout(20)
def test_values_from_function_feeds_run(s2):
    values = s2.experimental_distribute_values_from_function(
        lambda ctx: np.float64(ctx.replica_id_in_sync_group * 10)
    )
    out = s2.run(lambda x: x + rid(), args=(values,))
    assert out.values == (0.0, 11.0)


@pytest.mark.timeout(20)
def test_values_from_function_inside_run_is_allowed(s2):
    out = s2.run(lambda: s2.experimental_distribute_values_from_function(lambda ctx: 1.0))
    assert all(isinstance(v, PerReplica) for v in out.values)


def test_values_from_function_one_device_gives_the_value_itself():
    s = hd.OneDeviceStrategy("/cpu:0")
    assert s.experimental_distribute_values_from_function(lambda c: c.replica_id_in_sync_group) == 0
    m1 = hd.MirroredStrategy(["/cpu:0"])
    assert m1.experimental_distribute_values_from_function(lambda c: "x") == "x"
