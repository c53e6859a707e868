"""Training on GPUs gives what training on the CPU gives (float32, same weights, same data).

* ``Sequential.fit`` of the digits MLP under ``MirroredStrategy`` on GPUs
  against the same fit on as many logical CPU devices (same split of each
  batch, same initial weights, no shuffling). The GPU run differs only in
  rounding (cuBLAS, and NCCL's summation order with several GPUs), so the
  losses and weights agree to float32 tolerance.
* The optimizers' fused updates (SGD with Nesterov momentum, Adam) on CuPy
  variables against the NumPy path, step by step, in a cross-replica context
  and (with two GPUs) inside ``strategy.run``.
"""

from __future__ import annotations

import numpy as np
import pytest
from sklearn.datasets import load_digits

import hpcdist as hd
from hpcdist.collectives.nccl import nccl_available
from hpcdist.distribute.values import PerReplica
from hpcdist.nn import Dense, Sequential
from hpcdist.nn.losses import SparseCategoricalCrossentropy
from tests.gpu.conftest import gpu_status


def _gpu_count() -> int:
    if not gpu_status()[0]:
        return 0
    import cupy

    return int(cupy.cuda.runtime.getDeviceCount())


two_gpus = pytest.mark.skipif(_gpu_count() < 2, reason="needs 2 or more GPUs")


def digits() -> tuple[np.ndarray, np.ndarray]:
    d = load_digits()
    return (d.data / 16.0).astype(np.float32), d.target.astype(np.int64)


def mlp() -> Sequential:
    return Sequential(
        [
            Dense(128, activation="relu", input_shape=(64,)),
            Dense(64, activation="relu"),
            Dense(10),
        ]
    )


def fit_on(devices: list[str], weights: list[np.ndarray] | None, x, y):
    strategy = hd.MirroredStrategy(devices)
    with strategy.scope():
        model = mlp()
        if weights is not None:
            model.set_weights(weights)
        model.compile(
            optimizer=hd.optimizers.SGD(learning_rate=0.05, momentum=0.9),
            loss=SparseCategoricalCrossentropy(from_logits=True),
            metrics=["accuracy"],
        )
    start = model.get_weights()
    history = model.fit(x, y, batch_size=64, epochs=2, shuffle=False, verbose=0)
    return start, model.get_weights(), history.history


@pytest.mark.timeout(300)
@pytest.mark.parametrize("replicas", [1, 2])
def test_fit_on_gpus_matches_fit_on_cpus(cp, gpus, replicas):
    if replicas > gpus:
        pytest.skip(f"needs {replicas} GPUs, this process sees {gpus}")
    x, y = digits()
    np.random.seed(0)
    start, cpu_weights, cpu_history = fit_on([f"/cpu:{i}" for i in range(replicas)], None, x, y)
    _, gpu_weights, gpu_history = fit_on([f"/gpu:{i}" for i in range(replicas)], start, x, y)
    assert len(gpu_history["loss"]) == 2
    np.testing.assert_allclose(gpu_history["loss"], cpu_history["loss"], rtol=1e-4)
    np.testing.assert_allclose(gpu_history["accuracy"], cpu_history["accuracy"], atol=2e-3)
    assert cpu_history["loss"][1] < cpu_history["loss"][0]  # it did train
    for g, c in zip(gpu_weights, cpu_weights, strict=True):
        assert g.dtype == np.float32
        np.testing.assert_allclose(g, c, rtol=1e-3, atol=1e-4)


def optimizers() -> list:
    return [
        pytest.param(lambda: hd.optimizers.SGD(0.1, momentum=0.9, nesterov=True), id="sgd"),
        pytest.param(lambda: hd.optimizers.Adam(0.01), id="adam"),
    ]


def problem(seed: int = 4) -> tuple[list[np.ndarray], list[list[np.ndarray]]]:
    rng = np.random.default_rng(seed)
    start = [rng.normal(size=(37, 5)).astype(np.float32), rng.normal(size=5).astype(np.float32)]
    grads = [[rng.normal(size=w.shape).astype(np.float32) for w in start] for _ in range(6)]
    return start, grads


@pytest.mark.parametrize("make", optimizers())
def test_optimizer_updates_on_cupy_variables_match_numpy(cp, make):
    start, grads = problem()
    finals = {}
    for kind, device, to in (("numpy", "/cpu:0", np.asarray), ("cupy", "/gpu:0", cp.asarray)):
        strategy = hd.MirroredStrategy([device])
        with strategy.scope():
            variables = [hd.Variable(w) for w in start]
            opt = make()
            for step in grads:
                opt.apply_gradients(zip([to(g) for g in step], variables, strict=True))
            if kind == "cupy":
                for v in variables:
                    assert isinstance(v.values[0].raw_value(), cp.ndarray)
            finals[kind] = [v.numpy() for v in variables]
    for g, c in zip(finals["cupy"], finals["numpy"], strict=True):
        np.testing.assert_allclose(g, c, rtol=1e-5, atol=1e-6)


@two_gpus
@pytest.mark.parametrize("make", optimizers())
def test_optimizer_in_replicas_on_two_gpus_matches_two_cpu_replicas(cp, make):
    start, grads = problem(seed=5)
    finals = {}
    for kind, devices in (("cpu", ["/cpu:0", "/cpu:1"]), ("gpu", ["/gpu:0", "/gpu:1"])):
        strategy = hd.MirroredStrategy(devices)
        with strategy.scope():
            variables = [hd.Variable(w) for w in start]
            opt = make()

        def step(*gs, opt=opt, variables=variables):
            opt.apply_gradients(zip(gs, variables, strict=True))

        for g in grads:
            # replica i gets (i + 1) * g: the summed gradient is 3 * g
            per_replica = []
            for w in g:
                if kind == "gpu":
                    parts = []
                    for i in range(2):
                        with cp.cuda.Device(i):
                            parts.append(cp.asarray(w * (i + 1)))
                    per_replica.append(PerReplica(tuple(parts)))
                else:
                    per_replica.append(PerReplica((w * 1, w * 2)))
            strategy.run(step, args=tuple(per_replica))
        if kind == "gpu" and nccl_available()[0]:  # the gradient sum ran on the GPUs (NCCL)
            assert strategy.extended._cross_device_ops.last_route == "nccl"
        finals[kind] = [[to_host(c) for c in v.values] for v in variables]
    for gpu_copies, cpu_copies in zip(finals["gpu"], finals["cpu"], strict=True):
        for g, c in zip(gpu_copies, cpu_copies, strict=True):
            np.testing.assert_allclose(g, c, rtol=1e-5, atol=1e-6)
        np.testing.assert_array_equal(gpu_copies[0], gpu_copies[1])  # mirrored stays mirrored


def to_host(component) -> np.ndarray:
    from hpcdist.arrays import to_host as host

    return np.asarray(host(component.raw_value()))
