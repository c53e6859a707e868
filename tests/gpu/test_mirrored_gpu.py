"""MirroredStrategy on the GPUs of one process: placement, streams, reductions, NCCL.

Uses every visible GPU (``["/gpu:0"]`` when there is one). Tests of what only
happens with several GPUs (a stream per replica, events at merge calls, NCCL
among local GPUs) are skipped with fewer than two. Results are checked
against NumPy. The race tests keep a stream busy with ``spin`` and then
enqueue the write the other side must wait for: without the events, the
reader would see memory that was not written yet.
"""

from __future__ import annotations

import numpy as np
import pytest

import hpcdist as hd
from hpcdist.distribute.cross_device_ops import NcclAllReduce
from hpcdist.distribute.values import PerReplica
from tests.gpu.conftest import gpu_status


def _gpu_count() -> int:
    if not gpu_status()[0]:
        return 0
    import cupy

    return int(cupy.cuda.runtime.getDeviceCount())


two_gpus = pytest.mark.skipif(_gpu_count() < 2, reason="needs 2 or more GPUs")


def gpu_names(n: int) -> list[str]:
    return [f"/gpu:{i}" for i in range(n)]


@pytest.fixture
def strategy(gpus):
    return hd.MirroredStrategy(gpu_names(gpus))


def rid() -> int:
    return hd.get_replica_context().replica_id_in_sync_group


def test_each_replica_runs_on_its_gpu(strategy, cp, gpus):
    def fn():
        return cp.arange(6, dtype=cp.float32) * (rid() + 1)

    results = strategy.experimental_local_results(strategy.run(fn))
    assert len(results) == gpus
    for i, x in enumerate(results):
        assert isinstance(x, cp.ndarray) and x.device.id == i
        np.testing.assert_array_equal(cp.asnumpy(x), np.arange(6, dtype=np.float32) * (i + 1))


@pytest.mark.parametrize("op", ["SUM", "MEAN", "MAX", "MIN"])
def test_strategy_reduce_matches_numpy(strategy, cp, gpus, op):
    rng = np.random.default_rng(1)
    hosts = [rng.normal(size=(17, 3)).astype(np.float32) for _ in range(gpus)]
    out = strategy.run(lambda: cp.asarray(hosts[rid()]))
    got = cp.asnumpy(cp.asarray(strategy.reduce(op, out, axis=None)))
    stacked = np.stack(hosts)
    expected = {"SUM": stacked.sum(0), "MEAN": stacked.mean(0), "MAX": stacked.max(0),
                "MIN": stacked.min(0)}[op]  # fmt: skip
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)


def test_all_reduce_in_replicas_matches_numpy_and_stays_on_each_gpu(strategy, cp, gpus):
    def fn():
        ctx = hd.get_replica_context()
        x = cp.full((64, 5), float(rid() + 1), dtype=cp.float32)
        s, m, mx = (ctx.all_reduce(op, x) for op in ("SUM", "MEAN", "MAX"))
        here = cp.cuda.Device().id
        assert s.device.id == m.device.id == mx.device.id == here == rid()
        return cp.stack([s, m, mx])

    results = strategy.experimental_local_results(strategy.run(fn))
    expected = np.stack([np.full((64, 5), v, np.float32)
                         for v in (gpus * (gpus + 1) / 2, (gpus + 1) / 2, gpus)])  # fmt: skip
    for i, r in enumerate(results):
        assert r.device.id == i
        np.testing.assert_allclose(cp.asnumpy(r), expected, rtol=1e-6)


@two_gpus
def test_each_replica_has_its_own_stream(cp, gpus):
    strategy = hd.MirroredStrategy(gpu_names(gpus))
    ptrs = strategy.experimental_local_results(
        strategy.run(lambda: int(cp.cuda.get_current_stream().ptr))
    )
    devices = strategy.experimental_local_results(strategy.run(lambda: cp.cuda.Device().id))
    assert list(devices) == list(range(gpus))
    assert len(set(ptrs)) == gpus and 0 not in ptrs
    assert list(ptrs) == [strategy.extended._streams.stream(i).ptr for i in range(gpus)]


def test_one_gpu_replica_runs_on_the_callers_stream(cp):
    strategy = hd.MirroredStrategy(["/gpu:0"])
    assert strategy.extended._streams is None
    with cp.cuda.Device(0):
        stream = cp.cuda.Stream(non_blocking=True)
        with stream:
            ptr = strategy.run(lambda: int(cp.cuda.get_current_stream().ptr))
    assert ptr == stream.ptr


@two_gpus
def test_merge_waits_for_replica_streams(cp, gpus, spin):
    """The replicas' writes are still queued behind a spin when they reach the all_reduce."""
    strategy = hd.MirroredStrategy(gpu_names(gpus))

    def fn():
        x = cp.zeros((1 << 16,), cp.float32)
        spin(cp.cuda.get_current_stream(), 0.05)
        x.fill(rid() + 1)  # enqueued behind the spin on the replica's stream
        return hd.get_replica_context().all_reduce("SUM", x)

    for r in strategy.experimental_local_results(strategy.run(fn)):
        np.testing.assert_array_equal(cp.asnumpy(r), np.full(1 << 16, gpus * (gpus + 1) / 2))


@two_gpus
def test_replicas_wait_for_the_merge_result(cp, gpus, spin):
    """The main thread's merge work is still queued behind a spin when the replicas go on."""
    strategy = hd.MirroredStrategy(gpu_names(gpus))

    def merge(s, per_replica):
        outs = []
        for i, x in enumerate(s.experimental_local_results(per_replica)):
            with cp.cuda.Device(i):
                spin(cp.cuda.get_current_stream(), 0.05)
                outs.append(x + 1)  # on the main thread's stream, behind the spin
        return PerReplica(tuple(outs))

    def fn():
        x = cp.full((1 << 16,), float(rid()), cp.float32)
        y = hd.get_replica_context().merge_call(merge, args=(x,))
        return y * 2  # on the replica's stream: must see x + 1

    for i, r in enumerate(strategy.experimental_local_results(strategy.run(fn))):
        np.testing.assert_array_equal(cp.asnumpy(r), np.full(1 << 16, 2.0 * (i + 1)))


@two_gpus
def test_the_next_run_waits_for_work_the_main_thread_queued(cp, gpus, spin):
    strategy = hd.MirroredStrategy(gpu_names(gpus))
    inputs = []
    for i in range(gpus):
        with cp.cuda.Device(i):
            x = cp.zeros(1 << 16, cp.float32)
            spin(cp.cuda.get_current_stream(), 0.05)
            x.fill(i + 3)  # behind the spin on the main thread's stream
            inputs.append(x)
    out = strategy.run(lambda x: x * 1, args=(PerReplica(tuple(inputs)),))
    for i, r in enumerate(strategy.experimental_local_results(out)):
        np.testing.assert_array_equal(cp.asnumpy(r), np.full(1 << 16, i + 3.0))


@two_gpus
def test_nccl_all_reduce_among_local_gpus(cp, gpus, nccl_ok):
    rng = np.random.default_rng(0)
    hosts = [rng.normal(size=(64, 33)).astype(np.float32) for _ in range(gpus)]
    values = []
    for i, h in enumerate(hosts):
        with cp.cuda.Device(i):
            values.append(cp.asarray(h))
    ops = NcclAllReduce()
    try:
        for op, expected in (("SUM", np.sum(hosts, 0)), ("MEAN", np.mean(hosts, 0)),
                             ("MAX", np.max(hosts, 0))):  # fmt: skip
            out = ops.reduce(op, PerReplica(tuple(values)), gpu_names(gpus))
            assert ops.last_route == "nccl"
            for i, v in enumerate(out.values):
                assert v.device.id == i
                np.testing.assert_allclose(cp.asnumpy(v), expected, rtol=1e-5, atol=1e-6)
    finally:
        ops.close()


@two_gpus
def test_strategy_all_reduce_takes_the_nccl_route(cp, gpus, nccl_ok):
    strategy = hd.MirroredStrategy(gpu_names(gpus))
    ops = strategy.extended._cross_device_ops
    assert isinstance(ops, NcclAllReduce)
    out = strategy.run(
        lambda: hd.get_replica_context().all_reduce("SUM", cp.ones(10, cp.float32) * rid())
    )
    assert ops.last_route == "nccl"
    for r in strategy.experimental_local_results(out):
        np.testing.assert_array_equal(cp.asnumpy(r), np.full(10, gpus * (gpus - 1) / 2))


def test_mirrored_variable_updates_on_gpus(strategy, cp, gpus):
    with strategy.scope():
        v = hd.Variable(np.zeros(3, np.float32), aggregation=hd.VariableAggregation.SUM)
    for i, c in enumerate(v.values):
        assert c.raw_value().device.id == i

    def fn():
        v.assign_add(cp.full(3, float(rid() + 1), cp.float32))

    strategy.run(fn)
    total = gpus * (gpus + 1) / 2
    for i, c in enumerate(v.values):
        value = c.raw_value()
        assert value.device.id == i
        np.testing.assert_array_equal(cp.asnumpy(value), np.full(3, total, np.float32))
