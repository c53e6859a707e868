"""Cross-device ops and the extended reduce_to / batch_reduce_to / broadcast_to.

The numerics of reduce, gather and all_reduce across strategies are covered by the
conformance tests; here: the classes, their arguments, where results go, and errors.
"""

from __future__ import annotations

import numpy as np
import pytest

import hpcdist as hd
from hpcdist.distribute.cross_device_ops import (
    default_cross_device_ops,
    destination_devices,
    place,
)
from hpcdist.distribute.devices import Device, parse_device
from hpcdist.distribute.values import Mirrored, PerReplica
from tests.unit.distribute.conftest import rid

CPU0, CPU1 = parse_device("/cpu:0"), parse_device("/cpu:1")
OPS = [hd.ReductionToOneDevice, hd.HierarchicalCopyAllReduce, hd.NcclAllReduce, hd.CrossDeviceOps]


@pytest.fixture
def pr():
    return PerReplica((np.array([1.0, 5.0]), np.array([3.0, 2.0])))


# -- the classes -------------------------------------------------------------------------------


def test_exported_under_hd():
    for cls in OPS:
        assert issubclass(cls, hd.CrossDeviceOps)


def test_reduction_to_one_device_arguments():
    ops = hd.ReductionToOneDevice()
    assert ops.reduce_to_device is None and ops.accumulation_fn is None
    ops = hd.ReductionToOneDevice("/cpu:1")
    assert ops.reduce_to_device == CPU1
    with pytest.raises(TypeError, match="accumulation_fn must be callable"):
        hd.ReductionToOneDevice(accumulation_fn=5)
    with pytest.raises(ValueError, match="cannot read device 'bogus'"):
        hd.ReductionToOneDevice("bogus")


@pytest.mark.parametrize("cls", [hd.HierarchicalCopyAllReduce, hd.NcclAllReduce])
def test_num_packs(cls):
    assert cls().num_packs == 1
    assert cls(num_packs=0).num_packs == 0
    assert cls(num_packs=3).num_packs == 3
    with pytest.raises(ValueError, match="num_packs must be >= 0, got -1"):
        cls(num_packs=-1)
    for bad in (1.5, True, "2", None):
        with pytest.raises(TypeError, match="num_packs must be an int"):
            cls(num_packs=bad)


@pytest.mark.parametrize("cls", OPS)
@pytest.mark.parametrize(
    ("op", "expected"),
    [("SUM", [4.0, 7.0]), ("mean", [2.0, 3.5]), (hd.ReduceOp.MIN, [1.0, 2.0]), ("MAX", [3.0, 5.0])],
)
def test_reduce_to_one_destination_gives_one_array(cls, pr, op, expected):
    out = cls().reduce(op, pr, destinations="/cpu:0")
    assert isinstance(out, np.ndarray)
    assert out.tolist() == expected
    assert not any(np.shares_memory(out, x) for x in pr.values)


@pytest.mark.parametrize("cls", OPS)
def test_reduce_to_several_destinations_gives_separate_copies(cls, pr):
    out = cls().reduce("SUM", pr, destinations=["/cpu:0", "/cpu:1"])
    assert isinstance(out, Mirrored)
    assert [x.tolist() for x in out.values] == [[4.0, 7.0], [4.0, 7.0]]
    assert not np.shares_memory(out.values[0], out.values[1])
    assert out._devices == (CPU0, CPU1)


@pytest.mark.parametrize("cls", OPS)
def test_reduce_to_the_devices_of_a_mirrored_variable(cls, s, pr):
    with s.scope():
        v = hd.Variable(np.zeros(2))
    out = cls().reduce("MEAN", pr, destinations=v)
    assert isinstance(out, Mirrored) and len(out.values) == 2
    assert out.values[1].tolist() == [2.0, 3.5]


@pytest.mark.parametrize("cls", OPS)
def test_batch_reduce_and_broadcast(cls, pr):
    ops = cls()
    first, second = ops.batch_reduce("SUM", [(pr, "/cpu:0"), (pr, ["/cpu:0", "/cpu:1"])])
    assert first.tolist() == [4.0, 7.0]
    assert isinstance(second, Mirrored)
    assert ops.batch_reduce("SUM", []) == []
    copies = ops.broadcast(np.ones(2), ["/cpu:0", "/cpu:1"])
    assert isinstance(copies, Mirrored) and [x.tolist() for x in copies.values] == [[1, 1]] * 2
    assert ops.broadcast(np.ones(2), "/cpu:1").tolist() == [1.0, 1.0]


def test_all_choices_give_identical_results():
    rng = np.random.default_rng(7)
    pr = PerReplica(tuple(rng.standard_normal(50).astype(np.float32) for _ in range(3)))
    for op in ("SUM", "MEAN", "MIN", "MAX"):
        results = [cls().reduce(op, pr, "/cpu:0") for cls in OPS]
        for r in results[1:]:
            assert r.dtype == results[0].dtype
            assert r.tobytes() == results[0].tobytes()


def test_accumulation_fn_replaces_the_sum_for_sum_and_mean_only(pr):
    calls = []

    def accumulate(values):
        calls.append(len(values))
        return sum(values) * 10

    ops = hd.ReductionToOneDevice(accumulation_fn=accumulate)
    assert ops.reduce("SUM", pr, "/cpu:0").tolist() == [40.0, 70.0]
    assert ops.reduce("MEAN", pr, "/cpu:0").tolist() == [20.0, 35.0]
    assert ops.reduce("MAX", pr, "/cpu:0").tolist() == [3.0, 5.0]
    assert ops.reduce("MIN", pr, "/cpu:0").tolist() == [1.0, 2.0]
    assert calls == [2, 2]


def test_reduce_of_a_plain_value_is_the_value():
    out = hd.ReductionToOneDevice().reduce("SUM", np.array([1.0, 2.0]), "/cpu:0")
    assert out.tolist() == [1.0, 2.0]


def test_default_cross_device_ops():
    assert type(default_cross_device_ops([CPU0, CPU1])) is hd.ReductionToOneDevice
    gpus = [Device("localhost", 0, 0, "GPU", 0), Device("localhost", 0, 0, "GPU", 1)]
    assert type(default_cross_device_ops(gpus)) is hd.NcclAllReduce
    assert type(default_cross_device_ops(gpus[:1])) is hd.ReductionToOneDevice
    assert type(hd.MirroredStrategy(["/cpu:0", "/cpu:1"]).extended._cross_device_ops) is (
        hd.ReductionToOneDevice
    )


def test_a_strategy_uses_the_cross_device_ops_it_is_given(pr):
    calls = []
    ops = hd.ReductionToOneDevice(accumulation_fn=lambda xs: calls.append(1) or sum(xs))
    strategy = hd.MirroredStrategy(["/cpu:0", "/cpu:1"], cross_device_ops=ops)
    assert strategy.extended._cross_device_ops is ops
    assert strategy.reduce("SUM", pr, axis=None).tolist() == [4.0, 7.0]
    assert calls == [1]


@pytest.mark.parametrize("bad", ["bogus", 5, hd.ReductionToOneDevice])
def test_a_strategy_refuses_other_cross_device_ops(bad):
    with pytest.raises(TypeError, match="cross_device_ops must be a CrossDeviceOps"):
        hd.MirroredStrategy(["/cpu:0", "/cpu:1"], cross_device_ops=bad)


# -- destinations ---------------------------------------------------------------------------------


def test_destination_devices():
    assert destination_devices("/cpu:1") == (CPU1,)
    assert destination_devices(CPU1) == (CPU1,)
    assert destination_devices(["/cpu:0", "CPU:1"]) == (CPU0, CPU1)
    assert destination_devices(np.ones(1)) == (CPU0,)
    assert destination_devices(PerReplica((1, 2)), (CPU1, CPU0)) == (CPU1, CPU0)


def test_destination_devices_of_a_variable(s):
    with s.scope():
        v = hd.Variable(1.0)
    assert destination_devices(v) == (CPU0, CPU1)
    assert destination_devices(v.values[1]) == (CPU0,)  # a plain variable: the first local device


@pytest.mark.parametrize("empty", [None, "", [], ()])
def test_empty_destinations(empty):
    with pytest.raises(ValueError, match="destinations can not be empty"):
        destination_devices(empty)


def test_place():
    x = np.ones(2)
    one = place(x, [CPU0])
    assert isinstance(one, np.ndarray) and one.tolist() == [1.0, 1.0]
    several = place(x, [CPU0, CPU1])
    assert isinstance(several, Mirrored) and several._devices == (CPU0, CPU1)
    assert not any(np.shares_memory(c, x) for c in several.values)


# -- extended.reduce_to / batch_reduce_to / broadcast_to -------------------------------------------


@pytest.fixture
def var(s):
    with s.scope():
        return hd.Variable(np.float32(0.0))


@pytest.fixture
def per_replica(s):
    return s.run(lambda: np.float32(rid() + 1))


def test_reduce_to_a_variable_gives_a_mirrored_value_on_its_devices(s, var, per_replica):
    out = s.extended.reduce_to("SUM", per_replica, destinations=var)
    assert isinstance(out, Mirrored)
    assert [float(x) for x in out.values] == [3.0, 3.0]
    assert out._devices == (CPU0, CPU1)
    mean = s.extended.reduce_to(hd.ReduceOp.MEAN, per_replica, var)
    assert [float(x) for x in mean.values] == [1.5, 1.5]


def test_reduce_to_a_device_string_gives_one_array(s, per_replica):
    out = s.extended.reduce_to("sum", per_replica, destinations="/cpu:0")
    assert isinstance(out, np.ndarray) and float(out) == 3.0


def test_reduce_to_a_per_replica_destination(s, per_replica):
    out = s.extended.reduce_to("SUM", per_replica, destinations=per_replica)
    assert isinstance(out, Mirrored) and [float(x) for x in out.values] == [3.0, 3.0]


def test_reduce_to_of_a_plain_value(s, var):
    with pytest.raises(ValueError, match="cannot be SUM-reduced over 2 local replicas"):
        s.extended.reduce_to("SUM", np.float32(1.0), var)
    out = s.extended.reduce_to("MEAN", np.float32(1.0), var)
    assert [float(x) for x in out.values] == [1.0, 1.0]


@pytest.mark.parametrize("empty", [None, "", []])
def test_reduce_to_empty_destinations(s, per_replica, empty):
    with pytest.raises(ValueError, match="destinations can not be empty"):
        s.extended.reduce_to("SUM", per_replica, destinations=empty)


def test_reduce_to_bad_op(s, per_replica, var):
    with pytest.raises(TypeError, match="reduce_op is 5"):
        s.extended.reduce_to(5, per_replica, var)
    with pytest.raises(ValueError, match="reduce_op is 'bogus'"):
        s.extended.reduce_to("bogus", per_replica, var)


def test_batch_reduce_to(s, var, per_replica):
    other = s.run(lambda: np.float32(rid() * 10))
    out = s.extended.batch_reduce_to("SUM", [(per_replica, var), (other, "/cpu:1")])
    assert isinstance(out, list) and len(out) == 2
    assert [float(x) for x in out[0].values] == [3.0, 3.0]
    assert float(out[1]) == 10.0
    assert s.extended.batch_reduce_to("MEAN", []) == []
    mean = s.extended.batch_reduce_to("MEAN", ((per_replica, var),))
    assert [float(x) for x in mean[0].values] == [1.5, 1.5]


@pytest.mark.parametrize("pairs", [[PerReplica((1.0, 2.0))], [(PerReplica((1.0, 2.0)),)], [1, 2]])
def test_batch_reduce_to_needs_pairs(s, pairs):
    with pytest.raises(ValueError, match=r"list of \(value, destinations\) pairs"):
        s.extended.batch_reduce_to("SUM", pairs)


def test_broadcast_to(s, var):
    out = s.extended.broadcast_to(np.float32(5.0), destinations=var)
    assert isinstance(out, Mirrored) and [float(x) for x in out.values] == [5.0, 5.0]
    assert out._devices == (CPU0, CPU1)
    assert float(s.extended.broadcast_to(5.0, destinations="/cpu:1")) == 5.0
    source = np.ones(3)
    copies = s.extended.broadcast_to(source, var)
    assert not any(np.shares_memory(c, source) for c in copies.values)
    assert not np.shares_memory(copies.values[0], copies.values[1])


@pytest.mark.timeout(20)
def test_reduce_to_inside_merge_call(s, var):
    def fn():
        return hd.get_replica_context().merge_call(
            lambda st, x: st.extended.reduce_to("SUM", x, var), args=(np.float32(rid() + 1),)
        )

    out = s.experimental_local_results(s.run(fn))
    assert [float(x) for x in out] == [3.0, 3.0]


def test_one_device_reduce_to_and_broadcast_to():
    o = hd.OneDeviceStrategy("/cpu:0")
    assert float(o.extended.reduce_to("SUM", np.float32(3.0), "/cpu:0")) == 3.0
    assert float(o.extended.broadcast_to(2.0, "/cpu:0")) == 2.0
    with o.scope():
        v = hd.Variable(0.0)
    assert float(o.extended.reduce_to("MEAN", o.run(lambda: np.float32(4.0)), v)) == 4.0
