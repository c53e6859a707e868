"""The fused optimizer kernels against NumPy reference formulas (float32 and float64)."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hpcdist.kernels import optim
from tests.unit.kernels.simulator import imports_numba_cuda, run_cases_under_simulator

HERE = Path(__file__).parent
DTYPES = [np.float32, np.float64]
N = 53


def _data(dtype, seed=0, n=N):
    rng = np.random.default_rng(seed)
    p = rng.standard_normal(n).astype(dtype)
    g = rng.standard_normal(n).astype(dtype)
    s1 = rng.standard_normal(n).astype(dtype)
    s2 = rng.random(n).astype(dtype) + dtype(0.5)
    s3 = rng.random(n).astype(dtype) + dtype(0.25)
    return p, g, s1, s2, s3


def _tol(dtype):
    return {"rtol": 2e-6, "atol": 2e-6} if dtype == np.float32 else {"rtol": 1e-13, "atol": 1e-13}


def _run(update, p, in_place):
    """Call ``update(p_in, p_out)`` in place or out of place; returns the new parameters."""
    if in_place:
        update(p, p)
        return p
    before = p.copy()
    out = np.full_like(p, np.nan)
    update(p, out)
    np.testing.assert_array_equal(p, before)  # p_in untouched out of place
    return out


# -- NumPy references (the Keras formulas, computed in the array dtype) --------------------


def ref_decay(p, lr, wd):
    return p - p * (p.dtype.type(lr) * p.dtype.type(wd)) if wd else p


def ref_sgd(p, g, lr, wd):
    t = p.dtype.type
    return ref_decay(p, lr, wd) - g * t(lr)


def ref_momentum(p, g, vel, lr, mom, wd, nesterov):
    t = p.dtype.type
    p = ref_decay(p, lr, wd)
    vel = vel * t(mom) - g * t(lr)
    if nesterov:
        return p + (vel * t(mom) - g * t(lr)), vel
    return p + vel, vel


def ref_adam(p, g, m, v, vhat, lr_t, b1, b2, eps, lr_wd):
    t = p.dtype.type
    if lr_wd:
        p = p - p * t(lr_wd)
    m = m + (g - m) * (t(1) - t(b1))
    v = v + (g * g - v) * (t(1) - t(b2))
    denom_v = v
    if vhat is not None:
        vhat = np.maximum(vhat, v)
        denom_v = vhat
    return p - (m * t(lr_t)) / (np.sqrt(denom_v) + t(eps)), m, v, vhat


def ref_rmsprop(p, g, vel, avg, mom, lr, rho, momentum, eps, wd):
    t = p.dtype.type
    p = ref_decay(p, lr, wd)
    vel = t(rho) * vel + (t(1) - t(rho)) * (g * g)
    if avg is not None:
        avg = t(rho) * avg + (t(1) - t(rho)) * g
        denom = vel - avg * avg + t(eps)
    else:
        denom = vel + t(eps)
    inc = t(lr) * g / np.sqrt(denom)
    if mom is not None:
        mom = t(momentum) * mom + inc
        return p - mom, vel, avg, mom
    return p - inc, vel, avg, mom


def ref_adagrad(p, g, acc, lr, eps, wd):
    t = p.dtype.type
    p = ref_decay(p, lr, wd)
    acc = acc + g * g
    return p - t(lr) * g / np.sqrt(acc + t(eps)), acc


def ref_nadam(p, g, m, v, lr, b1, b2, eps, c_m, c_g, c_v, lr_wd):
    t = p.dtype.type
    if lr_wd:
        p = p - p * t(lr_wd)
    m = m + (g - m) * (t(1) - t(b1))
    v = v + (g * g - v) * (t(1) - t(b2))
    m_hat = m * t(c_m) + g * t(c_g)
    return p - (m_hat * t(lr)) / (np.sqrt(v * t(c_v)) + t(eps)), m, v


# -- updates -------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("in_place", [True, False])
@pytest.mark.parametrize("wd", [0.0, 0.05])
def test_sgd(dtype, in_place, wd):
    p, g, *_ = _data(dtype)
    expected = ref_sgd(p.copy(), g, 0.1, wd)
    got = _run(lambda a, b: optim.sgd(a, b, g, np.array([0.1, wd], dtype)), p, in_place)
    assert got.dtype == dtype
    np.testing.assert_allclose(got, expected, **_tol(dtype))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("in_place", [True, False])
@pytest.mark.parametrize("nesterov", [False, True])
@pytest.mark.parametrize("wd", [0.0, 0.01])
def test_momentum(dtype, in_place, nesterov, wd):
    p, g, vel, *_ = _data(dtype, seed=1)
    exp_p, exp_vel = ref_momentum(p.copy(), g, vel.copy(), 0.05, 0.9, wd, nesterov)
    hyper = np.array([0.05, 0.9, wd], dtype)
    got = _run(lambda a, b: optim.momentum(a, b, g, vel, hyper, nesterov), p, in_place)
    np.testing.assert_allclose(got, exp_p, **_tol(dtype))
    np.testing.assert_allclose(vel, exp_vel, **_tol(dtype))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("in_place", [True, False])
@pytest.mark.parametrize("amsgrad", [False, True])
@pytest.mark.parametrize("lr_wd", [0.0, 0.002])
def test_adam(dtype, in_place, amsgrad, lr_wd):
    p, g, m, v, vhat = _data(dtype, seed=2)
    v = v * dtype(0.5)  # some vhat entries above v, some below
    vhat_arg = vhat.copy() if amsgrad else np.empty(0, dtype)
    exp = ref_adam(p.copy(), g, m.copy(), v.copy(), vhat.copy() if amsgrad else None,
                   0.01, 0.9, 0.999, 1e-7, lr_wd)  # fmt: skip
    hyper = np.array([0.01, 0.9, 0.999, 1e-7, lr_wd], dtype)
    got = _run(lambda a, b: optim.adam(a, b, g, m, v, vhat_arg, hyper), p, in_place)
    np.testing.assert_allclose(got, exp[0], **_tol(dtype))
    np.testing.assert_allclose(m, exp[1], **_tol(dtype))
    np.testing.assert_allclose(v, exp[2], **_tol(dtype))
    if amsgrad:
        np.testing.assert_allclose(vhat_arg, exp[3], **_tol(dtype))
        assert (vhat_arg >= v).all() and (vhat_arg > v).any()


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("in_place", [True, False])
@pytest.mark.parametrize("centered", [False, True])
@pytest.mark.parametrize("with_momentum", [False, True])
def test_rmsprop(dtype, in_place, centered, with_momentum):
    p, g, mom, vel, avg = _data(dtype, seed=3)
    avg = avg * dtype(0.1)  # keep vel - avg^2 positive
    wd = 0.01 if centered else 0.0
    exp = ref_rmsprop(p.copy(), g, vel.copy(), avg.copy() if centered else None,
                      mom.copy() if with_momentum else None, 0.01, 0.9, 0.8, 1e-7, wd)  # fmt: skip
    avg_arg = avg if centered else None
    mom_arg = mom if with_momentum else np.empty(0, dtype)
    hyper = np.array([0.01, 0.9, 0.8, 1e-7, wd], dtype)
    got = _run(lambda a, b: optim.rmsprop(a, b, g, vel, avg_arg, mom_arg, hyper), p, in_place)
    np.testing.assert_allclose(got, exp[0], **_tol(dtype))
    np.testing.assert_allclose(vel, exp[1], **_tol(dtype))
    if centered:
        np.testing.assert_allclose(avg, exp[2], **_tol(dtype))
    if with_momentum:
        np.testing.assert_allclose(mom, exp[3], **_tol(dtype))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("in_place", [True, False])
@pytest.mark.parametrize("wd", [0.0, 0.02])
def test_adagrad(dtype, in_place, wd):
    p, g, _, acc, _ = _data(dtype, seed=4)
    exp_p, exp_acc = ref_adagrad(p.copy(), g, acc.copy(), 0.05, 1e-7, wd)
    hyper = np.array([0.05, 1e-7, wd], dtype)
    got = _run(lambda a, b: optim.adagrad(a, b, g, acc, hyper), p, in_place)
    np.testing.assert_allclose(got, exp_p, **_tol(dtype))
    np.testing.assert_allclose(acc, exp_acc, **_tol(dtype))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("in_place", [True, False])
@pytest.mark.parametrize("lr_wd", [0.0, 0.002])
def test_nadam(dtype, in_place, lr_wd):
    p, g, m, v, _ = _data(dtype, seed=5)
    consts = (0.01, 0.9, 0.999, 1e-7, 0.6, 1.1, 1.3, lr_wd)
    exp = ref_nadam(p.copy(), g, m.copy(), v.copy(), *consts)
    got = _run(lambda a, b: optim.nadam(a, b, g, m, v, np.array(consts, dtype)), p, in_place)
    np.testing.assert_allclose(got, exp[0], **_tol(dtype))
    np.testing.assert_allclose(m, exp[1], **_tol(dtype))
    np.testing.assert_allclose(v, exp[2], **_tol(dtype))


def test_arithmetic_happens_in_the_parameter_dtype():
    # lr = 0.1 is not exact in float32: a float64 computation rounded once would differ
    p = np.array([1.0, 3.0, 7.0], np.float32)
    g = np.array([1.0, 1.0, 1.0], np.float32)
    optim.sgd(p, p, g, np.array([0.1, 0.0], np.float32))
    expected = np.array([1.0, 3.0, 7.0], np.float32) - np.float32(0.1) * g
    np.testing.assert_array_equal(p, expected)


def test_zero_weight_decay_leaves_infinite_parameters_alone():
    p = np.array([np.inf, 1.0], np.float64)
    optim.sgd(p, p, np.zeros(2), np.array([0.1, 0.0]))
    assert p[0] == np.inf and p[1] == 1.0


# -- clipping helpers ------------------------------------------------------------------------


@settings(deadline=None, max_examples=25)
@given(
    dtype=st.sampled_from(DTYPES),
    values=st.lists(st.floats(-1e3, 1e3, allow_nan=False, width=32), min_size=0, max_size=40),
    c=st.floats(0.0, 50.0, width=32),
)
def test_clip_helpers_match_numpy(dtype, values, c):
    g = np.array(values, dtype)
    assert math.isclose(optim.sum_squares(g), float(np.sum(g.astype(np.float64) ** 2)),
                        rel_tol=1e-12, abs_tol=1e-12)  # fmt: skip
    clipped = g.copy()
    optim.clip_values(clipped, c)
    np.testing.assert_array_equal(clipped, np.clip(g, -dtype(c), dtype(c)))
    scaled = g.copy()
    optim.scale(scaled, c)
    np.testing.assert_array_equal(scaled, g * dtype(c))


def test_clip_values_keeps_nan():
    g = np.array([np.nan, 5.0, -5.0])
    optim.clip_values(g, 1.0)
    assert np.isnan(g[0]) and g[1] == 1.0 and g[2] == -1.0


# -- argument errors -----------------------------------------------------------------------------


def test_errors_say_what_was_expected():
    p = np.ones(4, np.float32)
    with pytest.raises(TypeError, match="float16; expected float32 or float64"):
        optim.sgd(p.astype(np.float16), p.astype(np.float16), p.astype(np.float16), [0.1, 0])
    with pytest.raises(TypeError, match="g is float64 but p_in is float32"):
        optim.sgd(p, p, np.ones(4), [0.1, 0])
    with pytest.raises(ValueError, match="g has 3 elements but p_in has 4"):
        optim.sgd(p, p, np.ones(3, np.float32), [0.1, 0])
    with pytest.raises(TypeError, match="expected a 1-D C-contiguous NumPy array"):
        optim.sgd(np.ones((2, 2), np.float32), p, p, [0.1, 0])
    with pytest.raises(TypeError, match="non-contiguous"):
        optim.sgd(np.ones(8, np.float32)[::2], p, p, [0.1, 0])
    with pytest.raises(ValueError, match=r"expected 2 values \[lr, wd\]"):
        optim.sgd(p, p.copy(), p, [0.1])
    with pytest.raises(ValueError, match="vhat has 2 elements"):
        optim.adam(p, p, p, p.copy(), p.copy(), np.ones(2, np.float32), [1, 0.9, 0.9, 1e-7, 0])
    with pytest.raises(ValueError, match="overlap"):
        buf = np.ones(5, np.float32)
        optim.sgd(buf[:4], buf[1:], p, [0.1, 0])
    with pytest.raises(ValueError, match="non-negative clip value"):
        optim.clip_values(p, -1.0)


# -- CUDA kernels under the simulator --------------------------------------------------------


def test_cuda_kernels_match_the_cpu_kernels_under_the_simulator():
    run_cases_under_simulator(HERE / "optim_sim_cases.py")


def test_importing_the_cpu_optimizer_kernels_does_not_import_numba_cuda():
    assert not imports_numba_cuda("hpcdist.optimizers")
