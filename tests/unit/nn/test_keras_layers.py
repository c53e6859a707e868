"""Input, Flatten, BatchNormalization, LayerNormalization, Embedding, leaky_relu and the
regularizers: values against Keras's documented formulas (NumPy references), gradients against
central finite differences in float64, and BatchNormalization's synchronized statistics over
the replicas of an in-process MirroredStrategy."""

from __future__ import annotations

import numpy as np
import pytest

import hpcdist as hd
from hpcdist.nn import Dense, Sequential, activations, regularizers
from hpcdist.nn.embedding import Embedding
from hpcdist.nn.layers import Flatten, Input, InputLayer
from hpcdist.nn.normalization import BatchNormalization, LayerNormalization
from tests.unit.nn.test_layers import numeric_grad


def check_layer_gradients(layer, x, r, training, rtol=1e-6, atol=1e-8):
    """dx and every weight gradient of ``sum(r * layer(x))`` against finite differences."""
    _, cache = layer.forward(x, training=training)
    dx, grads = layer.backward(cache, r)

    def f_x(z):
        return float(np.sum(r * layer.forward(z, training=training)[0]))

    np.testing.assert_allclose(dx, numeric_grad(f_x, x.copy()), rtol=rtol, atol=atol)
    assert len(grads) == len(layer.trainable_weights)
    for var, g in zip(layer.trainable_weights, grads, strict=True):
        base = var.numpy().copy()

        def f_w(w, var=var):
            var.assign(w)
            return float(np.sum(r * layer.forward(x, training=training)[0]))

        np.testing.assert_allclose(g, numeric_grad(f_w, base.copy()), rtol=rtol, atol=atol)
        var.assign(base)


# -- leaky_relu --------------------------------------------------------------------------------


def test_leaky_relu_formula_gradient_and_dtype():
    x = np.array([-2.0, -0.5, 0.5, 3.0])
    y, cache = activations.leaky_relu.forward(x)
    np.testing.assert_allclose(y, np.where(x > 0, x, 0.2 * x))  # Keras 3: negative_slope=0.2
    dy = np.array([1.0, 2.0, 3.0, 4.0])
    np.testing.assert_allclose(activations.leaky_relu.backward(cache, dy), [0.2, 0.4, 3.0, 4.0])
    assert activations.get("leaky_relu") is activations.leaky_relu
    assert activations.leaky_relu(x.astype(np.float32)).dtype == np.float32
    layer = Dense(3, activation="leaky_relu", dtype="float64")
    layer._build((None, 2))
    rng = np.random.default_rng(0)
    check_layer_gradients(layer, rng.uniform(0.1, 1, (4, 2)) * [1, -1], rng.normal(size=(4, 3)),
                          False)  # fmt: skip


# -- Input and Flatten -------------------------------------------------------------------------


def test_input_builds_a_sequential_model():
    inp = Input(shape=(3, 4), name="pixels")
    assert isinstance(inp, InputLayer) and inp._batch_input_shape == (None, 3, 4)
    model = Sequential([inp, Flatten(), Dense(2)])
    assert model.built and model.input_shape == (None, 3, 4) and model.output_shape == (None, 2)
    assert [type(layer).__name__ for layer in model.layers] == ["Flatten", "Dense"]
    assert model.get_layer("dense").kernel.shape == (12, 2)
    assert Input((5,), batch_size=8)._batch_input_shape == (8, 5)
    with pytest.raises(ValueError, match="Input needs shape"):
        Input()


def test_flatten_forward_backward_and_shapes():
    layer = Flatten(dtype="float64")
    x = np.arange(24.0).reshape(2, 3, 4)
    y, cache = layer.forward(x)
    np.testing.assert_array_equal(y, x.reshape(2, 12))
    dx, grads = layer.backward(cache, np.arange(24.0).reshape(2, 12) * 2)
    np.testing.assert_array_equal(dx, x * 2)
    assert grads == [] and layer.weights == []
    assert layer.compute_output_shape((None, 3, 4)) == (None, 12)
    assert layer.compute_output_shape((None, None, 4)) == (None, None)
    assert layer(np.ones(3)).shape == (3, 1)  # a vector per batch: one feature each
    with pytest.raises(ValueError, match="output gradient dy has shape"):
        layer.backward(cache, np.ones((2, 11)))


# -- LayerNormalization ------------------------------------------------------------------------


def test_layer_normalization_formula():
    rng = np.random.default_rng(1)
    layer = LayerNormalization(dtype="float64", epsilon=1e-3)
    x = rng.normal(size=(4, 5)) * 3 + 1
    layer._build((None, 5))
    gamma, beta = rng.normal(size=5), rng.normal(size=5)
    layer.gamma.assign(gamma)
    layer.beta.assign(beta)
    mean = x.mean(axis=-1, keepdims=True)
    var = x.var(axis=-1, keepdims=True)
    expected = gamma * (x - mean) / np.sqrt(var + 1e-3) + beta
    np.testing.assert_allclose(layer(x), expected, rtol=1e-12)
    np.testing.assert_allclose(layer(x, training=True), expected, rtol=1e-12)  # no batch stats
    assert [w.name for w in layer.weights] == ["layer_normalization/gamma",
                                               "layer_normalization/beta"]  # fmt: skip


@pytest.mark.parametrize("axis", [-1, [1, 2], 1])
def test_layer_normalization_gradients(axis):
    rng = np.random.default_rng(2)
    layer = LayerNormalization(axis=axis, dtype="float64")
    layer._build((None, 3, 4))
    for w in layer.trainable_weights:
        w.assign(rng.normal(size=w.shape))
    check_layer_gradients(layer, rng.normal(size=(2, 3, 4)), rng.normal(size=(2, 3, 4)), True)


def test_layer_normalization_without_center_and_scale():
    layer = LayerNormalization(center=False, scale=False, dtype="float64")
    x = np.array([[1.0, 3.0]])
    np.testing.assert_allclose(layer(x), [[-1.0, 1.0]] / np.sqrt(1 + 1e-3))
    assert layer.weights == []
    check_layer_gradients(layer, np.array([[1.0, 3.0, 2.5]]), np.array([[0.3, -1.0, 2.0]]), True)


# -- BatchNormalization ------------------------------------------------------------------------


def bn64(**kwargs):
    layer = BatchNormalization(dtype="float64", **kwargs)
    layer._build((None, 3))
    return layer


def test_batch_normalization_training_formula_and_moving_statistics():
    rng = np.random.default_rng(3)
    layer = bn64(momentum=0.9, epsilon=1e-3)
    gamma, beta = rng.normal(size=3), rng.normal(size=3)
    layer.gamma.assign(gamma)
    layer.beta.assign(beta)
    x = rng.normal(size=(6, 3)) * 2 + 5
    mean, var = x.mean(axis=0), x.var(axis=0)  # the biased variance, as Keras
    y = layer(x, training=True)
    np.testing.assert_allclose(y, gamma * (x - mean) / np.sqrt(var + 1e-3) + beta, rtol=1e-12)
    np.testing.assert_allclose(layer.moving_mean.numpy(), 0.9 * 0 + 0.1 * mean, rtol=1e-12)
    np.testing.assert_allclose(layer.moving_variance.numpy(), 0.9 * 1 + 0.1 * var, rtol=1e-12)
    x2 = rng.normal(size=(6, 3))
    layer(x2, training=True)
    np.testing.assert_allclose(layer.moving_mean.numpy(),
                               0.9 * (0.1 * mean) + 0.1 * x2.mean(axis=0), rtol=1e-12)  # fmt: skip


def test_batch_normalization_inference_uses_moving_statistics():
    rng = np.random.default_rng(4)
    layer = bn64()
    mm, mv = rng.normal(size=3), rng.uniform(0.5, 2, 3)
    layer.moving_mean.assign(mm)
    layer.moving_variance.assign(mv)
    x = rng.normal(size=(4, 3))
    expected = (x - mm) / np.sqrt(mv + 1e-3)
    np.testing.assert_allclose(layer(x), expected, rtol=1e-12)
    np.testing.assert_allclose(layer.moving_mean.numpy(), mm)  # unchanged in inference
    layer.trainable = False  # a frozen layer runs in inference mode even when training
    np.testing.assert_allclose(layer(x, training=True), expected, rtol=1e-12)
    np.testing.assert_allclose(layer.moving_mean.numpy(), mm)
    assert layer.trainable_weights == [] and len(layer.non_trainable_weights) == 4


@pytest.mark.parametrize("training", [True, False])
def test_batch_normalization_gradients(training):
    rng = np.random.default_rng(5)
    layer = bn64()
    layer.gamma.assign(rng.normal(size=3))
    layer.beta.assign(rng.normal(size=3))
    layer.moving_variance.assign(rng.uniform(0.5, 2, 3))
    check_layer_gradients(layer, rng.normal(size=(5, 3)), rng.normal(size=(5, 3)), training)


def test_batch_normalization_over_a_middle_axis_gradients():
    rng = np.random.default_rng(6)
    layer = BatchNormalization(axis=1, dtype="float64")
    layer._build((None, 3, 2))
    assert layer.gamma.shape == (3,)
    x = rng.normal(size=(4, 3, 2))
    y = layer(x, training=True)
    mean, var = x.mean(axis=(0, 2), keepdims=True), x.var(axis=(0, 2), keepdims=True)
    np.testing.assert_allclose(y, (x - mean) / np.sqrt(var + 1e-3), rtol=1e-12)
    check_layer_gradients(layer, x, rng.normal(size=(4, 3, 2)), True)


def test_batch_normalization_checks_arguments():
    with pytest.raises(TypeError, match="expected one int"):
        BatchNormalization(axis=[1, 2])
    with pytest.raises(ValueError, match="momentum"):
        BatchNormalization(momentum=1.5)
    with pytest.raises(ValueError, match="axis 0 is the batch"):
        BatchNormalization(axis=0)._build((None, 3))
    config = BatchNormalization(momentum=0.9, synchronized=True, name="bn").get_config()
    twin = BatchNormalization.from_config(config)
    assert twin.momentum == 0.9 and twin.synchronized and twin.name == "bn"


@pytest.mark.parametrize("synchronized", [True, False])
def test_synchronized_batch_normalization_over_replicas(synchronized):
    """2 replicas x half batch == 1 process x full batch with synchronized=True (forward,
    moving statistics, gradients of the input and of gamma/beta); without it, each replica
    normalizes its own half."""
    rng = np.random.default_rng(7)
    x = rng.normal(size=(8, 3)) * [1, 2, 3] + [0, 1, -1]
    x[4:] += 2.0  # the halves differ, so per-replica statistics differ from global ones
    r = rng.normal(size=(8, 3))
    gamma = rng.normal(size=3)
    alone = bn64()
    alone.gamma.assign(gamma)
    y_ref, cache = alone.forward(x, training=True)
    dx_ref, grads_ref = alone.backward(cache, r)
    strategy = hd.MirroredStrategy(["/cpu:0", "/cpu:1"])
    with strategy.scope():
        layer = bn64(synchronized=synchronized)
        layer.gamma.assign(gamma)

    def step():
        i = hd.get_replica_context().replica_id_in_sync_group
        part = slice(4 * i, 4 * i + 4)
        y, c = layer.forward(x[part], training=True)
        dx, grads = layer.backward(c, r[part])
        return y, dx, grads

    out = strategy.run(step)
    grads = out[2]
    y = np.concatenate(strategy.experimental_local_results(out[0]))
    dx = np.concatenate(strategy.experimental_local_results(out[1]))
    summed = [sum(g.values) for g in grads]  # what the optimizer's allreduce does
    moving = layer.moving_mean.numpy()  # MEAN of the replicas' copies
    if synchronized:
        np.testing.assert_allclose(y, y_ref, rtol=1e-10, atol=1e-12)
        np.testing.assert_allclose(dx, dx_ref, rtol=1e-9, atol=1e-12)
        for s, g in zip(summed, grads_ref, strict=True):
            np.testing.assert_allclose(s, g, rtol=1e-10, atol=1e-12)
        np.testing.assert_allclose(moving, alone.moving_mean.numpy(), rtol=1e-10)
        for c in layer.moving_mean.values:  # every replica's copy is the global one
            np.testing.assert_allclose(c.numpy(), alone.moving_mean.numpy(), rtol=1e-10)
    else:
        halves = [x[:4], x[4:]]
        local = [(h - h.mean(0)) / np.sqrt(h.var(0) + 1e-3) * gamma for h in halves]
        np.testing.assert_allclose(y, np.concatenate(local), rtol=1e-10)
        assert not np.allclose(y, y_ref)
        np.testing.assert_allclose(moving, 0.01 * (x[:4].mean(0) + x[4:].mean(0)) / 2,
                                   rtol=1e-10)  # fmt: skip


# -- Embedding ---------------------------------------------------------------------------------


def test_embedding_lookup_gradient_and_shapes():
    rng = np.random.default_rng(8)
    layer = Embedding(5, 3, dtype="float64")
    layer._build((None, 4))
    table = layer.embeddings.numpy()
    assert table.shape == (5, 3) and np.all(np.abs(table) <= 0.05)  # Keras's "uniform"
    ids = np.array([[0, 4, 4, 1], [2, 2, 2, 0]])
    y, cache = layer.forward(ids)
    np.testing.assert_array_equal(y, table[ids])
    assert layer.compute_output_shape((None, 4)) == (None, 4, 3)
    r = rng.normal(size=(2, 4, 3))
    dx, (g,) = layer.backward(cache, r)
    expected = np.zeros((5, 3))
    for b in range(2):
        for t in range(4):
            expected[ids[b, t]] += r[b, t]
    np.testing.assert_allclose(g, expected)
    assert dx.shape == ids.shape and not dx.any()

    def f(w):
        layer.embeddings.assign(w)
        return float(np.sum(r * layer(ids)))

    np.testing.assert_allclose(g, numeric_grad(f, table.copy()), rtol=1e-6, atol=1e-9)
    np.testing.assert_array_equal(layer(ids.astype(np.float32)), layer(ids))  # float ids


def test_embedding_rejects_bad_ids():
    layer = Embedding(3, 2)
    layer._build((None, 2))
    with pytest.raises(ValueError, match=r"ids must be in \[0, 3\); got ids from 0 to 3"):
        layer(np.array([[0, 3]]))
    with pytest.raises(ValueError, match="non-integer ids"):
        layer(np.array([[0.5, 1.0]]))
    with pytest.raises(ValueError, match="input_dim"):
        Embedding(0, 2)


def test_embedding_model_trains():
    rng = np.random.default_rng(9)
    model = Sequential([Input((4,)), Embedding(10, 3, dtype="float64"), Flatten(dtype="float64"),
                        Dense(1, dtype="float64")])  # fmt: skip
    model.compile(optimizer=hd.optimizers.SGD(0.5), loss="mse")
    ids = rng.integers(0, 10, (32, 4))
    y = (ids[:, 0] % 2).astype(np.float64)
    history = model.fit(ids, y, batch_size=8, epochs=20, verbose=0, shuffle=False)
    assert history.history["loss"][-1] < 0.5 * history.history["loss"][0]


# -- regularizers ------------------------------------------------------------------------------


def test_regularizer_formulas_and_gradients():
    rng = np.random.default_rng(10)
    w = rng.normal(size=(3, 2))
    cases = [
        (regularizers.l1(0.1), 0.1 * np.abs(w).sum()),
        (regularizers.l2(0.2), 0.2 * np.square(w).sum()),
        (regularizers.l1_l2(0.1, 0.2), 0.1 * np.abs(w).sum() + 0.2 * np.square(w).sum()),
        (regularizers.get("l2"), 0.01 * np.square(w).sum()),
        (regularizers.get("l1_l2"), 0.01 * np.abs(w).sum() + 0.01 * np.square(w).sum()),
        (regularizers.L1L2(), 0.0),
    ]
    for reg, expected in cases:
        np.testing.assert_allclose(float(reg(w)), expected, rtol=1e-12)
        np.testing.assert_allclose(reg.gradient(w), numeric_grad(lambda v, r=reg: float(r(v)),
                                                                 w.copy()), atol=1e-8)  # fmt: skip
        twin = regularizers.get(regularizers.serialize(reg))
        assert type(twin) is type(reg) and twin.get_config() == reg.get_config()
    assert regularizers.get(None) is None
    with pytest.raises(ValueError, match="unknown regularizer"):
        regularizers.get("l3")
    with pytest.raises(ValueError, match=">= 0"):
        regularizers.L2(-1.0)


def test_regularizers_are_added_to_the_loss_and_gradients():
    """fit's loss is the data loss plus model.losses; one SGD step moves the weights by the
    data gradient plus the penalties' gradients (checked against the formulas)."""
    rng = np.random.default_rng(11)
    x, y = rng.normal(size=(6, 3)), rng.normal(size=(6, 2))
    model = Sequential([Dense(2, input_shape=(3,), kernel_regularizer=regularizers.l2(0.1),
                              bias_regularizer=regularizers.l1(0.3), dtype="float64")])  # fmt: skip
    model.compile(optimizer=hd.optimizers.SGD(0.1), loss="mse")
    k, b = model.get_layer("dense").kernel.numpy(), model.get_layer("dense").bias.numpy()
    b[:] = [0.5, -0.5]
    model.get_layer("dense").bias.assign(b)
    assert len(model.losses) == 2
    penalty = 0.1 * np.square(k).sum() + 0.3 * np.abs(b).sum()
    np.testing.assert_allclose(float(sum(model.losses)), penalty, rtol=1e-12)
    pred = x @ k + b
    data = np.mean((pred - y) ** 2)
    history = model.fit(x, y, batch_size=6, epochs=1, verbose=0, shuffle=False)
    np.testing.assert_allclose(history.history["loss"][0], data + penalty, rtol=1e-10)
    d = 2 * (pred - y) / pred.size
    new_k = k - 0.1 * (x.T @ d + 0.2 * k)
    new_b = b - 0.1 * (d.sum(0) + 0.3 * np.sign(b))
    np.testing.assert_allclose(model.get_layer("dense").kernel.numpy(), new_k, rtol=1e-10)
    np.testing.assert_allclose(model.get_layer("dense").bias.numpy(), new_b, rtol=1e-10)
    # evaluate adds the penalties too; value_and_grad gives the same loss and gradients
    loss_fn = hd.nn.losses.MeanSquaredError()
    loss, grads = hd.nn.value_and_grad(model, loss_fn)(x, y)
    k, b = new_k, new_b
    pred = x @ k + b
    penalty = 0.1 * np.square(k).sum() + 0.3 * np.abs(b).sum()
    np.testing.assert_allclose(float(loss), np.mean((pred - y) ** 2) + penalty, rtol=1e-10)
    np.testing.assert_allclose(model.evaluate(x, y, verbose=0), float(loss), rtol=1e-10)
    d = 2 * (pred - y) / pred.size
    np.testing.assert_allclose(grads[0], x.T @ d + 0.2 * k, rtol=1e-10)
    assert Dense.from_config(model.get_layer("dense").get_config()).kernel_regularizer.l2 == 0.1
