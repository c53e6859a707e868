"""Layers, activations and initializers: values against NumPy references, gradients against
central finite differences in float64."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import hpcdist as hd
from hpcdist.nn import activations, backend, initializers
from hpcdist.nn.layers import Activation, Dense, Dropout, InputLayer, Layer


def numeric_grad(f, x: np.ndarray, eps: float = 1e-6) -> np.ndarray:
    """Central differences of the scalar function ``f`` at ``x`` (float64)."""
    g = np.zeros_like(x)
    for idx in np.ndindex(x.shape):
        old = x[idx]
        x[idx] = old + eps
        fp = f(x)
        x[idx] = old - eps
        fm = f(x)
        x[idx] = old
        g[idx] = (fp - fm) / (2 * eps)
    return g


def away_from_zero(rng, shape, low=0.05):
    """Random values with |x| >= low (kinks of relu/elu/selu are at 0)."""
    x = rng.uniform(low, 2.5, shape)
    return x * rng.choice([-1.0, 1.0], shape)


# -- activations -------------------------------------------------------------------------------

NAMES = ["linear", "relu", "sigmoid", "tanh", "softmax", "gelu", "softplus", "swish", "elu", "selu"]


@pytest.mark.parametrize("name", NAMES)
def test_activation_backward_matches_finite_differences(name):
    rng = np.random.default_rng(0)
    act = activations.get(name)
    x = away_from_zero(rng, (3, 5))
    r = rng.standard_normal((3, 5))  # f(x) = sum(r * act(x)), so df/dy = r
    y, cache = act.forward(x)
    dx = act.backward(cache, r)
    expected = numeric_grad(lambda z: float(np.sum(r * act(z))), x.copy())
    assert y.shape == x.shape and dx.shape == x.shape
    np.testing.assert_allclose(dx, expected, rtol=1e-6, atol=1e-8)


@pytest.mark.parametrize("name", NAMES)
def test_activations_keep_float32(name):
    x = np.linspace(-3, 3, 12, dtype=np.float32).reshape(3, 4)
    y, cache = activations.get(name).forward(x)
    assert y.dtype == np.float32
    assert activations.get(name).backward(cache, np.ones_like(x)).dtype == np.float32


def test_activation_values_against_reference_formulas():
    x = np.linspace(-4, 4, 17)
    np.testing.assert_allclose(activations.relu(x), np.where(x > 0, x, 0))
    np.testing.assert_allclose(activations.sigmoid(x), 1 / (1 + np.exp(-x)), rtol=1e-14)
    np.testing.assert_allclose(activations.tanh(x), np.tanh(x))
    np.testing.assert_allclose(activations.linear(x), x)
    gelu_ref = [0.5 * v * (1 + math.erf(v / math.sqrt(2))) for v in x]
    np.testing.assert_allclose(activations.gelu(x), gelu_ref, rtol=1e-13, atol=1e-15)
    np.testing.assert_allclose(activations.softplus(x), np.log1p(np.exp(x)), rtol=1e-13)
    np.testing.assert_allclose(activations.swish(x), x / (1 + np.exp(-x)), rtol=1e-13)
    np.testing.assert_allclose(activations.elu(x), np.where(x > 0, x, np.expm1(x)))
    a, s = 1.6732632423543772, 1.0507009873554805
    np.testing.assert_allclose(activations.selu(x), s * np.where(x > 0, x, a * np.expm1(x)))


def test_sigmoid_and_softmax_are_stable_for_large_inputs():
    x = np.array([[-1000.0, 0.0, 1000.0]], dtype=np.float32)
    with np.errstate(over="raise", invalid="raise", divide="raise", under="ignore"):
        sig = activations.sigmoid(x)
        soft = activations.softmax(x)
    np.testing.assert_array_equal(sig, [[0.0, 0.5, 1.0]])
    np.testing.assert_array_equal(soft, [[0.0, 0.0, 1.0]])


def test_softmax_is_over_the_last_axis_and_shift_invariant():
    rng = np.random.default_rng(1)
    x = rng.standard_normal((4, 6))
    y = activations.softmax(x)
    ref = np.exp(x) / np.exp(x).sum(axis=1, keepdims=True)
    np.testing.assert_allclose(y, ref, rtol=1e-13)
    np.testing.assert_allclose(activations.softmax(x + 50.0), y, rtol=1e-12)


def test_erf_fallback_without_scipy_is_accurate():
    x = np.linspace(-7, 7, 2001)
    ref = np.array([math.erf(v) for v in x])
    np.testing.assert_allclose(activations._erf_numpy(x), ref, rtol=0, atol=2e-13)
    assert activations.erf(np.float32([0.5])).dtype == np.float32


def test_get_activation():
    assert activations.get("ReLU") is activations.relu
    assert activations.get(None) is activations.linear
    assert activations.get("silu") is activations.swish
    assert activations.get(activations.tanh) is activations.tanh
    with pytest.raises(ValueError, match="unknown activation 'bogus'"):
        activations.get("bogus")
    with pytest.raises(TypeError, match="no backward pass"):
        activations.get(np.tanh)


# -- initializers ------------------------------------------------------------------------------


def test_glorot_uniform_limit_and_variance():
    w = initializers.GlorotUniform(seed=0)((300, 200))
    limit = math.sqrt(6 / (300 + 200))
    assert w.dtype == np.float32 and w.shape == (300, 200)
    assert np.abs(w).max() <= limit and np.abs(w).max() > 0.99 * limit
    np.testing.assert_allclose(w.var(), limit**2 / 3, rtol=0.02)
    assert abs(w.mean()) < 0.01 * limit


@pytest.mark.parametrize(
    ("name", "scale_of_fans"),
    [
        ("he_normal", lambda fi, fo: 2 / fi),
        ("glorot_normal", lambda fi, fo: 2 / (fi + fo)),
        ("lecun_normal", lambda fi, fo: 1 / fi),
    ],
)
def test_truncated_variance_scaling_std_and_bounds(name, scale_of_fans):
    fan_in, fan_out = 400, 250
    w = initializers.get({"class_name": initializers.get(name).__class__.__name__,
                          "config": {"seed": 3}})((fan_in, fan_out)).astype(np.float64)  # fmt: skip
    std = math.sqrt(scale_of_fans(fan_in, fan_out))
    np.testing.assert_allclose(w.std(), std, rtol=0.01)
    bound = 2 * std / 0.87962566103423978  # truncated at two std of the underlying normal
    assert np.abs(w).max() <= bound * (1 + 1e-6)
    assert np.abs(w).max() > 0.98 * bound


@pytest.mark.parametrize(("name", "scale"), [("he_uniform", 6.0), ("lecun_uniform", 3.0)])
def test_uniform_fan_in_limits(name, scale):
    w = initializers.get(name)((500, 40))
    limit = math.sqrt(scale / 500)
    assert np.abs(w).max() <= limit and np.abs(w).max() > 0.99 * limit


def test_random_and_constant_initializers():
    rn = initializers.RandomNormal(mean=1.0, stddev=0.5, seed=0)((100_000,), "float64")
    np.testing.assert_allclose([rn.mean(), rn.std()], [1.0, 0.5], rtol=0.01)
    ru = initializers.RandomUniform(-2.0, 1.0, seed=0)((100_000,), "float64")
    assert ru.min() >= -2.0 and ru.max() < 1.0 and abs(ru.mean() + 0.5) < 0.02
    tn = initializers.TruncatedNormal(stddev=0.1, seed=0)((100_000,), "float64")
    assert np.abs(tn).max() <= 0.2 and np.abs(tn).max() > 0.199
    np.testing.assert_array_equal(initializers.get("zeros")((2, 2)), np.zeros((2, 2)))
    np.testing.assert_array_equal(initializers.Ones()((3,), "float64"), np.ones(3))
    np.testing.assert_array_equal(initializers.Constant(0.25)((2,)), [0.25, 0.25])
    assert initializers.get("ones")((1,)).dtype == np.float32


def test_seeds_reproduce_sequences_and_global_seed_is_used():
    a, b = initializers.HeNormal(seed=7), initializers.HeNormal(seed=7)
    first, second = a((5, 5)), a((5, 5))
    np.testing.assert_array_equal(first, b((5, 5)))
    np.testing.assert_array_equal(second, b((5, 5)))
    assert not np.array_equal(first, second)
    np.random.seed(11)
    u1 = initializers.GlorotUniform()((4, 4))
    np.random.seed(11)
    np.testing.assert_array_equal(initializers.GlorotUniform()((4, 4)), u1)


def test_compute_fans_and_get():
    assert initializers.compute_fans((3, 3, 16, 32)) == (144.0, 288.0)
    assert initializers.compute_fans((7,)) == (7.0, 7.0)
    assert initializers.compute_fans(()) == (1.0, 1.0)
    assert isinstance(initializers.get("HeNormal"), initializers.HeNormal)
    assert isinstance(initializers.get(initializers.glorot_uniform), initializers.GlorotUniform)
    assert initializers.get(None) is None
    config = initializers.serialize(initializers.Constant(2.0))
    np.testing.assert_array_equal(initializers.get(config)((2,)), [2.0, 2.0])
    with pytest.raises(ValueError, match="unknown initializer 'nope'"):
        initializers.get("nope")
    with pytest.raises(ValueError, match="distribution"):
        initializers.VarianceScaling(distribution="cauchy")


def test_floatx_roundtrip():
    assert backend.floatx() == "float32" and backend.epsilon() == 1e-7
    try:
        backend.set_floatx("float64")
        assert Dense(2).dtype == "float64"
        assert initializers.Zeros()((1,)).dtype == np.float64
        with pytest.raises(ValueError, match="expected one of"):
            backend.set_floatx("int32")
    finally:
        backend.set_floatx("float32")


# -- Dense -------------------------------------------------------------------------------------


def dense64(units, n_in, activation=None, **kw):
    layer = Dense(units, activation=activation, dtype="float64",
                  bias_initializer=initializers.RandomNormal(stddev=0.3, seed=2), **kw)  # fmt: skip
    layer._build((None, n_in))
    return layer


@pytest.mark.parametrize("activation", ["linear", "tanh", "relu", "softmax", "gelu"])
def test_dense_gradients_match_finite_differences(activation):
    rng = np.random.default_rng(4)
    layer = dense64(3, 4, activation)
    x = away_from_zero(rng, (5, 4)) * 0.5
    r = rng.standard_normal((5, 3))
    kernel, bias = layer.kernel.numpy(), layer.bias.numpy()

    def f_params(w, b):
        return float(np.sum(r * activations.get(activation)(x @ w + b)))

    y, cache = layer.forward(x)
    dx, (dw, db) = layer.backward(cache, r)
    np.testing.assert_allclose(
        y, activations.get(activation)(x @ kernel + bias), rtol=1e-12, atol=1e-12
    )
    np.testing.assert_allclose(
        dx, numeric_grad(lambda z: float(np.sum(r * layer(z))), x.copy()), rtol=1e-6, atol=1e-8
    )
    np.testing.assert_allclose(
        dw, numeric_grad(lambda w: f_params(w, bias), kernel.copy()), rtol=1e-6, atol=1e-8
    )
    np.testing.assert_allclose(
        db, numeric_grad(lambda b: f_params(kernel, b), bias.copy()), rtol=1e-6, atol=1e-8
    )


@settings(max_examples=15, deadline=None)
@given(
    batch=st.integers(1, 4),
    n_in=st.integers(1, 4),
    units=st.integers(1, 3),
    extra=st.sampled_from([(), (2,)]),
    seed=st.integers(0, 2**16),
)
def test_dense_gradients_any_shape(batch, n_in, units, extra, seed):
    rng = np.random.default_rng(seed)
    layer = dense64(units, n_in, "sigmoid")
    x = rng.standard_normal((batch, *extra, n_in))
    r = rng.standard_normal((batch, *extra, units))
    _, cache = layer.forward(x)
    dx, (dw, db) = layer.backward(cache, r)
    kernel = layer.kernel.numpy()

    def f(w):
        return float(np.sum(r * activations.sigmoid(x @ w + layer.bias.numpy())))

    np.testing.assert_allclose(dw, numeric_grad(f, kernel.copy()), rtol=1e-5, atol=1e-8)
    np.testing.assert_allclose(
        dx, numeric_grad(lambda z: float(np.sum(r * layer(z))), x.copy()), rtol=1e-5, atol=1e-8
    )


def test_dense_without_bias_and_frozen():
    rng = np.random.default_rng(5)
    layer = dense64(2, 3, use_bias=False)
    assert [w.name for w in layer.weights] == ["dense/kernel"]
    x, r = rng.standard_normal((4, 3)), rng.standard_normal((4, 2))
    _, cache = layer.forward(x)
    dx, grads = layer.backward(cache, r)
    np.testing.assert_allclose(grads[0], x.T @ r)
    layer.trainable = False
    assert layer.trainable_weights == [] and len(layer.non_trainable_weights) == 1
    dx2, grads2 = layer.backward(cache, r)
    assert grads2 == []
    np.testing.assert_allclose(dx2, dx)
    np.testing.assert_allclose(dx, r @ layer.kernel.numpy().T)


def test_dense_casts_inputs_and_checks_shapes():
    layer = Dense(2, input_shape=(3,))
    assert layer.dtype == "float32" and not layer.built
    y = layer(np.ones((2, 3), dtype=np.float64))
    assert y.dtype == np.float32 and layer.kernel.dtype == np.float32
    assert layer([[1, 2, 3]]).shape == (1, 2)  # lists and ints are cast
    assert layer.count_params() == 8
    assert [w.name for w in layer.weights] == ["dense/kernel", "dense/bias"]
    with pytest.raises(ValueError, match="last dimension is 3; found input shape \\(2, 4\\)"):
        layer(np.ones((2, 4)))
    _, cache = layer.forward(np.ones((2, 3)))
    with pytest.raises(ValueError, match=r"dy has shape \(2,\), but the layer's output had"):
        layer.backward(cache, np.ones(2))
    with pytest.raises(ValueError, match="positive integer"):
        Dense(0)
    with pytest.raises(ValueError, match="layer dtype is 'int32'"):
        Dense(1, dtype="int32")
    with pytest.raises(ValueError, match="is not built"):
        Dense(1).count_params()


def test_dense_config():
    config = Dense(4, activation="relu", input_shape=(3,), name="hidden").get_config()
    assert config["units"] == 4 and config["activation"] == "relu" and config["name"] == "hidden"
    assert config["input_shape"] == (3,)
    twin = Dense.from_config(config)
    assert twin.units == 4 and twin.activation is activations.relu


def test_layer_call_inside_run_does_not_build(strategy):
    layer = Dense(2)
    with pytest.raises(RuntimeError, match="layer.build\\(input_shape\\)"):
        strategy.run(lambda: layer(np.ones((1, 3))))
    assert not layer.built
    with strategy.scope():
        layer(np.ones((1, 3)))
    assert isinstance(layer.kernel, hd.MirroredVariable)
    out = strategy.run(lambda: layer(np.ones((1, 3))))
    np.testing.assert_allclose(out.values[0], out.values[1])


# -- Activation, InputLayer, custom layers -------------------------------------------------------


def test_activation_layer_gradient_and_dtype():
    rng = np.random.default_rng(6)
    layer = Activation("tanh", dtype="float64")
    x, r = rng.standard_normal((3, 4)), rng.standard_normal((3, 4))
    y, cache = layer.forward(x)
    dx, grads = layer.backward(cache, r)
    assert grads == [] and layer.weights == [] and layer.count_params() == 0
    np.testing.assert_allclose(y, np.tanh(x))
    np.testing.assert_allclose(
        dx, numeric_grad(lambda z: float(np.sum(r * layer(z))), x.copy()), rtol=1e-6
    )
    assert Activation("relu")(x).dtype == np.float32


def test_input_layer_and_custom_layer():
    assert InputLayer((10,))._batch_input_shape == (None, 10)
    with pytest.raises(ValueError, match="needs input_shape"):
        InputLayer()

    class Square(Layer):
        def forward(self, x, training=False):
            return x * x, x

        def backward(self, cache, dy):
            return 2 * cache * dy, []

    sq = Square()
    assert sq.name == "square"
    np.testing.assert_array_equal(sq(np.array([3.0])), [9.0])
    assert Layer().compute_output_shape((None, 3)) == (None, 3)
    with pytest.raises(NotImplementedError):
        Layer().forward(np.ones(1))


# -- Dropout -----------------------------------------------------------------------------------


def test_dropout_is_identity_in_inference():
    x = np.arange(12.0).reshape(3, 4)
    layer = Dropout(0.5, seed=0, dtype="float64")
    y, cache = layer.forward(x, training=False)
    np.testing.assert_array_equal(y, x)
    np.testing.assert_array_equal(layer.backward(cache, np.ones_like(x))[0], np.ones_like(x))
    np.testing.assert_array_equal(Dropout(0.0)(x, training=True), x)


def test_dropout_training_scale_rate_and_backward():
    x = np.ones((200, 500), dtype=np.float32)
    layer = Dropout(0.3, seed=1)
    y, cache = layer.forward(x, training=True)
    assert y.dtype == np.float32
    kept = y != 0
    assert abs(1 - kept.mean() - 0.3) < 0.01  # fraction dropped ~ rate
    np.testing.assert_allclose(y[kept], 1 / 0.7, rtol=1e-6)  # survivors scaled by 1/(1-rate)
    assert abs(y.mean() - 1.0) < 0.02  # expectation preserved
    dy = np.random.default_rng(0).standard_normal(x.shape).astype(np.float32)
    dx, grads = layer.backward(cache, dy)
    assert grads == []
    np.testing.assert_allclose(dx, dy * y, rtol=1e-6)  # y = x * mask with x == 1


def test_dropout_masks_differ_per_call_and_repeat_with_the_seed():
    x = np.ones((4, 64))
    a, b = Dropout(0.5, seed=42), Dropout(0.5, seed=42)
    a1, a2 = a(x, training=True), a(x, training=True)
    assert not np.array_equal(a1, a2)
    np.testing.assert_array_equal(b(x, training=True), a1)
    np.testing.assert_array_equal(b(x, training=True), a2)
    assert not np.array_equal(Dropout(0.5, seed=43)(x, training=True), a1)
    np.random.seed(3)
    c = Dropout(0.5)(x, training=True)
    np.random.seed(3)
    np.testing.assert_array_equal(Dropout(0.5)(x, training=True), c)


def test_dropout_masks_differ_per_replica(strategy):
    layer = Dropout(0.5, seed=9)
    x = np.ones((4, 64), dtype=np.float32)
    out = strategy.run(lambda: layer(x, training=True))
    r0, r1 = out.values
    assert not np.array_equal(r0, r1)
    again = Dropout(0.5, seed=9)
    out2 = strategy.run(lambda: again(x, training=True))
    np.testing.assert_array_equal(out2.values[0], r0)
    np.testing.assert_array_equal(out2.values[1], r1)
    # replica 0 of the strategy draws what the layer draws outside run (replica id 0)
    np.testing.assert_array_equal(Dropout(0.5, seed=9)(x, training=True), r0)


def test_dropout_rejects_bad_rates():
    for rate in (-0.1, 1.0, 1.5):
        with pytest.raises(ValueError, match="in \\[0, 1\\)"):
            Dropout(rate)
    with pytest.raises(TypeError, match="Dropout rate"):
        Dropout("0.5")
    with pytest.raises(ValueError, match="seed"):
        Dropout(0.5, seed=-1)
