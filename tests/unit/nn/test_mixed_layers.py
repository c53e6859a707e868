"""Mixed precision in every hpcdist.nn layer: 16-bit compute, float32 variables and gradients.

Each layer is built twice with the same weights, under a mixed policy and under "float32"
(the reference); forward outputs and backward gradients must agree within the 16-bit type's
rounding, come out in the right dtypes, and the variables' gradients must be float32.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import numpy as np
import pytest

import hpcdist as hd
from hpcdist.arrays import BFLOAT16
from hpcdist.nn import (
    Activation,
    BatchNormalization,
    Dense,
    Dropout,
    Embedding,
    Flatten,
    Input,
    Layer,
    LayerNormalization,
    Sequential,
)
from hpcdist.nn import mixed_precision as mp

#: policy -> (the compute dtype, a tolerance a few roundings of that type wide)
POLICIES = {"mixed_bfloat16": (BFLOAT16, 3e-2), "mixed_float16": (np.dtype(np.float16), 4e-3)}


@pytest.fixture(autouse=True)
def _reset_policy() -> Iterator[None]:
    yield
    mp.set_global_policy(None)


def _close(found: np.ndarray, expected: np.ndarray, tol: float) -> None:
    """Equal up to ``tol`` relative to the array's scale (16-bit rounding is relative)."""
    found = np.asarray(found, np.float32)
    scale = float(np.max(np.abs(expected))) or 1.0
    np.testing.assert_allclose(found, expected, rtol=tol, atol=tol * scale)


def _twins(make: Callable[[], Layer], policy: str, input_shape: tuple) -> tuple[Layer, Layer]:
    """``(mixed, reference)``: the layer under ``policy`` and under float32, equal weights."""
    mp.set_global_policy(policy)
    mixed = make()
    mixed._build(input_shape)
    mp.set_global_policy(None)
    ref = make()
    ref._build(input_shape)
    for a, b in zip(ref.weights, mixed.weights, strict=True):
        a.assign(b.numpy())
    return mixed, ref


def _check(
    make: Callable[[], Layer], policy: str, x: np.ndarray, training: bool = True,
    input_grad: bool = True,
) -> tuple[Layer, list]:  # fmt: skip
    """Forward and backward of the mixed layer against its float32 twin; its grads."""
    compute, tol = POLICIES[policy]
    mixed, ref = _twins(make, policy, (None, *x.shape[1:]))
    assert mixed.compute_dtype == compute.name and mixed.dtype == "float32"
    assert all(v.dtype == np.float32 for v in mixed.weights)  # the master weights
    # the reference sees the input as the mixed layer does after its autocast
    x_ref = x if x.dtype.kind in "iu" else x.astype(compute).astype(np.float32)
    y, cache = mixed.forward(x, training=training)
    y_ref, cache_ref = ref.forward(x_ref, training=training)
    assert y.dtype == compute, f"{type(mixed).__name__} returned {y.dtype}"
    _close(y, y_ref, tol)
    dy = np.random.default_rng(1).standard_normal(y.shape).astype(np.float32)
    dx, grads = mixed.backward(cache, dy)
    dx_ref, grads_ref = ref.backward(cache_ref, dy.astype(compute).astype(np.float32))
    assert dx.dtype == compute
    if input_grad:
        _close(dx, dx_ref, tol)
    assert len(grads) == len(mixed.trainable_weights) == len(grads_ref)
    for g, g_ref in zip(grads, grads_ref, strict=True):
        assert g.dtype == np.float32  # what the optimizer gets
        _close(g, g_ref, tol)
    return mixed, grads


def _x(*shape: int) -> np.ndarray:
    return np.random.default_rng(0).standard_normal(shape).astype(np.float32)


@pytest.mark.parametrize("policy", POLICIES)
def test_dense(policy: str) -> None:
    _check(lambda: Dense(5, activation="tanh"), policy, _x(6, 4))


@pytest.mark.parametrize("policy", POLICIES)
def test_embedding_gathers_16_bit_rows_and_scatters_float32_gradients(policy: str) -> None:
    ids = np.array([[0, 3, 3, 7], [7, 7, 1, 0]])
    layer, (g,) = _check(lambda: Embedding(8, 5, embeddings_initializer="normal"), policy, ids,
                         input_grad=False)  # fmt: skip
    compute = POLICIES[policy][0]
    y, _ = layer.forward(ids)
    # bitwise the rows of a 16-bit copy of the table
    np.testing.assert_array_equal(y, layer.embeddings.numpy().astype(compute)[ids])
    assert not g[[2, 4, 5, 6]].any()  # unused rows get nothing


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("name", ["relu", "tanh", "sigmoid", "gelu", "softmax", "elu", "swish"])
def test_activation(policy: str, name: str) -> None:
    _check(lambda: Activation(name), policy, _x(4, 6))


def test_softmax_computes_in_float32_inside() -> None:
    # over 5000 classes a bfloat16 sum of the exponentials is off by tens of percent;
    # computed in float32 inside, each probability is off by one final rounding at most
    mp.set_global_policy("mixed_bfloat16")
    logits = 2 * _x(4, 5000)
    y = Activation("softmax")(logits)
    assert y.dtype == BFLOAT16
    z = logits.astype(BFLOAT16).astype(np.float64)
    exact = np.exp(z - z.max(axis=-1, keepdims=True))
    exact /= exact.sum(axis=-1, keepdims=True)
    assert np.max(np.abs(y.astype(np.float64) - exact) / exact) <= 2.0**-8
    mp.set_global_policy("mixed_float16")
    # an explicit dtype wins (Keras's advice for the output layer): float32 out
    assert Activation("softmax", dtype="float32")(np.ones((1, 2), np.float16)).dtype == np.float32


@pytest.mark.parametrize("policy", POLICIES)
def test_dropout_mask_in_the_compute_dtype(policy: str) -> None:
    compute, _ = POLICIES[policy]
    _check(lambda: Dropout(0.25, seed=3), policy, _x(8, 16))
    mp.set_global_policy(policy)
    layer = Dropout(0.25, seed=3)
    y, mask = layer.forward(np.ones((64, 64), np.float32), training=True)
    assert mask.dtype == compute and y.dtype == compute
    kept = mask.astype(np.float32)
    assert set(np.unique(kept)) == {0.0, float(compute.type(1 / 0.75))}
    assert 0.65 < np.count_nonzero(kept) / kept.size < 0.85
    assert layer.forward(np.ones(3, np.float32))[0].dtype == compute  # inference: cast only


@pytest.mark.parametrize("policy", POLICIES)
def test_flatten(policy: str) -> None:
    _check(Flatten, policy, _x(3, 2, 4))


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("training", [True, False])
def test_batch_normalization_statistics_in_float32(policy: str, training: bool) -> None:
    # features far from zero with a small spread: 16-bit statistics would lose them
    x = 100.0 + _x(16, 3)
    layer, _ = _check(lambda: BatchNormalization(momentum=0.5), policy, x, training=training)
    if training:
        assert layer.moving_mean.dtype == np.float32
        _close(layer.moving_mean.numpy(), 0.5 * x.astype(np.float64).mean(axis=0), 1e-3)


@pytest.mark.parametrize("policy", POLICIES)
def test_layer_normalization_statistics_in_float32(policy: str) -> None:
    _check(lambda: LayerNormalization(gamma_initializer="random_normal"), policy, 50.0 + _x(4, 8))
    _check(lambda: LayerNormalization(axis=[1, 2]), policy, _x(4, 3, 5))


def test_input_layer_keeps_integer_ids_exact() -> None:
    # bfloat16 holds integers exactly only up to 256: ids must not go through it
    mp.set_global_policy("mixed_bfloat16")
    model = Sequential([Input((2,)), Embedding(1000, 2, embeddings_initializer="normal")])
    ids = np.array([[257, 999]])
    y = model(ids)
    expected = model.layers[0].embeddings.numpy().astype(BFLOAT16)[ids]
    np.testing.assert_array_equal(y, expected)


def test_bfloat16_computes_as_ml_dtypes_bfloat16_on_numpy() -> None:
    # (on CuPy it is a typed error: tests/gpu_contract/test_mixed_precision_contract.py,
    # which runs where the gpu extra is installed)
    assert mp.compute_array_dtype("bfloat16", np) == BFLOAT16
    assert mp.compute_array_dtype("float16", np) == np.float16


def _tokens(n: int = 512) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    ids = rng.integers(0, 40, (n, 6))
    weight = rng.standard_normal(40).astype(np.float32)
    return ids, weight[ids].sum(axis=1, keepdims=True) / 2.0


def mixed_token_model() -> Sequential:
    """Embedding + LayerNormalization + Dense + Dropout (the end-to-end model)."""
    return Sequential([
        Input((6,)),
        Embedding(40, 8),
        LayerNormalization(),
        Dense(16, activation="relu"),
        Dropout(0.1, seed=0),
        Flatten(),
        Dense(1),
    ])  # fmt: skip


def test_fit_under_mixed_bfloat16_trains_with_float32_gradients() -> None:
    mp.set_global_policy("mixed_bfloat16")
    hd.utils.set_random_seed(1)
    model = mixed_token_model()
    assert [layer.compute_dtype for layer in model.layers] == ["bfloat16"] * 6
    model.compile(optimizer=hd.optimizers.Adam(0.01), loss="mse")
    ids, y = _tokens()
    _, caches = model.forward(ids[:4], training=True)
    grads = model.backward(caches, np.ones((4, 1), np.float32))
    assert [g.dtype for g in grads] == [np.float32] * len(model.trainable_variables)
    history = model.fit(ids, y, epochs=8, batch_size=64, verbose=0, shuffle=False)
    losses = history.history["loss"]
    assert losses[-1] < losses[0] / 4, losses
    assert all(w.dtype == np.float32 for w in model.get_weights())
    assert model.predict(ids[:3], verbose=0).dtype == BFLOAT16  # the output layer's dtype
    assert np.isfinite(model.evaluate(ids, y, verbose=0))
    mp.set_global_policy(None)  # the same training in float32: the same descent
    hd.utils.set_random_seed(1)
    reference = mixed_token_model()
    reference.compile(optimizer=hd.optimizers.Adam(0.01), loss="mse")
    ref = reference.fit(ids, y, epochs=8, batch_size=64, verbose=0, shuffle=False)
    assert losses[-1] < 1.5 * ref.history["loss"][-1] + 0.01


def test_fit_under_mixed_float16_with_loss_scaling_and_batch_normalization() -> None:
    mp.set_global_policy("mixed_float16")
    hd.utils.set_random_seed(1)
    model = Sequential([
        Input((6,)), Embedding(40, 8), Flatten(), BatchNormalization(),
        Dense(16, activation="gelu"), Dense(1),
    ])  # fmt: skip
    opt = mp.LossScaleOptimizer(hd.optimizers.Adam(0.01), dynamic_growth_steps=4)
    model.compile(optimizer=opt, loss="mse")
    ids, y = _tokens()
    history = model.fit(ids, y, epochs=8, batch_size=64, verbose=0, shuffle=False)
    losses = history.history["loss"]
    assert losses[-1] < losses[0] / 4, losses
    assert opt.skipped_steps > 0  # 2**15 overflowed float16 gradients: skipped, then trained
    assert model.layers[2].moving_variance.dtype == np.float32


def test_a_saved_mixed_model_loads_with_its_policy(tmp_path) -> None:
    assert Dense(2, dtype="mixed_float16").dtype_policy == mp.Policy("mixed_float16")  # Keras
    assert Dense(2).dtype_policy == mp.Policy("float32")
    mp.set_global_policy("mixed_bfloat16")
    model = mixed_token_model()
    model.compile(optimizer=hd.optimizers.Adam(0.01), loss="mse")
    assert model.layers[1].get_config()["dtype"] == "mixed_bfloat16"
    mp.set_global_policy(None)  # loading does not need the global policy
    model.save(tmp_path / "m.keras")
    loaded = hd.nn.load_model(tmp_path / "m.keras")
    assert [layer.compute_dtype for layer in loaded.layers] == ["bfloat16"] * 6
    assert all(w.dtype == np.float32 for w in loaded.get_weights())
    ids, _ = _tokens(8)
    np.testing.assert_array_equal(loaded.predict(ids, verbose=0), model.predict(ids, verbose=0))
