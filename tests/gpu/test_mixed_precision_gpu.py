"""Mixed precision on a GPU: "mixed_float16" layers compute in float16 on CuPy arrays.

Embedding + LayerNormalization + Dense + BatchNormalization with the same weights give on
the GPU what they give on the CPU (within float16's rounding), their gradients are float32
CuPy arrays, and fit with loss scaling trains. "mixed_bfloat16" on a GPU is a typed error
(CuPy has no bfloat16). Runs where a GPU exists; elsewhere every test skips with the reason
(tests/gpu/conftest.py).
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest

import hpcdist as hd
from hpcdist.arrays import array_module, to_host
from hpcdist.errors import ArrayInteropError
from hpcdist.nn import (
    BatchNormalization,
    Dense,
    Embedding,
    Flatten,
    Input,
    LayerNormalization,
    Sequential,
)
from hpcdist.nn import mixed_precision as mp


@pytest.fixture(autouse=True)
def _reset_policy() -> Iterator[None]:
    yield
    mp.set_global_policy(None)


def token_data(n: int = 512) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    ids = rng.integers(0, 40, (n, 6))
    weight = rng.standard_normal(40).astype(np.float32)
    return ids, weight[ids].sum(axis=1, keepdims=True) / 2.0


def token_model() -> Sequential:
    return Sequential([
        Input((6,)), Embedding(40, 8), LayerNormalization(), Dense(16, activation="relu"),
        Flatten(), BatchNormalization(), Dense(1),
    ])  # fmt: skip


def forward_backward(device: str, weights: list | None, ids: np.ndarray) -> tuple:
    """``(strategy, model, y, grads)`` of one forward and backward pass on ``device``."""
    strategy = hd.MirroredStrategy([device])
    with strategy.scope():
        hd.utils.set_random_seed(1)
        model = token_model()
        if weights is not None:
            model.set_weights(weights)

    def step():
        y, caches = model.forward(ids, training=True)
        dy = array_module(y).ones(y.shape, np.float32)
        return y, model.backward(caches, dy)

    y, grads = strategy.experimental_local_results(strategy.run(step))[0]
    return strategy, model, y, grads


def check_mixed_float16_against_the_cpu(device: str) -> Sequential:
    mp.set_global_policy("mixed_float16")
    ids, y = token_data()
    _, cpu_model, y_cpu, g_cpu = forward_backward("/cpu:0", None, ids[:64])
    strategy, model, y_dev, g_dev = forward_backward(device, cpu_model.get_weights(), ids[:64])
    assert y_dev.dtype == np.float16
    np.testing.assert_allclose(to_host(y_dev).astype(np.float32), y_cpu.astype(np.float32),
                               rtol=1e-2, atol=1e-2)  # fmt: skip
    for g, ref, v in zip(g_dev, g_cpu, model.trainable_variables, strict=True):
        assert g.dtype == np.float32, v.name
        scale = float(np.max(np.abs(ref))) or 1.0
        np.testing.assert_allclose(to_host(g), ref, rtol=2e-2, atol=2e-2 * scale, err_msg=v.name)
    with strategy.scope():
        opt = mp.LossScaleOptimizer(hd.optimizers.Adam(0.01), dynamic_growth_steps=4)
        model.compile(optimizer=opt, loss="mse")
    losses = model.fit(ids, y, epochs=6, batch_size=64, verbose=0, shuffle=False).history["loss"]
    assert losses[-1] < losses[0] / 4, losses
    return model


@pytest.mark.timeout(300)
def test_mixed_float16_on_a_gpu_matches_the_cpu_and_trains(cp) -> None:
    model = check_mixed_float16_against_the_cpu("/gpu:0")
    assert "cupy" in type(model.trainable_variables[0].values[0].raw_value()).__module__


def test_mixed_bfloat16_on_a_gpu_is_a_typed_error(cp) -> None:
    mp.set_global_policy("mixed_bfloat16")
    with pytest.raises(ArrayInteropError, match="CuPy has no bfloat16"):
        forward_backward("/gpu:0", None, np.zeros((2, 6), np.int64))
