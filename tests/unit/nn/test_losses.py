"""Losses: values against NumPy reference formulas, gradients against finite differences."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hpcdist.nn import losses
from hpcdist.nn.losses import (
    BinaryCrossentropy,
    CategoricalCrossentropy,
    Loss,
    MeanSquaredError,
    Reduction,
    SparseCategoricalCrossentropy,
    builtin_loop,
    compute_average_loss,
    scale_regularization_loss,
)
from hpcdist.nn.tape import Traced

EPS = 1e-7


def numeric_grad(f, x, h=1e-6):
    g = np.zeros_like(x)
    for i in np.ndindex(x.shape):
        xp, xm = x.copy(), x.copy()
        xp[i] += h
        xm[i] -= h
        g[i] = (f(xp) - f(xm)) / (2 * h)
    return g


# -- independent reference formulas ----------------------------------------------------------------
def ref_bce(t, p, label_smoothing=0.0):
    t = t * (1 - label_smoothing) + 0.5 * label_smoothing
    c = np.minimum(np.maximum(p, EPS), 1 - EPS)
    return -np.mean(t * np.log(c + EPS) + (1 - t) * np.log(1 - c + EPS), axis=-1)


def ref_bce_logits(t, x, label_smoothing=0.0):
    t = t * (1 - label_smoothing) + 0.5 * label_smoothing
    s = 1 / (1 + np.exp(-x))
    return -np.mean(t * np.log(s) + (1 - t) * np.log(1 - s), axis=-1)


def ref_cce(t, p, label_smoothing=0.0):
    out = []
    for ti, pi in zip(t, p, strict=True):
        ti = ti * (1 - label_smoothing) + label_smoothing / len(ti)
        q = np.minimum(np.maximum(pi / pi.sum(), EPS), 1 - EPS)
        out.append(-sum(a * np.log(b) for a, b in zip(ti, q, strict=True)))
    return np.array(out)


def ref_cce_logits(t, x, label_smoothing=0.0):
    t = t * (1 - label_smoothing) + label_smoothing / t.shape[-1]
    soft = np.exp(x) / np.exp(x).sum(axis=-1, keepdims=True)
    return -(t * np.log(soft)).sum(axis=-1)


def ref_sparse(labels, p):
    out = []
    for k, pi in zip(labels, p, strict=True):
        c = np.minimum(np.maximum(pi, EPS), 1 - EPS)
        out.append(-np.log(c[int(k)] / c.sum()))
    return np.array(out)


def ref_sparse_logits(labels, x):
    return np.array(
        [np.log(np.exp(xi).sum()) - xi[int(k)] for k, xi in zip(labels, x, strict=True)]
    )


def ref_mse(t, p):
    return ((p - t) ** 2).mean(axis=-1)


rng = np.random.default_rng(42)
B, C = 5, 4
PROBS = rng.uniform(0.05, 0.95, size=(B, C))
UNNORM = rng.uniform(0.05, 1.0, size=(B, C))
LOGITS = rng.normal(scale=2.0, size=(B, C))
BINARY = rng.integers(0, 2, size=(B, C)).astype(np.float64)
SOFT = rng.uniform(0, 1, size=(B, C))
LABELS = rng.integers(0, C, size=B)
ONEHOT = np.eye(C)[LABELS]
REAL = rng.normal(size=(B, C))
WEIGHTS = rng.uniform(0, 2, size=B)

# (name, loss object factory, y_true, y_pred, reference per-example function)
CASES = [
    ("bce", lambda r: BinaryCrossentropy(reduction=r), BINARY, PROBS, ref_bce),
    ("bce_soft", lambda r: BinaryCrossentropy(reduction=r), SOFT, PROBS, ref_bce),
    (
        "bce_smooth",
        lambda r: BinaryCrossentropy(label_smoothing=0.2, reduction=r),
        BINARY,
        PROBS,
        lambda t, p: ref_bce(t, p, 0.2),
    ),
    (
        "bce_logits",
        lambda r: BinaryCrossentropy(from_logits=True, reduction=r),
        BINARY,
        LOGITS,
        ref_bce_logits,
    ),
    (
        "bce_logits_smooth",
        lambda r: BinaryCrossentropy(from_logits=True, label_smoothing=0.1, reduction=r),
        SOFT,
        LOGITS,
        lambda t, x: ref_bce_logits(t, x, 0.1),
    ),
    ("cce", lambda r: CategoricalCrossentropy(reduction=r), ONEHOT, UNNORM, ref_cce),
    ("cce_soft", lambda r: CategoricalCrossentropy(reduction=r), SOFT, UNNORM, ref_cce),
    (
        "cce_smooth",
        lambda r: CategoricalCrossentropy(label_smoothing=0.3, reduction=r),
        ONEHOT,
        UNNORM,
        lambda t, p: ref_cce(t, p, 0.3),
    ),
    (
        "cce_logits",
        lambda r: CategoricalCrossentropy(from_logits=True, reduction=r),
        SOFT,
        LOGITS,
        ref_cce_logits,
    ),
    (
        "cce_logits_smooth",
        lambda r: CategoricalCrossentropy(from_logits=True, label_smoothing=0.2, reduction=r),
        ONEHOT,
        LOGITS,
        lambda t, x: ref_cce_logits(t, x, 0.2),
    ),
    ("sparse", lambda r: SparseCategoricalCrossentropy(reduction=r), LABELS, UNNORM, ref_sparse),
    (
        "sparse_logits",
        lambda r: SparseCategoricalCrossentropy(from_logits=True, reduction=r),
        LABELS,
        LOGITS,
        ref_sparse_logits,
    ),
    ("mse", lambda r: MeanSquaredError(reduction=r), REAL, LOGITS, ref_mse),
]
IDS = [c[0] for c in CASES]


@pytest.mark.parametrize("name, make, y_true, y_pred, ref", CASES, ids=IDS)
def test_values_and_reductions_match_reference(name, make, y_true, y_pred, ref):
    per = ref(y_true, y_pred)
    np.testing.assert_allclose(make("none")(y_true, y_pred), per, rtol=1e-12)
    np.testing.assert_allclose(make("sum")(y_true, y_pred), per.sum(), rtol=1e-12)
    np.testing.assert_allclose(make("auto")(y_true, y_pred), per.mean(), rtol=1e-12)
    np.testing.assert_allclose(make("sum_over_batch_size")(y_true, y_pred), per.mean(), rtol=1e-12)
    w = WEIGHTS
    np.testing.assert_allclose(make("none")(y_true, y_pred, w), per * w, rtol=1e-12)
    np.testing.assert_allclose(make("sum")(y_true, y_pred, w), (per * w).sum(), rtol=1e-12)
    # Keras divides by the number of elements, not by the sum of the weights.
    np.testing.assert_allclose(make("auto")(y_true, y_pred, w), (per * w).sum() / B, rtol=1e-12)
    np.testing.assert_allclose(make("auto")(y_true, y_pred, 2.0), 2.0 * per.mean(), rtol=1e-12)
    np.testing.assert_allclose(make("sum")(y_true, y_pred, w[:, None]), (per * w).sum())


@pytest.mark.parametrize("name, make, y_true, y_pred, ref", CASES, ids=IDS)
@pytest.mark.parametrize("reduction", ["sum", "sum_over_batch_size"])
@pytest.mark.parametrize("weighted", [False, True])
def test_gradients_match_finite_differences(name, make, y_true, y_pred, ref, reduction, weighted):
    loss = make(reduction)
    w = WEIGHTS if weighted else None
    traced = loss(y_true, Traced.leaf(y_pred), w)
    assert isinstance(traced, Traced) and traced.shape == ()
    assert float(traced) == pytest.approx(float(loss(y_true, y_pred, w)), rel=1e-12)
    expected = numeric_grad(lambda v: float(loss(y_true, v, w)), y_pred)
    np.testing.assert_allclose(traced.grad, expected, rtol=1e-6, atol=1e-9)


@pytest.mark.parametrize("name, make, y_true, y_pred, ref", CASES, ids=IDS)
def test_gradient_of_per_example_losses_through_compute_average_loss(
    name, make, y_true, y_pred, ref
):
    loss = make("none")

    def f(v):
        return compute_average_loss(loss(y_true, v), global_batch_size=7, sample_weight=WEIGHTS)

    traced = f(Traced.leaf(y_pred))
    assert float(traced) == pytest.approx((ref(y_true, y_pred) * WEIGHTS).sum() / 7)
    expected = numeric_grad(lambda v: float(f(v)), y_pred)
    np.testing.assert_allclose(traced.grad, expected, rtol=1e-6, atol=1e-9)


def test_keras_documented_values():
    yt = np.array([[0.0, 1.0], [0.0, 0.0]])
    yp = np.array([[0.6, 0.4], [0.4, 0.6]])
    bce = BinaryCrossentropy
    assert float(bce()(yt, yp)) == pytest.approx(0.815, abs=1e-3)
    assert float(bce()(yt, yp, np.array([1.0, 0.0]))) == pytest.approx(0.458, abs=1e-3)
    assert float(bce(reduction="sum")(yt, yp)) == pytest.approx(1.630, abs=1e-3)
    np.testing.assert_allclose(bce(reduction="none")(yt, yp), [0.916, 0.714], atol=1e-3)
    logits = np.array([-18.6, 0.51, 2.94, -12.8])
    assert float(bce(from_logits=True)(np.array([0, 1, 0, 0.0]), logits)) == pytest.approx(
        0.865, abs=1e-3
    )
    ct = np.array([[0, 1, 0], [0, 0, 1.0]])
    cp = np.array([[0.05, 0.95, 0], [0.1, 0.8, 0.1]])
    for loss, labels in ((CategoricalCrossentropy, ct), (SparseCategoricalCrossentropy, [1, 2])):
        assert float(loss()(labels, cp)) == pytest.approx(1.177, abs=1e-3)
        assert float(loss()(labels, cp, np.array([0.3, 0.7]))) == pytest.approx(0.814, abs=1e-3)
        assert float(loss(reduction="sum")(labels, cp)) == pytest.approx(2.354, abs=1e-3)
        np.testing.assert_allclose(loss(reduction="none")(labels, cp), [0.0513, 2.303], atol=1e-3)
    mp = np.array([[1.0, 1.0], [1.0, 0.0]])
    assert float(MeanSquaredError()(yt, mp)) == pytest.approx(0.5)
    assert float(MeanSquaredError()(yt, mp, np.array([0.7, 0.3]))) == pytest.approx(0.25)


def test_clipped_probabilities_have_zero_gradient():
    t = np.array([[1.0, 0.0, 1.0, 0.0, 1.0]])
    p = np.array([[0.0, 1.0, 0.3, -0.2, 1.3]])
    loss = BinaryCrossentropy(reduction="sum")
    traced = loss(t, Traced.leaf(p))
    assert float(traced) == pytest.approx(ref_bce(t, p).sum())
    np.testing.assert_array_equal(traced.grad[0, [0, 1, 3, 4]], 0.0)
    assert traced.grad[0, 2] == pytest.approx((-1 / (0.3 + EPS)) / 5)
    sparse = SparseCategoricalCrossentropy(reduction="sum")
    sp = np.array([[0.0, 0.5, 0.5], [0.2, 0.3, 0.5]])
    labels = np.array([1, 2])
    traced = sparse(labels, Traced.leaf(sp))
    assert float(traced) == pytest.approx(ref_sparse(labels, sp).sum())
    assert traced.grad[0, 0] == 0.0
    fd = numeric_grad(lambda v: float(sparse(labels, v)), sp)
    mask = np.ones_like(sp, dtype=bool)
    mask[0, 0] = False
    np.testing.assert_allclose(traced.grad[mask], fd[mask], rtol=1e-6)


def test_categorical_gradient_includes_the_normalisation_of_clipped_entries():
    t = np.array([[0.0, 1.0, 0.0], [0.0, 0.0, 1.0]])
    p = np.array([[-1e-3, 0.4, 0.7], [0.2, 0.3, 0.9]])  # q[0, 0] < eps is clipped
    loss = CategoricalCrossentropy(reduction="sum")
    traced = loss(t, Traced.leaf(p))
    assert float(traced) == pytest.approx(ref_cce(t, p).sum())
    fd = numeric_grad(lambda v: float(loss(t, v)), p)
    np.testing.assert_allclose(traced.grad, fd, rtol=1e-6)
    assert traced.grad[0, 0] != 0.0  # the entry still moves the sum it is divided by


def test_float32_predictions_give_float32_gradients():
    p = PROBS.astype(np.float32)
    for loss, labels in (
        (BinaryCrossentropy(), BINARY),
        (CategoricalCrossentropy(), ONEHOT),
        (SparseCategoricalCrossentropy(), LABELS),
        (MeanSquaredError(), REAL),
    ):
        traced = loss(labels, Traced.leaf(p), WEIGHTS)
        assert traced.dtype == np.float32 and traced.grad.dtype == np.float32
        np.testing.assert_allclose(
            traced.grad, loss(labels, Traced.leaf(PROBS), WEIGHTS).grad, rtol=2e-3, atol=1e-6
        )


def test_label_shapes_and_dtypes_are_interchangeable():
    sparse = SparseCategoricalCrossentropy(reduction="none")
    expected = ref_sparse(LABELS, UNNORM)
    for labels in (
        LABELS,
        LABELS[:, None],
        LABELS.astype(np.float32),
        LABELS.astype(np.int32)[:, None],
    ):
        np.testing.assert_allclose(sparse(labels, UNNORM), expected)
    bce = BinaryCrossentropy(reduction="none")
    y = np.array([1.0, 0.0, 1.0])
    p = np.array([[0.8], [0.3], [0.4]])
    np.testing.assert_allclose(bce(y, p), ref_bce(y[:, None], p))
    np.testing.assert_allclose(bce(y[:, None, None], p), ref_bce(y[:, None], p))


def test_bad_labels_raise_clear_errors():
    with pytest.raises(ValueError, match="SparseCategoricalCrossentropy"):
        CategoricalCrossentropy()(LABELS, UNNORM)
    with pytest.raises(ValueError, match=r"class ids must be in \[0, 4\)"):
        SparseCategoricalCrossentropy()(np.array([0, 1, 2, 3, 4]), UNNORM)
    with pytest.raises(ValueError, match="non-integer"):
        SparseCategoricalCrossentropy()(np.array([0.5, 1, 2, 3, 0]), UNNORM)
    with pytest.raises(ValueError, match="CategoricalCrossentropy"):
        SparseCategoricalCrossentropy()(ONEHOT, UNNORM)
    with pytest.raises(ValueError, match="must match"):
        MeanSquaredError()(np.zeros((B, 3)), REAL)
    with pytest.raises(ValueError, match="sample_weight"):
        MeanSquaredError()(REAL, REAL, np.ones(3))
    with pytest.raises(ValueError, match="rank >= 1"):
        MeanSquaredError()(np.float64(1.0), np.float64(1.0))
    with pytest.raises(ValueError, match="invalid reduction"):
        MeanSquaredError(reduction="mean")


# -- the distribution check ----------------------------------------------------------------------
def test_auto_reduction_inside_multi_replica_run_raises(strategy):
    y, p = np.zeros((2, 1)), np.ones((2, 1))
    for reduction in ("auto", "sum_over_batch_size"):
        with pytest.raises(ValueError, match="compute_average_loss"):
            strategy.run(lambda r=reduction: MeanSquaredError(reduction=r)(y, p))


def test_builtin_loop_and_sum_none_reductions_are_allowed(strategy):
    y, p = np.zeros((2, 1)), np.ones((2, 1))

    def in_loop():
        with builtin_loop():
            return MeanSquaredError()(y, p)

    for fn in (
        in_loop,
        lambda: MeanSquaredError(reduction="sum")(y, p),
        lambda: MeanSquaredError(reduction="none")(y, p).sum(),
    ):
        values = strategy.experimental_local_results(strategy.run(fn))
        assert len(values) == 2 and all(float(v) > 0 for v in values)
    with strategy.scope():  # cross-replica context: no per-replica division to worry about
        assert float(MeanSquaredError()(y, p)) == 1.0
    assert float(MeanSquaredError()(y, p)) == 1.0
    with builtin_loop():
        pass
    with pytest.raises(ValueError):
        strategy.run(lambda: MeanSquaredError()(y, p))  # the flag is gone after the block


# -- compute_average_loss and scale_regularization_loss --------------------------------------------
def test_compute_average_loss_outside_strategy():
    per = np.array([1.0, 2.0, 3.0, 4.0])
    assert float(compute_average_loss(per)) == pytest.approx(2.5)
    assert float(compute_average_loss(per, global_batch_size=8)) == pytest.approx(1.25)
    assert float(compute_average_loss(per, global_batch_size=np.int64(5))) == pytest.approx(2.0)
    w = np.array([1.0, 0.0, 2.0, 0.5])
    assert float(compute_average_loss(per, sample_weight=w)) == pytest.approx(9.0 / 4)
    assert float(compute_average_loss(per, sample_weight=w[:, None])) == pytest.approx(9.0 / 4)
    assert float(compute_average_loss(per, global_batch_size=0)) == 0.0
    two_d = np.ones((3, 2))
    assert float(compute_average_loss(two_d)) == pytest.approx(2.0)  # sum of all / rows
    assert float(compute_average_loss(np.zeros(0))) == 0.0


def test_compute_average_loss_errors():
    with pytest.raises(ValueError, match="rank >= 1"):
        compute_average_loss(np.float64(1.0))
    with pytest.raises(TypeError, match="integer"):
        compute_average_loss(np.ones(2), global_batch_size=2.5)
    with pytest.raises(ValueError, match=">= 0"):
        compute_average_loss(np.ones(2), global_batch_size=-1)


def test_compute_average_loss_defaults_inside_two_replica_run(strategy):
    per = strategy.experimental_distribute_values_from_function(
        lambda ctx: np.arange(3.0) + 10 * ctx.replica_id_in_sync_group
    )
    out = strategy.run(lambda v: compute_average_loss(v), args=(per,))
    values = [float(v) for v in strategy.experimental_local_results(out)]
    assert values == pytest.approx([3.0 / 6, 33.0 / 6])
    with strategy.scope():  # cross-replica context counts one replica
        assert float(compute_average_loss(np.arange(3.0))) == pytest.approx(1.0)
    reg = strategy.run(lambda: scale_regularization_loss([np.float64(2.0), np.ones(2)]))
    assert [float(v) for v in strategy.experimental_local_results(reg)] == [2.0, 2.0]


def test_compute_average_loss_of_traced_and_zero_batch():
    leaf = Traced.leaf(REAL)
    per = losses.mean_squared_error(np.zeros_like(REAL), leaf)
    avg = compute_average_loss(per, global_batch_size=10, sample_weight=WEIGHTS)
    np.testing.assert_allclose(avg.grad, 2 * REAL / C * WEIGHTS[:, None] / 10)
    zero = compute_average_loss(per, global_batch_size=0)
    assert float(zero) == 0.0
    np.testing.assert_array_equal(zero.grad, 0.0)


def test_scale_regularization_loss_outside_strategy():
    assert float(scale_regularization_loss(np.array([1.0, 2.0]))) == 3.0
    assert float(scale_regularization_loss([np.float64(1.0), np.float64(3.0)])) == 4.0
    t = Traced.leaf(np.array([[1.0, 2.0]]))
    scaled = scale_regularization_loss([t.sum(), 2.0 * t.sum()])
    assert float(scaled) == 9.0
    np.testing.assert_allclose(scaled.grad, [[3.0, 3.0]])
    with pytest.raises(ValueError, match="empty"):
        scale_regularization_loss([])


# -- lookup, configuration, subclassing ----------------------------------------------------------
def test_get_and_config():
    assert isinstance(losses.get("binary_crossentropy"), BinaryCrossentropy)
    assert isinstance(losses.get("bce"), BinaryCrossentropy)
    assert isinstance(losses.get("mse"), MeanSquaredError)
    assert isinstance(losses.get("SparseCategoricalCrossentropy"), SparseCategoricalCrossentropy)
    assert isinstance(losses.get("categorical_crossentropy"), CategoricalCrossentropy)
    obj = CategoricalCrossentropy(from_logits=True, label_smoothing=0.1, reduction="sum")
    assert losses.get(obj) is obj
    assert losses.get(ref_mse) is ref_mse
    assert losses.get(None) is None
    with pytest.raises(ValueError, match="unknown loss"):
        losses.get("hinge")
    with pytest.raises(TypeError):
        losses.get(3)
    config = obj.get_config()
    assert config == {
        "reduction": "sum",
        "name": "categorical_crossentropy",
        "from_logits": True,
        "label_smoothing": 0.1,
    }
    clone = CategoricalCrossentropy.from_config(config)
    np.testing.assert_allclose(clone(SOFT, LOGITS), obj(SOFT, LOGITS))
    assert Reduction.all() == ("auto", "none", "sum", "sum_over_batch_size")


def test_subclassed_loss_uses_call_and_reduction():
    class Half(Loss):
        def call(self, y_true, y_pred):
            return 0.5 * losses.mean_squared_error(y_true, y_pred)

    loss = Half(reduction="sum")
    traced = loss(REAL, Traced.leaf(LOGITS))
    assert float(traced) == pytest.approx(0.5 * ref_mse(REAL, LOGITS).sum())
    np.testing.assert_allclose(traced.grad, (LOGITS - REAL) / C)


@settings(max_examples=20, deadline=None)
@given(
    rows=st.integers(1, 4),
    classes=st.integers(2, 5),
    seed=st.integers(0, 2**16),
    from_logits=st.booleans(),
)
def test_sparse_and_one_hot_categorical_agree(rows, classes, seed, from_logits):
    r = np.random.default_rng(seed)
    labels = r.integers(0, classes, size=rows)
    pred = r.normal(size=(rows, classes)) if from_logits else r.dirichlet(np.ones(classes), rows)
    pred = (
        pred
        if from_logits
        else np.clip(pred, 1e-3, None) / np.clip(pred, 1e-3, None).sum(1)[:, None]
    )
    sparse = SparseCategoricalCrossentropy(from_logits=from_logits, reduction="sum")
    dense = CategoricalCrossentropy(from_logits=from_logits, reduction="sum")
    a = sparse(labels, Traced.leaf(pred))
    b = dense(np.eye(classes)[labels], Traced.leaf(pred))
    assert float(a) == pytest.approx(float(b), rel=1e-6)
    if from_logits:
        np.testing.assert_allclose(a.grad, b.grad, atol=1e-12)
