"""Traced (gradients of linear combinations of losses) and value_and_grad on a stand-in model."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hpcdist.nn.autodiff import value_and_grad
from hpcdist.nn.losses import MeanSquaredError, Reduction, mean_squared_error
from hpcdist.nn.tape import Traced, unbroadcast


def numeric_grad(f, x, h=1e-6):
    """Central finite differences of the scalar function ``f`` at ``x`` (float64)."""
    g = np.zeros_like(x)
    for i in np.ndindex(x.shape):
        xp, xm = x.copy(), x.copy()
        xp[i] += h
        xm[i] -= h
        g[i] = (f(xp) - f(xm)) / (2 * h)
    return g


def test_leaf_value_and_attributes():
    y = np.arange(6.0).reshape(3, 2)
    t = Traced.leaf(y)
    assert t.value is y
    assert (t.shape, t.ndim, t.dtype, t.size, len(t)) == ((3, 2), 2, np.float64, 6, 3)
    assert float(Traced.leaf(np.array([2.5]))) == 2.5


def test_linear_combination_gradient_matches_formula():
    rng = np.random.default_rng(0)
    y = rng.normal(size=(4, 3))
    c = rng.normal(size=(4, 1))
    w = rng.normal(size=(3,))
    t = Traced.leaf(y)
    loss = ((3.0 * t - 1.0) * c / 2.0 + t * w - (-t)).sum() / 5.0
    ref = (((3.0 * y - 1.0) * c / 2.0 + y * w + y).sum()) / 5.0
    assert float(loss) == pytest.approx(ref)
    np.testing.assert_allclose(loss.grad, (1.5 * c + w + 1.0) / 5.0 * np.ones_like(y))


def test_reflected_numpy_operands_and_functions():
    y = np.array([[1.0, 2.0], [3.0, 4.0]])
    a = np.array([2.0, -1.0])
    t = Traced.leaf(y)
    out = np.mean(a * t + 1.0 - t)  # ndarray.__mul__ defers to Traced
    assert isinstance(out, Traced)
    assert float(out) == pytest.approx(np.mean(a * y + 1.0 - y))
    np.testing.assert_allclose(out.grad, np.broadcast_to((a - 1.0) / 4.0, y.shape))
    s = np.sum(t, axis=1)
    assert isinstance(s, Traced)
    np.testing.assert_allclose(s.value, [3.0, 7.0])
    one_minus = 1.0 - t
    np.testing.assert_allclose(one_minus.sum().grad, -np.ones_like(y))


def test_augmented_assignment_makes_a_new_traced():
    y = np.array([[1.0, 2.0]])
    t = Traced.leaf(y)
    loss = t.sum()
    before = loss
    loss += 2.0 * t.mean()
    loss -= 1.0
    loss *= 3.0
    loss /= 2.0
    assert before is not loss and float(before) == 3.0
    assert float(loss) == pytest.approx((3.0 + 3.0 - 1.0) * 1.5)
    np.testing.assert_allclose(loss.grad, [[3.0, 3.0]])
    total = 0.0
    total += loss
    assert isinstance(total, Traced)


def test_sum_and_mean_over_axes_keep_exact_gradients():
    rng = np.random.default_rng(1)
    y = rng.normal(size=(2, 3, 4))
    w = rng.normal(size=(2, 3, 4))

    def f(v):
        return (v * w).mean(axis=(0, 2), keepdims=True).sum(axis=1).mean()

    t = f(Traced.leaf(y))
    assert float(t) == pytest.approx(float(f(y)))
    np.testing.assert_allclose(t.grad, numeric_grad(lambda v: float(f(v)), y), atol=1e-8)


def test_gradient_keeps_leaf_dtype_and_is_writable():
    y = np.ones((2, 3), dtype=np.float32)
    t = Traced.leaf(y)
    loss = (t * np.float64(2.0)).sum()  # a float64 constant may promote the value
    assert loss.grad.dtype == np.float32
    assert loss.grad.flags.writeable and loss.grad.flags.c_contiguous
    np.testing.assert_array_equal(loss.grad, 2.0)
    assert (t * 2.0).dtype == np.float32  # Python numbers do not promote


def test_sum_of_two_traced_of_one_leaf():
    y = np.array([[0.2, 0.8], [0.6, 0.4]])
    t = Traced.leaf(y)
    mse = mean_squared_error(np.zeros_like(y), t)
    loss = (mse + 2.0 * t.sum(axis=1)).sum() - mse.mean()
    expected = 2 * y / 2 + 2.0 - 0.5 * 2 * y / 2
    np.testing.assert_allclose(loss.grad, expected)


@pytest.mark.parametrize(
    "op, message",
    [
        (lambda t: t * t, "product of two Traced"),
        (lambda t: 1.0 / t, "dividing by a Traced"),
        (lambda t: t**2, "np.power"),
        (lambda t: np.exp(t), "np.exp"),
        (lambda t: abs(t), "np.absolute"),
        (lambda t: t @ np.ones(2), "np.matmul"),
        (lambda t: np.max(t), "np.max"),
        (lambda t: np.asarray(t), "use .value"),
        (lambda t: t[0], "indexing"),
        (lambda t: t.sum(dtype=np.float32), "axis and keepdims"),
    ],
)
def test_unsupported_operations_raise_type_error(op, message):
    t = Traced.leaf(np.ones((2, 2)))
    with pytest.raises(TypeError, match=message) as info:
        op(t)
    assert "hpcdist.nn losses" in str(info.value) or "Traced" in str(info.value)


def test_different_leaves_cannot_be_combined():
    a, b = Traced.leaf(np.ones(2)), Traced.leaf(np.ones(2))
    with pytest.raises(TypeError, match="different leaves"):
        a + b


def test_grad_needs_a_scalar_and_leaf_needs_an_array():
    t = Traced.leaf(np.ones((3, 2)))
    with pytest.raises(TypeError, match="scalar"):
        _ = t.sum(axis=0).grad
    with pytest.raises(TypeError, match=r"\.value"):
        Traced.leaf(t)
    with pytest.raises(ValueError, match="out of range"):
        t.sum(axis=2)


def test_unbroadcast_sums_broadcast_axes():
    ct = np.arange(12.0).reshape(2, 3, 2)
    np.testing.assert_allclose(unbroadcast(ct, (3, 1)), ct.sum(axis=0).sum(axis=1, keepdims=True))
    assert unbroadcast(ct, ()).item() == ct.sum()


@settings(max_examples=25, deadline=None)
@given(
    rows=st.integers(1, 4),
    cols=st.integers(1, 3),
    a=st.floats(-3, 3),
    b=st.floats(-3, 3),
)
def test_affine_gradient_property(rows, cols, a, b):
    y = np.linspace(-1.0, 1.0, rows * cols).reshape(rows, cols)
    loss = (a * Traced.leaf(y) + b).mean()
    np.testing.assert_allclose(loss.grad, np.full_like(y, a / y.size))


# -- value_and_grad on a stand-in model ---------------------------------------------------------
class Linear:
    """A one-layer stand-in model: y = x @ w + b (plain arrays, explicit backward)."""

    def __init__(self, w, b):
        self.w, self.b = w, b
        self.trainable_variables = [w, b]

    def forward(self, x, training=False):
        return x @ self.w + self.b, x

    def backward(self, caches, dy):
        x = caches
        return [x.T @ dy, dy.sum(axis=0)]


@pytest.fixture()
def data():
    rng = np.random.default_rng(3)
    return (
        rng.normal(size=(5, 3)),
        rng.normal(size=(5, 2)),
        rng.normal(size=(3, 2)),
        rng.normal(size=2),
    )


def test_value_and_grad_matches_finite_differences(data):
    x, y, w, b = data
    model = Linear(w, b)
    loss_obj = MeanSquaredError()
    loss, grads, y_pred = value_and_grad(model, loss_obj, return_outputs=True)(x, y)
    assert isinstance(loss, np.ndarray) and loss.shape == ()
    assert float(loss) == pytest.approx(np.mean((x @ w + b - y) ** 2))
    np.testing.assert_allclose(y_pred, x @ w + b)

    def loss_at(w_, b_):
        return float(np.mean((x @ w_ + b_ - y) ** 2))

    np.testing.assert_allclose(grads[0], numeric_grad(lambda v: loss_at(v, b), w), rtol=1e-6)
    np.testing.assert_allclose(grads[1], numeric_grad(lambda v: loss_at(w, v), b), rtol=1e-6)


def test_value_and_grad_passes_sample_weight(data):
    x, y, w, b = data
    sw = np.array([1.0, 0.0, 2.0, 0.5, 1.0])
    calls = []

    def loss_fn(y_true, y_pred, *rest):
        calls.append(len(rest))
        return MeanSquaredError(reduction=Reduction.SUM)(y_true, y_pred, *rest)

    step = value_and_grad(Linear(w, b), loss_fn)
    loss, grads = step(x, y, sample_weight=sw)
    step(x, y)
    assert calls == [1, 0]
    per = np.mean((x @ w + b - y) ** 2, axis=1)
    assert float(loss) == pytest.approx(np.sum(per * sw))
    ref = numeric_grad(lambda v: float(np.sum(np.mean((x @ v + b - y) ** 2, axis=1) * sw)), w)
    np.testing.assert_allclose(grads[0], ref, rtol=1e-6)


def test_value_and_grad_rejects_losses_without_gradient(data):
    x, y, w, b = data
    model = Linear(w, b)
    with pytest.raises(TypeError, match="does not depend on the predictions"):
        value_and_grad(model, lambda t, p: np.float64(1.0))(x, y)
    with pytest.raises(TypeError, match="scalar"):
        value_and_grad(model, MeanSquaredError(reduction="none"))(x, y)
    with pytest.raises(TypeError, match="callable"):
        value_and_grad(model, "mse")
