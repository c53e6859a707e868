"""Optimizers under MirroredStrategy(["/cpu:0", "/cpu:1"]): one merge call, summed gradients."""

from __future__ import annotations

import numpy as np
import pytest

import hpcdist as hd
from hpcdist.distribute.values import PerReplica
from hpcdist.distribute.variables import MirroredVariable
from hpcdist.optimizers import SGD, Adam, RMSprop
from tests.unit.optimizers.test_optimizers import CASES, Reference, make, reference

SHAPES = [(3, 2), (4,)]


@pytest.fixture(scope="module")
def strategy():
    return hd.MirroredStrategy(["/cpu:0", "/cpu:1"])


def _count_reduces(strategy, monkeypatch):
    calls = []
    original = strategy.extended.reduce_leaves

    def counting(op, leaves, options=None):
        calls.append(len(leaves))
        return original(op, leaves, options)

    monkeypatch.setattr(strategy.extended, "reduce_leaves", counting)
    return calls


def _replica_grads(step, r, dtypes):
    rng = np.random.default_rng(100 * step + r)
    return [(rng.standard_normal(s) / (step + 1)).astype(d)
            for s, d in zip(SHAPES, dtypes, strict=True)]  # fmt: skip


@pytest.mark.parametrize(("kind", "config"), [CASES[2], CASES[4], CASES[6], CASES[8]])
@pytest.mark.parametrize("dtypes", [(np.float64, np.float64), (np.float32, np.float64)])
def test_replicas_apply_the_sum_of_their_gradients(strategy, monkeypatch, kind, config, dtypes):
    rng = np.random.default_rng(0)
    init = [rng.standard_normal(s).astype(d) for s, d in zip(SHAPES, dtypes, strict=True)]
    with strategy.scope():
        variables = [hd.Variable(x, name=f"v{i}") for i, x in enumerate(init)]
        opt = make(kind, **config)
    ref = reference(kind, **config)
    expected = [x.astype(np.float64) for x in init]
    reduces = _count_reduces(strategy, monkeypatch)

    def replica_fn(step):
        r = hd.get_replica_context().replica_id_in_sync_group
        grads = _replica_grads(step, r, dtypes)
        return opt.apply_gradients(zip(grads, variables, strict=True))

    for step in range(4):
        result = strategy.run(replica_fn, args=(step,))
        assert result is opt.iterations and int(result) == step + 1
        summed = [a.astype(np.float64) + b.astype(np.float64) for a, b in
                  zip(_replica_grads(step, 0, dtypes), _replica_grads(step, 1, dtypes),
                      strict=True)]  # fmt: skip
        ref.step(expected, summed)
    assert reduces == [len(set(dtypes))] * 4  # one batched reduction per step, one leaf per dtype
    for v, e, d in zip(variables, expected, dtypes, strict=True):
        assert isinstance(v, MirroredVariable) and v.dtype == d
        first, second = (c.numpy() for c in v.values)
        np.testing.assert_array_equal(first, second)  # the replicas stay identical
        tol = 2e-5 if d == np.float32 else 1e-11
        np.testing.assert_allclose(first, e, rtol=tol, atol=tol)
    for name in opt.get_slot_names():
        slot = opt.get_slot(variables[0], name)
        assert isinstance(slot, MirroredVariable)
        np.testing.assert_array_equal(slot.values[0].numpy(), slot.values[1].numpy())
    assert isinstance(opt.iterations, MirroredVariable)


def test_each_replica_component_has_its_own_flat_buffer(strategy):
    with strategy.scope():
        w, b = hd.Variable(np.ones(3), name="w"), hd.Variable(np.ones(2), name="b")
        opt = SGD(0.1)
    strategy.run(lambda: opt.apply_gradients([(np.ones(3), w), (np.ones(2), b)]))
    w0, w1 = (c.raw_value() for c in w.values)
    b0, b1 = (c.raw_value() for c in b.values)
    assert w0.base is b0.base and w1.base is b1.base and w0.base is not w1.base
    view = w.values[1].raw_value()
    strategy.run(lambda: opt.apply_gradients([(np.ones(3), w), (np.ones(2), b)]))
    assert w.values[1].raw_value() is view  # in place
    np.testing.assert_allclose(w.values[1].numpy(), 1 - 2 * 0.2)


def test_global_clipnorm_uses_the_norm_of_the_summed_gradients(strategy):
    with strategy.scope():
        w = hd.Variable(np.zeros(2))
        opt = SGD(1.0, global_clipnorm=1.0)

    def fn():
        r = hd.get_replica_context().replica_id_in_sync_group
        g = np.array([3.0, 0.0]) if r == 0 else np.array([0.0, 4.0])  # each norm < 5
        return opt.apply_gradients([(g, w)])

    strategy.run(fn)
    np.testing.assert_allclose(w.values[0].numpy(), [-0.6, -0.8])  # sum [3, 4], norm 5
    np.testing.assert_allclose(w.values[1].numpy(), [-0.6, -0.8])


def test_cross_replica_apply_updates_every_component(strategy, monkeypatch):
    with strategy.scope():
        w = hd.Variable(np.ones(3))
        opt = Adam(0.1)
        reduces = _count_reduces(strategy, monkeypatch)
        opt.apply_gradients([(np.array([1.0, -1.0, 0.0]), w)])
    assert reduces == []  # applied as given
    ref, expected = Reference("adam", 0.1), [np.ones(3)]
    ref.step(expected, [np.array([1.0, -1.0, 0.0])])
    for c in w.values:
        np.testing.assert_allclose(c.numpy(), expected[0], rtol=1e-12)
    assert int(opt.iterations) == 1
    # outside the scope as well, and a PerReplica gradient gives each component its own
    opt2 = SGD(1.0)
    opt2.apply_gradients([(PerReplica((np.ones(3), 2 * np.ones(3))), w)])
    np.testing.assert_allclose(w.values[0].numpy() - w.values[1].numpy(), 1.0)


def test_skip_gradients_aggregation(strategy, monkeypatch):
    with strategy.scope():
        w = hd.Variable(np.zeros(2))
        opt = SGD(1.0)
    reduces = _count_reduces(strategy, monkeypatch)

    def fn(**kwargs):
        ctx = hd.get_replica_context()
        g = np.full(2, ctx.replica_id_in_sync_group + 1.0)
        g = ctx.all_reduce("SUM", g)  # the caller reduced already
        return opt.apply_gradients([(g, w)], **kwargs)

    strategy.run(fn, kwargs={"skip_gradients_aggregation": True})
    strategy.run(fn, kwargs={"experimental_aggregate_gradients": False})
    assert reduces == [1, 1]  # only the caller's all_reduce
    for c in w.values:
        np.testing.assert_array_equal(c.numpy(), [-6.0, -6.0])


def test_snapshots_under_the_strategy(strategy):
    with strategy.scope():
        w = hd.Variable(np.zeros(2))
        opt = RMSprop(0.1, momentum=0.5)
    step = lambda: opt.apply_gradients([(np.ones(2), w)])  # noqa: E731
    strategy.run(step)
    snaps = [c.value() for c in w.values]
    kept = [s.copy() for s in snaps]
    strategy.run(step)
    for s, k, c in zip(snaps, kept, w.values, strict=True):
        np.testing.assert_array_equal(s, k)
        assert not np.array_equal(c.numpy(), k)


def test_plain_variables_cannot_be_updated_by_two_replicas(strategy):
    v = hd.Variable(np.zeros(2), name="plain")
    opt = SGD()
    with pytest.raises(TypeError, match="'plain' is not a MirroredVariable"):
        strategy.run(lambda: opt.apply_gradients([(np.ones(2), v)]))


def test_replicas_with_different_variables_raise(strategy):
    with strategy.scope():
        a, b = hd.Variable(np.zeros(1)), hd.Variable(np.zeros(1))
        opt = SGD()

    def fn():
        r = hd.get_replica_context().replica_id_in_sync_group
        return opt.apply_gradients([(np.ones(1), a if r == 0 else b)])

    with pytest.raises(RuntimeError, match="different collective calls"):
        strategy.run(fn)


def test_one_merge_call_per_apply_gradients(strategy, monkeypatch):
    from hpcdist.distribute.replica_context import ReplicaContext

    with strategy.scope():
        variables = [hd.Variable(np.ones(s, d)) for s, d in [((2, 2), np.float32), (3, np.float64)]]
        opt = Adam(0.01)
    merges = []
    original = ReplicaContext._merge

    def counting(self, merge_fn, args, kwargs, wrap_all, key=None):
        merges.append((self.replica_id_in_sync_group, key[0] if key else None))
        return original(self, merge_fn, args, kwargs, wrap_all, key)

    monkeypatch.setattr(ReplicaContext, "_merge", counting)
    step = lambda: opt.apply_gradients([(np.ones(v.shape), v) for v in variables])  # noqa: E731
    strategy.run(step)  # the first step also creates the slots (in the merge function)
    strategy.run(step)
    assert sorted(merges) == [(0, "apply_gradients")] * 2 + [(1, "apply_gradients")] * 2


@pytest.mark.parametrize(("kind", "config"), [CASES[2], CASES[8]])
def test_per_replica_sums_from_local_gpus_update_each_replica(monkeypatch, kind, config):
    """With several local GPUs the extended gives one summed copy per replica (NCCL);
    each replica updates its variables from its own copy and ``reduce_leaves`` is skipped.
    Here the CPU stand-in gives each replica the sum as a separate array."""
    strategy = hd.MirroredStrategy(["/cpu:0", "/cpu:1"])
    ext = strategy.extended
    sums: list[list[np.ndarray]] = []

    def on_gpus(op, leaves):
        assert op is hd.ReduceOp.SUM and all(isinstance(x, PerReplica) for x in leaves)
        total = [x.values[0] + x.values[1] for x in leaves]
        sums.append(total)
        return [[t.copy() for t in total] for _ in range(2)]

    monkeypatch.setattr(ext, "local_gpu_all_reduce", on_gpus)
    reduces = _count_reduces(strategy, monkeypatch)
    dtypes = (np.float64, np.float64)
    rng = np.random.default_rng(0)
    init = [rng.standard_normal(s) for s in SHAPES]
    with strategy.scope():
        variables = [hd.Variable(x, name=f"v{i}") for i, x in enumerate(init)]
        opt = make(kind, **config)
    ref = reference(kind, **config)
    expected = [x.copy() for x in init]

    def replica_fn(step):
        r = hd.get_replica_context().replica_id_in_sync_group
        return opt.apply_gradients(zip(_replica_grads(step, r, dtypes), variables, strict=True))

    for step in range(3):
        strategy.run(replica_fn, args=(step,))
        ref.step(
            expected,
            [
                a + b
                for a, b in zip(
                    _replica_grads(step, 0, dtypes), _replica_grads(step, 1, dtypes), strict=True
                )
            ],
        )
    assert len(sums) == 3 and reduces == []  # the GPU sum replaced the host reduction
    for v, e in zip(variables, expected, strict=True):
        for c in v.values:
            np.testing.assert_allclose(c.numpy(), e, rtol=1e-11, atol=1e-11)


def test_cpu_replicas_do_not_take_the_local_gpu_sum():
    strategy = hd.MirroredStrategy(["/cpu:0", "/cpu:1"])
    assert (
        strategy.extended.local_gpu_all_reduce(hd.ReduceOp.SUM, [PerReplica((1.0, 2.0))]) is None
    )
