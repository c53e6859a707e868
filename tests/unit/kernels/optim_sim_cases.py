"""CUDA optimizer kernels under Numba's CUDA simulator, compared with the CPU kernels.

Not collected by the normal run: ``test_optim.py`` runs this file with pytest
in a subprocess whose environment sets ``NUMBA_ENABLE_CUDASIM=1`` before
``numba.cuda`` is imported. Sizes are small: every simulated GPU thread is a
Python thread.
"""

from __future__ import annotations

import numpy as np
import pytest
from numba import cuda

from hpcdist.kernels import optim as cpu
from hpcdist.kernels import optim_cuda as gpu
from hpcdist.kernels.cuda import simulator_enabled

N = 37  # more than the simulator's 2 x 16 threads: the grid-stride loop wraps


def setup_module() -> None:
    assert simulator_enabled(), "run with NUMBA_ENABLE_CUDASIM=1"


def _arrays(dtype, count, seed):
    rng = np.random.default_rng(seed)
    out = [rng.standard_normal(N).astype(dtype) for _ in range(count)]
    return out


def _positive(dtype, seed):
    return (np.random.default_rng(seed).random(N) + 0.5).astype(dtype)


def _compare(cpu_call, gpu_call, host_arrays, in_place, dtype):
    """Run the CPU and GPU kernels on copies of the same arrays; compare every array after."""
    cpu_arrays = [a.copy() for a in host_arrays]
    dev_arrays = [cuda.to_device(a) for a in host_arrays]
    if in_place:
        cpu_call(cpu_arrays[0], cpu_arrays[0], *cpu_arrays[1:])
        gpu_call(dev_arrays[0], dev_arrays[0], *dev_arrays[1:])
        cpu_out, gpu_out = cpu_arrays[0], dev_arrays[0].copy_to_host()
    else:
        cpu_out = np.zeros_like(host_arrays[0])
        dev_out = cuda.to_device(np.zeros_like(host_arrays[0]))
        cpu_call(cpu_arrays[0], cpu_out, *cpu_arrays[1:])
        gpu_call(dev_arrays[0], dev_out, *dev_arrays[1:])
        gpu_out = dev_out.copy_to_host()
        np.testing.assert_array_equal(dev_arrays[0].copy_to_host(), host_arrays[0])
    tol = {"rtol": 1e-6, "atol": 1e-6} if dtype == np.float32 else {"rtol": 1e-14, "atol": 1e-14}
    assert gpu_out.dtype == dtype
    np.testing.assert_allclose(gpu_out, cpu_out, **tol)
    for c, d in zip(cpu_arrays[1:], dev_arrays[1:], strict=True):
        if d.shape[0]:
            np.testing.assert_allclose(d.copy_to_host(), c, **tol)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("in_place", [True, False])
def test_sgd_and_momentum(dtype, in_place):
    p, g, vel = _arrays(dtype, 3, seed=1)
    hyper = np.array([0.1, 0.01], dtype)
    _compare(lambda a, b, g: cpu.sgd(a, b, g, hyper),
             lambda a, b, g: gpu.sgd(a, b, g, hyper), [p, g], in_place, dtype)  # fmt: skip
    for nesterov in (False, True):
        h = np.array([0.1, 0.9, 0.01], dtype)
        _compare(lambda a, b, g, v, n=nesterov, h=h: cpu.momentum(a, b, g, v, h, n),
                 lambda a, b, g, v, n=nesterov, h=h: gpu.momentum(a, b, g, v, h, n),
                 [p, g, vel], in_place, dtype)  # fmt: skip


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("in_place", [True, False])
@pytest.mark.parametrize("amsgrad", [False, True])
def test_adam(dtype, in_place, amsgrad):
    p, g, m = _arrays(dtype, 3, seed=2)
    v, vhat = _positive(dtype, 3) * dtype(0.5), _positive(dtype, 4)
    vhat = vhat if amsgrad else np.empty(0, dtype)
    hyper = np.array([0.01, 0.9, 0.999, 1e-7, 0.001], dtype)
    _compare(lambda a, b, *s: cpu.adam(a, b, *s, hyper),
             lambda a, b, *s: gpu.adam(a, b, *s, hyper),
             [p, g, m, v, vhat], in_place, dtype)  # fmt: skip


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("in_place", [True, False])
@pytest.mark.parametrize("centered", [False, True])
@pytest.mark.parametrize("with_momentum", [False, True])
def test_rmsprop(dtype, in_place, centered, with_momentum):
    p, g, mom = _arrays(dtype, 3, seed=5)
    vel, avg = _positive(dtype, 6), _positive(dtype, 7) * dtype(0.1)
    avg = avg if centered else np.empty(0, dtype)
    mom = mom if with_momentum else np.empty(0, dtype)
    hyper = np.array([0.01, 0.9, 0.8, 1e-7, 0.01], dtype)
    _compare(lambda a, b, *s: cpu.rmsprop(a, b, *s, hyper),
             lambda a, b, *s: gpu.rmsprop(a, b, *s, hyper),
             [p, g, vel, avg, mom], in_place, dtype)  # fmt: skip


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("in_place", [True, False])
def test_adagrad(dtype, in_place):
    p, g = _arrays(dtype, 2, seed=9)
    acc = _positive(dtype, 10)
    hyper = np.array([0.05, 1e-7, 0.01], dtype)
    _compare(lambda a, b, *s: cpu.adagrad(a, b, *s, hyper),
             lambda a, b, *s: gpu.adagrad(a, b, *s, hyper),
             [p, g, acc], in_place, dtype)  # fmt: skip


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("in_place", [True, False])
def test_nadam(dtype, in_place):
    p, g, m = _arrays(dtype, 3, seed=11)
    v = _positive(dtype, 12)
    hyper = np.array([0.01, 0.9, 0.999, 1e-7, 0.6, 1.1, 1.3, 0.001], dtype)
    _compare(lambda a, b, *s: cpu.nadam(a, b, *s, hyper),
             lambda a, b, *s: gpu.nadam(a, b, *s, hyper),
             [p, g, m, v], in_place, dtype)  # fmt: skip


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_clipping_helpers(dtype):
    (g,) = _arrays(dtype, 1, seed=8)
    g = g * dtype(3)
    d = cuda.to_device(g)
    assert np.isclose(gpu.sum_squares(d), cpu.sum_squares(g), rtol=1e-12)
    gpu.clip_values(d, 1.5)
    np.testing.assert_array_equal(d.copy_to_host(), np.clip(g, -dtype(1.5), dtype(1.5)))
    gpu.scale(d, 0.5)
    np.testing.assert_array_equal(
        d.copy_to_host(), np.clip(g, -dtype(1.5), dtype(1.5)) * dtype(0.5)
    )
    assert gpu.sum_squares(cuda.to_device(np.zeros(0, dtype))) == 0.0


def test_errors():
    p = cuda.to_device(np.ones(4, np.float32))
    with pytest.raises(TypeError, match="expected a device array"):
        gpu.sgd(np.ones(4, np.float32), p, p, [0.1, 0.0])
    with pytest.raises(TypeError, match="g is float64 but p_in is float32"):
        gpu.sgd(p, p, cuda.to_device(np.ones(4)), [0.1, 0.0])
    with pytest.raises(ValueError, match="g has 3 elements"):
        gpu.sgd(p, p, cuda.to_device(np.ones(3, np.float32)), [0.1, 0.0])
    with pytest.raises(TypeError, match="int32; expected float32 or float64"):
        i = cuda.to_device(np.ones(4, np.int32))
        gpu.sgd(i, i, i, [0.1, 0.0])
    with pytest.raises(ValueError, match=r"expected 5 host values"):
        gpu.adam(p, p, p, p, p, None, [0.1, 0.9])
