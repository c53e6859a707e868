"""Metrics: values against NumPy, reset, and aggregation under a two-replica MirroredStrategy."""

from __future__ import annotations

import numpy as np
import pytest

from hpcdist.distribute.variables import SyncOnReadVariable
from hpcdist.nn import losses, metrics
from hpcdist.nn.metrics import (
    Accuracy,
    BinaryAccuracy,
    CategoricalAccuracy,
    Mean,
    MeanMetricWrapper,
    SparseCategoricalAccuracy,
    Sum,
    results,
)
from hpcdist.nn.tape import Traced


def test_keras_documented_values():
    m = Mean()
    m.update_state([1, 3, 5, 7])
    assert m.result() == 4.0
    m.reset_state()
    m.update_state([1, 3, 5, 7], sample_weight=[1, 1, 0, 0])
    assert m.result() == 2.0
    s = Sum()
    s.update_state([1, 3, 5, 7])
    assert s.result() == 16.0
    a = Accuracy()
    a.update_state([[1], [2], [3], [4]], [[0], [2], [3], [4]])
    assert a.result() == 0.75
    a.reset_state()
    a.update_state([[1], [2], [3], [4]], [[0], [2], [3], [4]], sample_weight=[1, 1, 0, 0])
    assert a.result() == 0.5
    b = BinaryAccuracy()
    b.update_state([[1], [1], [0], [0]], [[0.98], [1], [0], [0.6]])
    assert b.result() == 0.75
    b.reset_state()
    b.update_state([[1], [1], [0], [0]], [[0.98], [1], [0], [0.6]], sample_weight=[1, 0, 0, 1])
    assert b.result() == 0.5
    c = CategoricalAccuracy()
    c.update_state([[0, 0, 1], [0, 1, 0]], [[0.1, 0.9, 0.8], [0.05, 0.95, 0]])
    assert c.result() == 0.5
    c.reset_state()
    c.update_state(
        [[0, 0, 1], [0, 1, 0]], [[0.1, 0.9, 0.8], [0.05, 0.95, 0]], sample_weight=[0.7, 0.3]
    )
    assert c.result() == pytest.approx(0.3)
    sc = SparseCategoricalAccuracy()
    sc.update_state([[2], [1]], [[0.1, 0.6, 0.3], [0.05, 0.95, 0]])
    assert sc.result() == 0.5
    sc.reset_state()
    sc.update_state([[2], [1]], [[0.1, 0.6, 0.3], [0.05, 0.95, 0]], sample_weight=[0.7, 0.3])
    assert sc.result() == pytest.approx(0.3)


def make_batches(seed, n_batches=3, classes=4):
    r = np.random.default_rng(seed)
    out = []
    for _ in range(n_batches):
        n = int(r.integers(1, 7))
        out.append(
            {
                "labels": r.integers(0, classes, size=n),
                "probs": r.dirichlet(np.ones(classes), n),
                "binary": r.integers(0, 2, size=(n, 1)).astype(np.float64),
                "bprob": r.uniform(size=(n, 1)),
                "values": r.normal(size=n),
                "weights": r.uniform(0, 2, size=n),
            }
        )
    return out


def make_metrics():
    return [
        Mean(name="mean"),
        Mean(name="wmean"),
        Sum(name="sum"),
        SparseCategoricalAccuracy(),
        CategoricalAccuracy(),
        BinaryAccuracy(threshold=0.4),
        Accuracy(),
        MeanMetricWrapper(losses.categorical_crossentropy, name="cce"),
    ]


def update(ms, b):
    onehot = np.eye(b["probs"].shape[1])[b["labels"]]
    ms[0].update_state(b["values"])
    ms[1].update_state(b["values"], sample_weight=b["weights"])
    ms[2].update_state(b["values"], sample_weight=b["weights"])
    ms[3].update_state(b["labels"], b["probs"], sample_weight=b["weights"])
    ms[4].update_state(onehot, b["probs"])
    ms[5].update_state(b["binary"][:, 0], b["bprob"])  # (B,) labels against (B, 1) predictions
    ms[6].update_state(b["labels"], np.argmax(b["probs"], axis=1))
    ms[7].update_state(onehot, b["probs"], sample_weight=b["weights"][:, None])


def reference(batches):
    """Each metric over all batches, written out with NumPy."""
    cat = {k: np.concatenate([b[k] for b in batches]) for k in batches[0]}
    v, w, lab, p = cat["values"], cat["weights"], cat["labels"], cat["probs"]
    hit = (np.argmax(p, axis=1) == lab).astype(float)
    q = np.clip(p / p.sum(1, keepdims=True), 1e-7, 1 - 1e-7)
    cce = -np.log(q[np.arange(len(lab)), lab])
    bin_hit = ((cat["bprob"][:, 0] > 0.4) == (cat["binary"][:, 0] == 1)).astype(float)
    return [
        v.mean(),
        (v * w).sum() / w.sum(),
        (v * w).sum(),
        (hit * w).sum() / w.sum(),
        hit.mean(),
        bin_hit.mean(),
        hit.mean(),
        (cce * w).sum() / w.sum(),
    ]


def test_metrics_match_numpy_over_several_batches():
    batches = make_batches(0)
    ms = make_metrics()
    for b in batches:
        update(ms, b)
    np.testing.assert_allclose(results(ms), reference(batches), rtol=1e-12)
    np.testing.assert_allclose([m.result() for m in ms], reference(batches), rtol=1e-12)
    for m in ms:
        m.reset_state()
    assert results(ms) == [0.0] * len(ms)
    update(ms, batches[1])
    np.testing.assert_allclose(results(ms), reference(batches[1:2]), rtol=1e-12)


def test_update_accepts_traced_and_call_returns_result():
    m = SparseCategoricalAccuracy()
    probs = np.array([[0.1, 0.9], [0.8, 0.2]])
    assert m(np.array([1, 1]), Traced.leaf(probs)) == 0.5
    mean = Mean()
    assert mean(Traced.leaf(np.array([2.0, 4.0]))) == 3.0
    mean.reset_states()
    assert mean.result() == 0.0  # div-no-nan on an empty metric


def test_weights_of_other_ranks():
    m = Mean()
    values = np.arange(6.0).reshape(2, 3)
    m.update_state(values, sample_weight=np.array([1.0, 3.0]))  # (2,) -> one weight per row
    assert m.result() == pytest.approx((values.sum(1) * [1, 3]).sum() / (3 * 4))
    m.reset_state()
    values3 = np.arange(24.0).reshape(2, 3, 4)
    m.update_state(values3, sample_weight=np.array([1.0, 0.0]))  # rows averaged first
    assert m.result() == pytest.approx(values3[0].mean())
    s = Sum()
    s.update_state(values3, sample_weight=np.array([0.0, 2.0]))
    assert s.result() == pytest.approx(2 * values3[1].sum())
    with pytest.raises(ValueError, match="sample_weight"):
        Mean().update_state(values, sample_weight=np.ones(5))


def test_get_picks_accuracy_from_loss_and_output_shape():
    get = metrics.get
    assert isinstance(get("accuracy", loss="binary_crossentropy"), BinaryAccuracy)
    assert isinstance(get("acc", loss=losses.BinaryCrossentropy()), BinaryAccuracy)
    assert isinstance(get("accuracy", loss="mse", output_shape=(None, 1)), BinaryAccuracy)
    assert isinstance(
        get("accuracy", loss="sparse_categorical_crossentropy"), SparseCategoricalAccuracy
    )
    assert isinstance(
        get("accuracy", loss=losses.sparse_categorical_crossentropy), SparseCategoricalAccuracy
    )
    assert isinstance(get("accuracy", loss="categorical_crossentropy"), CategoricalAccuracy)
    acc = get("accuracy", loss="mse", output_shape=(None, 3))
    assert type(acc) is Accuracy and acc.name == "accuracy"
    assert get("acc", loss="bce").name == "acc"
    assert isinstance(get("sparse_categorical_accuracy"), SparseCategoricalAccuracy)
    assert isinstance(get("BinaryAccuracy"), BinaryAccuracy)
    assert type(get("Accuracy")) is Accuracy
    assert isinstance(get("mean"), Mean) and isinstance(get(Sum), Sum)
    mse = get("mse")
    assert isinstance(mse, MeanMetricWrapper) and mse.name == "mse"
    m = Mean()
    assert get(m) is m
    wrapped = get(losses.mean_squared_error)
    assert wrapped.name == "mean_squared_error"
    with pytest.raises(ValueError, match="unknown metric"):
        get("f1")
    with pytest.raises(TypeError):
        get(3)


def test_state_is_float64_and_plain_outside_a_strategy():
    m = Mean()
    assert all(type(v).__name__ == "Variable" for v in m.variables)
    assert all(v.dtype == np.float64 and not v.trainable for v in m.variables)
    assert [v.name for v in m.variables] == ["mean/total", "mean/count"]
    m.update_state(np.ones(3, dtype=np.float32))
    assert m.count.numpy() == 3.0


# -- under a two-replica MirroredStrategy ------------------------------------------------------
def test_replica_updates_aggregate_to_the_metric_of_the_union(strategy):
    with strategy.scope():
        ms = make_metrics()
    assert all(isinstance(v, SyncOnReadVariable) for m in ms for v in m.variables)
    per_replica = [make_batches(10), make_batches(11)]
    for step in range(3):
        batch = strategy.experimental_distribute_values_from_function(
            lambda ctx, s=step: per_replica[ctx.replica_id_in_sync_group][s]
        )

        def fn(b):
            update(ms, b)
            return [m.result() for m in ms]  # inside run: this replica's own result

        local = strategy.experimental_local_results(strategy.run(fn, args=(batch,)))
        for r in range(2):
            np.testing.assert_allclose(local[r], reference(per_replica[r][: step + 1]))
    union = per_replica[0] + per_replica[1]
    np.testing.assert_allclose(results(ms), reference(union), rtol=1e-12)
    np.testing.assert_allclose([m.result() for m in ms], reference(union), rtol=1e-12)
    single = make_metrics()
    for b in union:
        update(single, b)
    np.testing.assert_allclose(results(ms), results(single), rtol=1e-12)


def test_results_issues_one_batched_reduction(strategy, monkeypatch):
    with strategy.scope():
        ms = make_metrics()
    calls = []
    original = strategy.extended.reduce_leaves

    def counting(op, leaves, options=None):
        calls.append(len(leaves))
        return original(op, leaves, options)

    monkeypatch.setattr(strategy.extended, "reduce_leaves", counting)
    results(ms + ms[:2])  # repeated metrics are reduced once
    assert calls == [sum(len(m.variables) for m in ms)]


def test_reset_and_cross_replica_updates(strategy):
    with strategy.scope():
        m = Mean()
    data = strategy.experimental_distribute_values_from_function(
        lambda ctx: np.full(2, 1.0 + ctx.replica_id_in_sync_group)
    )
    strategy.run(m.update_state, args=(data,))
    assert m.result() == 1.5
    m.update_state(np.array([6.0, 6.0]))  # cross-replica: added to the first replica's copy
    assert m.result() == pytest.approx((2 + 4 + 12) / 6)
    with strategy.scope():
        assert m.result() == pytest.approx(3.0)
    m.reset_state()
    assert [float(c.numpy()) for v in m.variables for c in v.values] == [0.0] * 4
    assert m.result() == 0.0


def test_metric_made_outside_the_scope_sums_both_replicas(strategy):
    m = Sum()  # plain variables, shared by the replica threads
    data = strategy.experimental_distribute_values_from_function(
        lambda ctx: np.full(1000, 1.0 + ctx.replica_id_in_sync_group)
    )
    for _ in range(20):
        strategy.run(m.update_state, args=(data,))
    assert m.result() == 20 * 3000.0
