"""Which strategy is current and in which context code runs (hpcdist.distribute.context)."""

from __future__ import annotations

import threading

import numpy as np
import pytest

import hpcdist as hd
from hpcdist.distribute import context
from hpcdist.distribute.values import PerReplica


@pytest.fixture(scope="module")
def other():
    return hd.MirroredStrategy(["/cpu:0", "/cpu:1"])


def describe() -> tuple:
    """Everything the context functions say here."""
    rc = hd.get_replica_context()
    return (
        hd.in_cross_replica_context(),
        None if rc is None else (rc.replica_id_in_sync_group, rc.num_replicas_in_sync),
        hd.has_strategy(),
        hd.get_strategy(),
        hd.get_cross_replica_context(),
    )


# -- outside any scope -------------------------------------------------------------------------


def test_outside_any_scope_the_default_strategy_is_current():
    cross, rc, has, strategy, cross_ctx = describe()
    assert (cross, rc, has, cross_ctx) == (False, (0, 1), False, None)
    assert isinstance(strategy, hd.DefaultStrategy)
    assert strategy.num_replicas_in_sync == 1


def test_the_default_strategy_is_one_object():
    assert hd.get_strategy() is hd.get_strategy()
    assert context.default_strategy() is hd.get_strategy()


def test_the_default_replica_context():
    rc = hd.get_replica_context()
    assert rc is hd.get_replica_context()
    assert rc.strategy is hd.get_strategy()
    assert rc.devices == ("/job:localhost/replica:0/task:0/device:CPU:0",)
    assert repr(rc) == "ReplicaContext(replica_id_in_sync_group=0, num_replicas_in_sync=1)"
    assert isinstance(rc, hd.ReplicaContext)


# -- scope ---------------------------------------------------------------------------------------


def test_in_scope_the_strategy_is_current_in_cross_replica_context(s):
    with s.scope() as entered:
        assert entered is s
        assert describe() == (True, None, True, s, s)
    assert describe()[2] is False


def test_the_same_scope_nests(s):
    with s.scope():
        with s.scope():
            assert hd.get_strategy() is s
        assert hd.get_strategy() is s
    assert not hd.has_strategy()


def test_the_default_strategy_scope_nests_inside_a_scope(s):
    with s.scope():
        with hd.get_strategy().scope():
            assert hd.get_strategy() is s


def test_a_scope_of_another_strategy_inside_a_scope_is_an_error(s, other):
    with s.scope():
        with pytest.raises(RuntimeError, match="Mixing different strategies"):
            with other.scope():
                pass
        assert hd.get_strategy() is s  # the failed entry left nothing behind


def test_scopes_left_out_of_order_raise(s):
    outer, inner = s.scope(), s.scope()
    outer.__enter__()
    inner.__enter__()
    try:
        with pytest.raises(RuntimeError, match="out of order"):
            context.pop_mode(context.Mode(s, s, None))
    finally:
        inner.__exit__(None, None, None)
        outer.__exit__(None, None, None)


def test_a_scope_is_local_to_its_thread(s):
    seen = []
    with s.scope():
        t = threading.Thread(target=lambda: seen.append(describe()[:3]))
        t.start()
        t.join()
    assert seen == [(False, (0, 1), False)]


# -- inside run and merge_call ---------------------------------------------------------------------


@pytest.mark.timeout(20)
def test_inside_run_each_replica_sees_its_own_replica_context(s):
    per_replica = s.experimental_local_results(s.run(describe))
    assert per_replica == ((False, (0, 2), True, s, None), (False, (1, 2), True, s, None))


@pytest.mark.timeout(20)
def test_replica_context_properties_inside_run(s):
    def fn():
        rc = hd.get_replica_context()
        return rc.strategy is s, rc.devices, repr(rc)

    (same0, dev0, text0), (same1, dev1, text1) = s.experimental_local_results(s.run(fn))
    assert same0 is True and same1 is True
    assert dev0 == ("/job:localhost/replica:0/task:0/device:CPU:0",)
    assert dev1 == ("/job:localhost/replica:0/task:0/device:CPU:1",)
    assert text1 == "ReplicaContext(replica_id_in_sync_group=1, num_replicas_in_sync=2)"


@pytest.mark.timeout(20)
def test_inside_merge_call_the_context_is_cross_replica(s):
    out = s.run(lambda: hd.get_replica_context().merge_call(lambda strategy: describe()))
    assert out == (True, None, True, s, s)


@pytest.mark.timeout(20)
def test_after_run_the_calling_thread_is_back_where_it_was(s):
    before = describe()
    s.run(lambda: hd.get_replica_context().all_reduce("sum", 1.0))
    assert describe() == before
    with s.scope():
        s.run(lambda: None)
        assert describe() == (True, None, True, s, s)


@pytest.mark.timeout(20)
def test_one_device_run_context():
    o = hd.OneDeviceStrategy("/cpu:0")
    cross, rc, has, strategy, cross_ctx = o.run(describe)
    assert (cross, rc, has, strategy, cross_ctx) == (False, (0, 1), True, o, None)
    with o.scope():
        assert describe() == (True, None, True, o, o)


# -- experimental_set_strategy ---------------------------------------------------------------------


def test_set_strategy_makes_it_current_everywhere(s):
    hd.experimental_set_strategy(s)
    assert describe() == (True, None, True, s, s)
    seen = []
    t = threading.Thread(target=lambda: seen.append(hd.get_strategy()))
    t.start()
    t.join()
    assert seen == [s]
    hd.experimental_set_strategy(None)
    assert not hd.has_strategy()
    assert isinstance(hd.get_strategy(), hd.DefaultStrategy)


def test_set_strategy_again_and_to_none_twice(s, other):
    hd.experimental_set_strategy(s)
    hd.experimental_set_strategy(s)
    assert hd.get_strategy() is s
    hd.experimental_set_strategy(other)
    assert hd.get_strategy() is other
    hd.experimental_set_strategy(None)
    hd.experimental_set_strategy(None)
    assert not hd.has_strategy()


def test_set_strategy_inside_a_scope_is_an_error(s, other):
    for target in (other, s, None):
        with s.scope():
            with pytest.raises(RuntimeError, match="must not be called inside"):
                hd.experimental_set_strategy(target)
        assert not hd.has_strategy()


@pytest.mark.timeout(20)
def test_set_strategy_inside_run_is_an_error(s):
    def fn():
        try:
            hd.experimental_set_strategy(None)
        except RuntimeError:
            return "refused"
        return "allowed"

    assert s.experimental_local_results([s.run(fn)]) == (["refused"], ["refused"])


def test_with_a_strategy_set_its_scope_works_and_another_scope_does_not(s, other):
    hd.experimental_set_strategy(s)
    with s.scope():
        assert hd.get_strategy() is s
    with pytest.raises(RuntimeError, match="Mixing"):
        with other.scope():
            pass


@pytest.mark.timeout(20)
def test_with_a_strategy_set_it_runs(s):
    hd.experimental_set_strategy(s)
    assert s.run(lambda: hd.get_replica_context().replica_id_in_sync_group).values == (0, 1)


# -- mixing strategies and calling cross-replica methods in replica context ------------------------


def test_running_another_strategy_inside_a_scope_is_an_error(s, other):
    with s.scope():
        with pytest.raises(RuntimeError, match="Mixing different strategies"):
            other.run(lambda: 1)
        with pytest.raises(RuntimeError, match="Mixing"):
            other.reduce("SUM", PerReplica((1.0, 2.0)), axis=None)
        with pytest.raises(RuntimeError, match="Mixing"):
            other.gather(PerReplica((np.ones(1), np.ones(1))), axis=0)


@pytest.mark.timeout(20)
def test_another_strategy_may_reduce_values_of_the_same_shape_outside_scopes(s, other):
    per_replica = s.run(lambda: np.float64(hd.get_replica_context().replica_id_in_sync_group))
    assert other.reduce("SUM", per_replica, axis=None) == 1.0
    assert other.experimental_local_results(per_replica) == (0.0, 1.0)


def _error_inside_run(strategy, call):
    """The exception ``call()`` raises in each replica, as (type name, message)."""

    def fn():
        try:
            call()
        except Exception as e:  # noqa: BLE001 - reported back to the test
            return type(e).__name__, str(e)
        return None

    return strategy.experimental_local_results(strategy.run(fn))


@pytest.mark.timeout(20)
@pytest.mark.parametrize(
    "name",
    ["run", "reduce", "gather", "reduce_to", "batch_reduce_to", "broadcast_to"],
)
def test_cross_replica_methods_inside_run_raise_and_point_at_merge_call(s, name):
    pr = PerReplica((np.ones(1), np.ones(1)))
    calls = {
        "run": lambda: s.run(lambda: 1),
        "reduce": lambda: s.reduce("SUM", pr, axis=None),
        "gather": lambda: s.gather(pr, axis=0),
        "reduce_to": lambda: s.extended.reduce_to("SUM", pr, "/cpu:0"),
        "batch_reduce_to": lambda: s.extended.batch_reduce_to("SUM", [(pr, "/cpu:0")]),
        "broadcast_to": lambda: s.extended.broadcast_to(1.0, "/cpu:0"),
    }
    for kind, message in _error_inside_run(s, calls[name]):
        assert kind == "RuntimeError"
        assert "cross-replica context" in message and "merge_call" in message


@pytest.mark.timeout(20)
def test_scope_inside_run_is_an_error(s):
    def enter():
        with s.scope():
            pass

    for kind, message in _error_inside_run(s, enter):
        assert kind == "RuntimeError" and "inside strategy.run" in message


@pytest.mark.timeout(20)
def test_cross_replica_methods_inside_one_device_run_raise():
    o = hd.OneDeviceStrategy("/cpu:0")
    ((kind, message),) = _error_inside_run(o, lambda: o.reduce("SUM", 1.0, axis=None))
    assert kind == "RuntimeError" and "merge_call" in message


@pytest.mark.timeout(20)
def test_a_replica_context_used_outside_its_replica_raises(s):
    contexts = s.experimental_local_results(s.run(hd.get_replica_context))
    for ctx in contexts:
        with pytest.raises(RuntimeError, match="own context"):
            ctx.merge_call(lambda strategy: None)
        with pytest.raises(RuntimeError, match="own context"):
            ctx.all_reduce("sum", 1.0)
        with pytest.raises(RuntimeError, match="own context"):
            ctx.all_gather(np.ones(1), axis=0)


@pytest.mark.timeout(20)
def test_a_replica_context_of_another_replica_raises(s):
    contexts = {}
    barrier = threading.Barrier(2, timeout=5)

    def fn():
        rc = hd.get_replica_context()
        contexts[rc.replica_id_in_sync_group] = rc
        barrier.wait()
        theirs = contexts[1 - rc.replica_id_in_sync_group]
        try:
            theirs.merge_call(lambda strategy: None)
        except RuntimeError as e:
            return str(e)
        return "allowed"

    messages = s.experimental_local_results(s.run(fn))
    assert all("own context" in m for m in messages)


@pytest.mark.timeout(20)
def test_merge_call_from_a_thread_started_by_a_replica_raises(s):
    def fn():
        rc = hd.get_replica_context()
        errors = []

        def helper():
            try:
                rc.merge_call(lambda strategy: None)
            except RuntimeError as e:
                errors.append(str(e))

        t = threading.Thread(target=helper)
        t.start()
        t.join()
        return errors

    for errors in s.experimental_local_results(s.run(fn)):
        assert len(errors) == 1 and "own context" in errors[0]
