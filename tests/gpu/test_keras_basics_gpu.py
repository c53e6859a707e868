"""The Keras basics on GPUs give what they give on the CPU (float32, same weights, same data).

BatchNormalization (synchronized), LayerNormalization, leaky_relu, an l2 regularizer and
Nadam on the digits MLP; Embedding with Adagrad (its backward pass scatter-adds on the GPU);
model.save of a GPU model loaded on the CPU. Runs where a GPU exists; elsewhere every test
skips with the reason (tests/gpu/conftest.py).
"""

from __future__ import annotations

import numpy as np
import pytest
from sklearn.datasets import load_digits

import hpcdist as hd
from hpcdist.nn import (
    Activation,
    BatchNormalization,
    Dense,
    Embedding,
    Flatten,
    Input,
    LayerNormalization,
    Sequential,
    load_model,
    regularizers,
)
from hpcdist.nn.losses import SparseCategoricalCrossentropy
from hpcdist.nn.metrics import SparseTopKCategoricalAccuracy


def digits() -> tuple[np.ndarray, np.ndarray]:
    d = load_digits()
    return (d.data / 16.0).astype(np.float32), d.target.astype(np.int64)


def normalized_mlp() -> Sequential:
    return Sequential([
        Dense(64, input_shape=(64,), kernel_regularizer=regularizers.l2(1e-4)),
        BatchNormalization(synchronized=True),
        Activation("leaky_relu"),
        LayerNormalization(),
        Dense(10),
    ])  # fmt: skip


def embedding_model() -> Sequential:
    return Sequential([Input((8,)), Embedding(100, 16), Flatten(), Dense(1)])


def fit_on(devices, build, compile_args, weights, x, y):
    strategy = hd.MirroredStrategy(devices)
    with strategy.scope():
        model = build()
        if weights is not None:
            model.set_weights(weights)
        model.compile(**compile_args())
    start = model.get_weights()
    history = model.fit(x, y, batch_size=64, epochs=2, shuffle=False, verbose=0)
    return start, model, history.history


def mlp_compile():
    return {"optimizer": hd.optimizers.Nadam(0.01),
            "loss": SparseCategoricalCrossentropy(from_logits=True),
            "metrics": ["accuracy", SparseTopKCategoricalAccuracy(k=3)]}  # fmt: skip


def embedding_compile():
    return {"optimizer": hd.optimizers.Adagrad(0.1), "loss": "huber"}


def compare(cpu_devices, gpu_devices, build, compile_args, x, y):
    np.random.seed(0)
    start, cpu_model, cpu_history = fit_on(cpu_devices, build, compile_args, None, x, y)
    _, gpu_model, gpu_history = fit_on(gpu_devices, build, compile_args, start, x, y)
    for key in cpu_history:
        np.testing.assert_allclose(gpu_history[key], cpu_history[key], rtol=1e-3, atol=2e-3,
                                   err_msg=key)  # fmt: skip
    for a, b, v in zip(gpu_model.get_weights(), cpu_model.get_weights(), cpu_model.weights,
                       strict=True):  # fmt: skip
        np.testing.assert_allclose(a, b, rtol=1e-3, atol=1e-3, err_msg=v.name)
    return cpu_model, gpu_model


@pytest.mark.timeout(300)
@pytest.mark.parametrize("replicas", [1, 2])
def test_normalized_mlp_on_gpus_matches_the_cpu(cp, gpus, replicas):
    if replicas > gpus:
        pytest.skip(f"needs {replicas} GPUs, this process sees {gpus}")
    x, y = digits()
    compare([f"/cpu:{i}" for i in range(replicas)], [f"/gpu:{i}" for i in range(replicas)],
            normalized_mlp, mlp_compile, x, y)  # fmt: skip


@pytest.mark.timeout(300)
def test_embedding_with_adagrad_on_a_gpu_matches_the_cpu_and_saves(cp, tmp_path):
    rng = np.random.default_rng(0)
    ids = rng.integers(0, 100, (256, 8))
    y = (ids[:, 0] % 3 == 0).astype(np.float32)
    _, gpu_model = compare(["/cpu:0"], ["/gpu:0"], embedding_model, embedding_compile, ids, y)
    assert "cupy" in type(gpu_model.trainable_variables[0].values[0].raw_value()).__module__
    gpu_model.save(tmp_path / "m.keras")
    on_cpu = load_model(tmp_path / "m.keras")
    np.testing.assert_allclose(on_cpu.predict(ids), cp.asnumpy(gpu_model.predict(ids)),
                               rtol=1e-5, atol=1e-6)  # fmt: skip
