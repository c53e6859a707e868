"""The replica threads runner: lock-step merge calls, errors that propagate, never a hang."""

from __future__ import annotations

import threading

import numpy as np
import pytest

import hpcdist as hd
from hpcdist.distribute.values import PerReplica
from tests.unit.distribute.conftest import rid

#: Seconds a run may take before a test calls it a hang (every run here takes milliseconds).
DEADLINE = 5.0


def ctx() -> hd.ReplicaContext:
    return hd.get_replica_context()


def within(call, seconds: float = DEADLINE):
    """``call()`` on a helper thread; its result, its exception re-raised, or a failed test
    when it has not returned after ``seconds`` (the helper thread is then left behind)."""
    box: dict = {}

    def go():
        try:
            box["result"] = call()
        except BaseException as error:  # noqa: BLE001 - handed back to the test
            box["error"] = error

    t = threading.Thread(target=go, daemon=True, name="test-deadline")
    t.start()
    t.join(seconds)
    if t.is_alive():
        pytest.fail(f"strategy.run did not return within {seconds} s: it hangs")
    if "error" in box:
        raise box["error"]
    return box["result"]


def local(strategy, value):
    return strategy.experimental_local_results(value)


# -- threads and contexts ------------------------------------------------------------------


@pytest.mark.timeout(20)
def test_each_replica_runs_on_its_own_thread(s3):
    main = threading.current_thread()
    names = local(s3, within(lambda: s3.run(lambda: threading.current_thread().name)))
    assert names == ("hpcdist-replica-0", "hpcdist-replica-1", "hpcdist-replica-2")
    assert within(lambda: s3.run(lambda: threading.current_thread() is main)) is False


@pytest.mark.timeout(20)
def test_each_thread_sees_its_own_replica_id_even_while_others_wait(s3):
    def fn():
        first = rid()
        ctx().all_reduce("sum", 1.0)  # every replica is paused here together
        second = rid()
        ctx().merge_call(lambda strategy: None)
        return (first, second, rid(), hd.get_replica_context().num_replicas_in_sync)

    out = local(s3, within(lambda: s3.run(fn)))
    assert out == ((0, 0, 0, 3), (1, 1, 1, 3), (2, 2, 2, 3))


@pytest.mark.timeout(20)
def test_single_replica_strategies_run_on_the_calling_thread():
    main = threading.current_thread()
    for strategy in (hd.MirroredStrategy(["/cpu:0"]), hd.OneDeviceStrategy("/cpu:0")):
        assert strategy.run(lambda: threading.current_thread() is main) is True


@pytest.mark.timeout(20)
def test_merge_functions_run_on_the_calling_thread(s2):
    caller = threading.current_thread()
    where = s2.run(lambda: ctx().merge_call(lambda st: threading.current_thread()))
    assert where is caller


@pytest.mark.timeout(20)
def test_runs_one_after_another(s2):
    for _ in range(30):
        assert local(s2, s2.run(rid)) == (0, 1)


@pytest.mark.timeout(20)
def test_many_merge_steps_in_lock_step(s3):
    def fn():
        total = 0.0
        for step in range(100):
            total += float(ctx().all_reduce("sum", np.float64(rid() + step)))
        return total

    # step k: 0+1+2 + 3k, summed over k < 100
    expected = 100 * 3.0 + 3.0 * sum(range(100))
    assert local(s3, within(lambda: s3.run(fn))) == (expected,) * 3


@pytest.mark.timeout(20)
def test_all_reduce_gives_each_replica_its_own_copy(s2):
    def fn():
        out = ctx().all_reduce("sum", np.arange(3.0) + rid())
        out[0] = 100 + rid()  # a write must not reach the other replica
        return out

    a, b = local(s2, within(lambda: s2.run(fn)))
    assert not np.shares_memory(a, b)
    assert a.tolist() == [100.0, 3.0, 5.0] and b.tolist() == [101.0, 3.0, 5.0]


# -- merge_call ------------------------------------------------------------------------------


@pytest.mark.timeout(20)
def test_merge_call_groups_arguments_into_per_replica_values(s2):
    seen = []

    def merge(strategy, x, *, k):
        seen.append((strategy, x, k))
        return strategy.experimental_local_results(x)

    out = within(
        lambda: s2.run(lambda: ctx().merge_call(merge, args=(rid() * 10,), kwargs={"k": rid()}))
    )
    assert len(seen) == 1  # once for all replicas
    strategy, x, k = seen[0]
    assert strategy is s2
    assert isinstance(x, PerReplica) and x.values == (0, 10)
    assert isinstance(k, PerReplica) and k.values == (0, 1)
    assert out == (0, 10)


@pytest.mark.timeout(20)
def test_merge_call_passes_a_shared_object_as_itself(s2):
    shared = object()
    seen = []
    within(lambda: s2.run(lambda: ctx().merge_call(lambda st, x: seen.append(x), args=(shared,))))
    assert seen == [shared]


@pytest.mark.timeout(20)
def test_merge_call_gives_each_replica_its_component_of_the_result(s2):
    def fn():
        back = ctx().merge_call(lambda st, x: {"x": x, "k": 1}, args=(np.float64(rid()),))
        return back["x"], back["k"]

    assert local(s2, within(lambda: s2.run(fn))) == ((0.0, 1), (1.0, 1))


@pytest.mark.timeout(20)
def test_merge_call_result_shared_by_all_replicas(s2):
    marker = object()
    assert within(lambda: s2.run(lambda: ctx().merge_call(lambda st: marker))) is marker


@pytest.mark.timeout(20)
def test_merge_call_may_reduce(s2):
    def fn():
        return ctx().merge_call(
            lambda st, x: st.reduce("SUM", x, axis=None), args=(np.float64(rid() + 1),)
        )

    assert within(lambda: s2.run(fn)) == 3.0


@pytest.mark.timeout(20)
def test_merge_call_args_must_be_a_tuple_or_list(s2):
    with pytest.raises(TypeError, match="tuple or list"):
        within(lambda: s2.run(lambda: ctx().merge_call(lambda st, x: x, args=5)))
    out = within(lambda: s2.run(lambda: ctx().merge_call(lambda st, x: x, args=[rid()])))
    assert local(s2, out) == (0, 1)


@pytest.mark.timeout(20)
def test_inside_a_merge_function_there_is_no_replica_context(s2):
    out = within(lambda: s2.run(lambda: ctx().merge_call(lambda st: hd.get_replica_context())))
    assert out is None


@pytest.mark.timeout(20)
def test_run_inside_a_merge_function(s2):
    def inner():
        return ctx().all_reduce("sum", np.float64(rid() + 10))

    def outer():
        return ctx().merge_call(lambda st: st.run(inner))

    assert local(s2, within(lambda: s2.run(outer))) == (21.0, 21.0)


@pytest.mark.timeout(20)
def test_run_inside_a_merge_function_sees_new_replica_contexts(s2):
    def outer():
        mine = ctx()
        inner = ctx().merge_call(lambda st: st.run(lambda: (ctx() is not mine, rid())))
        return inner

    per_replica = local(s2, within(lambda: s2.run(outer)))
    assert per_replica == ((True, 0), (True, 1))


@pytest.mark.timeout(20)
def test_merge_call_on_one_device_runs_at_once():
    o = hd.OneDeviceStrategy("/cpu:0")
    assert o.run(lambda: ctx().merge_call(lambda st, x: (st is o, x), args=(5,))) == (True, 5)
    assert o.run(lambda: ctx().merge_call(lambda st: hd.in_cross_replica_context())) is True


def test_merge_call_in_the_default_context():
    out = hd.get_replica_context().merge_call(lambda st, x: (st, x), args=(1,))
    assert isinstance(out[0], hd.DefaultStrategy) and out[1] == 1


# -- errors propagate and nothing hangs ----------------------------------------------------------


class Boom(Exception):
    pass


@pytest.mark.timeout(20)
def test_an_error_in_one_replica_propagates_while_the_other_waits(s2):
    def fn():
        if rid() == 1:
            raise Boom("replica one broke")
        return ctx().all_reduce("sum", 1.0)  # replica 0 waits here

    with pytest.raises(Boom, match="replica one broke"):
        within(lambda: s2.run(fn))
    assert local(s2, within(lambda: s2.run(rid))) == (0, 1)  # the strategy still works


@pytest.mark.timeout(20)
def test_an_error_in_one_replica_propagates_when_the_other_has_returned(s2):
    def fn():
        if rid() == 0:
            raise Boom("zero")
        return 1

    with pytest.raises(Boom, match="zero"):
        within(lambda: s2.run(fn))


@pytest.mark.timeout(20)
def test_an_error_after_some_merge_steps(s3):
    def fn():
        x = ctx().all_reduce("sum", 1.0)
        x = ctx().all_reduce("sum", x)
        if rid() == 2:
            raise OSError("third replica, third step")
        return ctx().all_reduce("sum", x)

    with pytest.raises(OSError, match="third replica"):
        within(lambda: s3.run(fn))


@pytest.mark.timeout(20)
def test_when_every_replica_fails_one_of_their_errors_propagates(s3):
    def fn():
        raise Boom(f"replica {rid()}")

    with pytest.raises(Boom, match=r"replica [012]"):
        within(lambda: s3.run(fn))


@pytest.mark.timeout(20)
def test_an_error_in_a_merge_function_propagates(s2):
    with pytest.raises(ZeroDivisionError):
        within(lambda: s2.run(lambda: ctx().merge_call(lambda st: 1 / 0)))
    assert local(s2, within(lambda: s2.run(rid))) == (0, 1)


@pytest.mark.timeout(20)
@pytest.mark.parametrize("error", [KeyboardInterrupt, SystemExit])
def test_base_exceptions_propagate(s2, error):
    def fn():
        if rid() == 1:
            raise error()
        return ctx().all_reduce("sum", 1.0)

    with pytest.raises(error):
        within(lambda: s2.run(fn))


@pytest.mark.timeout(20)
def test_errors_in_single_replica_strategies_propagate():
    for strategy in (hd.MirroredStrategy(["/cpu:0"]), hd.OneDeviceStrategy("/cpu:0")):
        with pytest.raises(Boom):
            strategy.run(lambda: (_ for _ in ()).throw(Boom()))


@pytest.mark.timeout(20)
def test_a_function_that_is_not_callable(s2):
    with pytest.raises(TypeError, match="not callable"):
        within(lambda: s2.run(5))


# -- replicas that disagree ---------------------------------------------------------------------


@pytest.mark.timeout(20)
def test_one_replica_returns_while_another_all_reduces(s2):
    def fn():
        if rid() == 0:
            return None
        return ctx().all_reduce("sum", 1.0)

    with pytest.raises(RuntimeError, match=r"local replicas \[0\] returned while replicas \[1\]"):
        within(lambda: s2.run(fn))


@pytest.mark.timeout(20)
def test_replicas_making_different_numbers_of_collective_calls(s3):
    def fn():
        for _ in range(rid() + 1):
            ctx().all_reduce("sum", 1.0)

    with pytest.raises(RuntimeError, match="same collective calls in the same order"):
        within(lambda: s3.run(fn))


@pytest.mark.timeout(20)
def test_replicas_calling_different_collectives(s2):
    def fn():
        if rid() == 0:
            return ctx().all_reduce("sum", np.ones(1))
        return ctx().all_gather(np.ones(1), axis=0)

    with pytest.raises(RuntimeError, match="different collective calls"):
        within(lambda: s2.run(fn))


@pytest.mark.timeout(20)
def test_replicas_calling_different_merge_functions(s2):
    def fn():
        if rid() == 0:
            return ctx().merge_call(lambda st: "a")
        return ctx().merge_call(lambda st: "b")

    with pytest.raises(RuntimeError, match="different collective calls"):
        within(lambda: s2.run(fn))


@pytest.mark.timeout(20)
def test_replicas_all_reducing_different_structures(s2):
    with pytest.raises(RuntimeError, match="different collective calls"):
        within(lambda: s2.run(lambda: ctx().all_reduce("sum", [1.0] * (rid() + 1))))


@pytest.mark.timeout(20)
def test_replicas_all_reducing_different_shapes(s2):
    with pytest.raises(RuntimeError, match=r"different collective calls.*\(1,\).*\(2,\)"):
        within(lambda: s2.run(lambda: ctx().all_reduce("sum", np.ones(rid() + 1))))


@pytest.mark.timeout(20)
def test_replicas_all_reducing_with_different_ops(s2):
    def fn():
        return ctx().all_reduce("SUM" if rid() == 0 else "MAX", np.float64(rid() + 1))

    with pytest.raises(RuntimeError):
        within(lambda: s2.run(fn))


@pytest.mark.timeout(20)
def test_replicas_all_gathering_along_different_axes(s2):
    with pytest.raises(RuntimeError):
        within(lambda: s2.run(lambda: ctx().all_gather(np.ones((1, 1)), axis=rid())))


@pytest.mark.timeout(20)
def test_a_collective_in_finally_after_another_replica_failed_does_not_hang(s2):
    strategy = hd.MirroredStrategy(["/cpu:0", "/cpu:1"])  # a hang leaves threads behind

    def fn():
        if rid() == 0:
            raise Boom("zero")
        try:
            return ctx().all_reduce("sum", 1.0)
        finally:
            ctx().all_reduce("sum", 2.0)

    with pytest.raises(Boom):
        within(lambda: strategy.run(fn), seconds=0.5)


@pytest.mark.timeout(20)
def test_a_collective_in_finally_after_another_replica_returned_does_not_hang(s2):
    strategy = hd.MirroredStrategy(["/cpu:0", "/cpu:1"])

    def fn():
        if rid() == 0:
            return 0
        try:
            return ctx().all_reduce("sum", 1.0)
        finally:
            ctx().all_reduce("sum", 2.0)

    with pytest.raises(RuntimeError, match="returned while"):
        within(lambda: strategy.run(fn), seconds=0.5)
