"""MeanAbsoluteError, Huber, Precision, Recall, AUC and TopKCategoricalAccuracy against Keras's
documented formulas written out in NumPy; loss gradients against finite differences."""

from __future__ import annotations

import numpy as np
import pytest

import hpcdist as hd
from hpcdist.nn import Dense, Sequential, losses, metrics
from hpcdist.nn.confusion_metrics import AUC, Precision, Recall
from hpcdist.nn.metrics import (
    SparseTopKCategoricalAccuracy,
    TopKCategoricalAccuracy,
    results,
)
from hpcdist.nn.tape import Traced
from tests.unit.nn.test_layers import numeric_grad

# -- losses ---------------------------------------------------------------------------------------


def ref_huber(t, p, delta):
    e = np.abs(p - t)
    return np.mean(np.where(e <= delta, 0.5 * e**2, delta * e - 0.5 * delta**2), axis=-1)


@pytest.mark.parametrize(
    ("name", "fn", "ref"),
    [
        ("mae", losses.mean_absolute_error, lambda t, p: np.mean(np.abs(p - t), axis=-1)),
        ("huber", losses.huber, lambda t, p: ref_huber(t, p, 1.0)),
    ],
)
def test_per_example_values_and_gradients(name, fn, ref):
    rng = np.random.default_rng(0)
    t = rng.normal(size=(5, 3))
    p = t + rng.choice([-1, 1], (5, 3)) * rng.uniform(0.1, 2.5, (5, 3))  # |e| away from kinks
    np.testing.assert_allclose(fn(t, p), ref(t, p), rtol=1e-12)
    obj = losses.get(name)
    total = obj(t, Traced.leaf(p))
    np.testing.assert_allclose(float(total), ref(t, p).mean(), rtol=1e-12)
    np.testing.assert_allclose(
        total.grad, numeric_grad(lambda q: float(np.mean(ref(t, q))), p.copy()), atol=1e-8
    )


def test_huber_delta_names_and_reductions():
    t, p = np.array([[0.0, 0.0]]), np.array([[0.5, 3.0]])
    np.testing.assert_allclose(losses.huber(t, p), [(0.125 + 2.5) / 2])
    np.testing.assert_allclose(losses.huber(t, p, delta=2.0), [(0.125 + (6 - 2)) / 2])
    h = losses.Huber(delta=2.0, reduction="sum")
    assert h.name == "huber_loss" and h.get_config()["delta"] == 2.0
    np.testing.assert_allclose(float(h(np.zeros((2, 1)), np.array([[1.0], [4.0]]))), 0.5 + 6)
    assert type(losses.get("mae")) is losses.MeanAbsoluteError
    assert type(losses.get("mean_absolute_error")) is losses.MeanAbsoluteError
    assert type(losses.get("huber")) is losses.Huber
    assert type(losses.get("MeanAbsoluteError")) is losses.MeanAbsoluteError
    assert losses.mae is losses.mean_absolute_error
    with pytest.raises(ValueError, match="delta"):
        losses.Huber(delta=-1.0)


@pytest.mark.parametrize("loss", ["mae", "huber"])
def test_fit_with_the_new_losses_decreases_them(loss):
    rng = np.random.default_rng(1)
    x = rng.normal(size=(64, 3))
    y = x @ np.array([[1.0], [-2.0], [0.5]]) + 0.1
    model = Sequential([Dense(1, input_shape=(3,), dtype="float64")])
    model.compile(optimizer=hd.optimizers.SGD(0.05), loss=loss, metrics=["mae"])
    history = model.fit(x, y, batch_size=16, epochs=15, verbose=0, shuffle=False)
    assert history.history["loss"][-1] < 0.5 * history.history["loss"][0]
    assert "mae" in history.history


# -- Precision, Recall ---------------------------------------------------------------------------


def counts(t, p, th, w):
    pos = p > th
    t = t.astype(bool)
    return (w * (pos & t)).sum(), (w * (pos & ~t)).sum(), (w * (~pos & t)).sum()


def test_precision_and_recall_with_thresholds_and_weights():
    rng = np.random.default_rng(2)
    batches = [(rng.integers(0, 2, (n, 3)), rng.uniform(size=(n, 3)), rng.uniform(0, 2, n))
               for n in (4, 7, 1)]  # fmt: skip
    prec, rec = Precision(thresholds=[0.3, 0.5, 0.8]), Recall(thresholds=0.6)
    for t, p, w in batches:
        prec.update_state(t, p, sample_weight=w)
        rec.update_state(t, p, sample_weight=w)
    t = np.concatenate([b[0] for b in batches])
    p = np.concatenate([b[1] for b in batches])
    w = np.repeat(np.concatenate([b[2] for b in batches])[:, None], 3, axis=1)
    expected = []
    for th in (0.3, 0.5, 0.8):
        tp, fp, _ = counts(t, p, th, w)
        expected.append(tp / (tp + fp))
    np.testing.assert_allclose(prec.result(), expected, rtol=1e-12)
    tp, _, fn = counts(t, p, 0.6, w)
    assert rec.result() == pytest.approx(tp / (tp + fn), rel=1e-12)
    rec.reset_state()
    assert rec.result() == 0.0  # no data: divide_no_nan


def test_precision_top_k_and_class_id():
    t = np.array([[0, 0, 1, 1], [1, 0, 0, 1]])
    p = np.array([[0.1, 0.7, 0.6, 0.2], [0.9, 0.8, 0.3, 0.95]])
    m = Precision(top_k=2)  # positives: the two largest of each row
    m.update_state(t, p)
    assert m.result() == pytest.approx(3 / 4)  # row 0: 0.7 (no), 0.6 (yes); row 1: 0.95, 0.9
    r = Recall(class_id=3)
    r.update_state(t, p)
    assert r.result() == pytest.approx(1 / 2)  # class 3: labels 1, 1; predictions 0.2, 0.95
    both = Precision(top_k=1, class_id=1)
    both.update_state(t, p)
    assert both.result() == pytest.approx(0.0 / 1.0)  # only row 0 predicts class 1 (label 0)
    config = Precision(thresholds=[0.2], top_k=2, class_id=1, name="p").get_config()
    assert Precision(**config).get_config() == config


# -- AUC -------------------------------------------------------------------------------------------


def ref_auc(t, p, num_thresholds, curve, method, w=None):
    """Keras's AUC (metrics_utils / AUC.result) written out from its documentation."""
    eps = 1e-7
    th = [0.0 - eps] + [(i + 1) / (num_thresholds - 1) for i in range(num_thresholds - 2)]
    th = np.array([*th, 1.0 + eps])
    w = np.ones(p.shape) if w is None else np.broadcast_to(w, p.shape)
    t, p, w = t.ravel().astype(bool), p.ravel(), w.ravel()
    tp = np.array([(w * ((p > h) & t)).sum() for h in th])
    fp = np.array([(w * ((p > h) & ~t)).sum() for h in th])
    tn = np.array([(w * ((p <= h) & ~t)).sum() for h in th])
    fn = np.array([(w * ((p <= h) & t)).sum() for h in th])

    def div(a, b):
        return np.where(b > 0, a / np.where(b > 0, b, 1), 0.0)

    if curve == "PR" and method == "interpolation":
        dtp = tp[:-1] - tp[1:]
        pp = tp + fp
        dp = pp[:-1] - pp[1:]
        slope = div(dtp, np.maximum(dp, 0))
        intercept = tp[1:] - slope * pp[1:]
        ratio = np.where((pp[:-1] > 0) & (pp[1:] > 0), div(pp[:-1], np.maximum(pp[1:], 0)), 1.0)
        return float(np.sum(div(slope * (dtp + intercept * np.log(ratio)),
                                np.maximum(tp[1:] + fn[1:], 0))))  # fmt: skip
    recall = div(tp, tp + fn)
    x, y = (div(fp, fp + tn), recall) if curve == "ROC" else (recall, div(tp, tp + fp))
    h = {"interpolation": (y[:-1] + y[1:]) / 2, "minoring": np.minimum(y[:-1], y[1:]),
         "majoring": np.maximum(y[:-1], y[1:])}[method]  # fmt: skip
    return float(np.sum((x[:-1] - x[1:]) * h))


@pytest.mark.parametrize("curve", ["ROC", "PR"])
@pytest.mark.parametrize("method", ["interpolation", "minoring", "majoring"])
def test_auc_matches_the_keras_formula(curve, method):
    rng = np.random.default_rng(3)
    t = rng.integers(0, 2, (40, 2))
    p = np.clip(t * 0.3 + rng.uniform(size=(40, 2)) * 0.7, 0, 1)
    w = rng.uniform(0.5, 1.5, (40, 1))
    m = AUC(num_thresholds=25, curve=curve, summation_method=method)
    m.update_state(t[:13], p[:13], sample_weight=w[:13])
    m.update_state(t[13:], p[13:], sample_weight=w[13:])
    assert m.result() == pytest.approx(ref_auc(t, p, 25, curve, method, w), rel=1e-10)


def test_roc_auc_approaches_the_exact_rank_statistic():
    rng = np.random.default_rng(4)
    t = rng.integers(0, 2, 500)
    p = np.clip(0.25 * t + rng.uniform(size=500) * 0.75, 0, 1)
    m = AUC(num_thresholds=2000)
    m.update_state(t, p)
    pos, neg = p[t == 1], p[t == 0]
    exact = np.mean(pos[:, None] > neg[None, :]) + 0.5 * np.mean(pos[:, None] == neg[None, :])
    assert m.result() == pytest.approx(exact, abs=2e-3)
    logits = AUC(num_thresholds=2000, from_logits=True)
    logits.update_state(t, np.log(p / (1 - p + 1e-12) + 1e-12))
    assert logits.result() == pytest.approx(m.result(), abs=2e-3)


def test_auc_arguments():
    with pytest.raises(ValueError, match=r"multi_label=True\) is not supported"):
        AUC(multi_label=True)
    with pytest.raises(ValueError, match="curve"):
        AUC(curve="XY")
    m = AUC(thresholds=[0.25, 0.5, 0.75])
    assert m.num_thresholds == 5 and m.thresholds[1:-1].tolist() == [0.25, 0.5, 0.75]
    assert AUC(**AUC(num_thresholds=7, curve="PR").get_config()).num_thresholds == 7


# -- top-k accuracy and lookup ------------------------------------------------------------------


def test_top_k_categorical_accuracy_with_ties():
    p = np.array([[0.5, 0.3, 0.2, 0.0], [0.4, 0.4, 0.1, 0.1], [0.1, 0.2, 0.3, 0.4]])
    onehot = np.eye(4)[[2, 1, 0]]
    m = TopKCategoricalAccuracy(k=2)
    m.update_state(onehot, p)
    # row 0: class 2 is third; row 1: a tie at the top counts; row 2: class 0 is last
    assert m.result() == pytest.approx(1 / 3)
    assert TopKCategoricalAccuracy()(onehot, p) == pytest.approx(1.0)  # k=5 >= 4 classes
    s = SparseTopKCategoricalAccuracy(k=1)
    s.update_state(np.array([0, 1, 3]), p)
    assert s.result() == pytest.approx(1.0)  # row 1's tie: both classes are in the top 1
    assert TopKCategoricalAccuracy(k=3).get_config()["k"] == 3


def test_metric_lookup_by_keras_names():
    for name, cls in [("precision", Precision), ("Precision", Precision), ("recall", Recall),
                      ("auc", AUC), ("AUC", AUC),
                      ("top_k_categorical_accuracy", TopKCategoricalAccuracy),
                      ("TopKCategoricalAccuracy", TopKCategoricalAccuracy)]:  # fmt: skip
        assert type(metrics.get(name)) is cls
    assert metrics.Precision is Precision and metrics.AUC is AUC
    mae = metrics.get("mae")
    mae.update_state(np.array([[1.0, 2.0]]), np.array([[2.0, 4.0]]))
    assert mae.result() == 1.5


def test_compiled_metrics_report_in_fit_logs():
    rng = np.random.default_rng(5)
    x = rng.normal(size=(32, 2))
    y = (x[:, :1] > 0).astype(np.float64)
    model = Sequential([Dense(1, activation="sigmoid", input_shape=(2,), dtype="float64")])
    model.compile(optimizer=hd.optimizers.Adam(0.05), loss="binary_crossentropy",
                  metrics=["precision", "recall", "auc"])  # fmt: skip
    history = model.fit(x, y, batch_size=8, epochs=10, verbose=0, shuffle=False)
    assert set(history.history) == {"loss", "precision", "recall", "auc"}
    assert history.history["auc"][-1] > 0.9
    ms = [Precision(), Recall(), AUC()]
    pred = model.predict(x)
    for m in ms:
        m.update_state(y, pred)
    logs = model.evaluate(x, y, verbose=0, return_dict=True)
    np.testing.assert_allclose([logs["precision"], logs["recall"], logs["auc"]], results(ms),
                               rtol=1e-12)  # fmt: skip
