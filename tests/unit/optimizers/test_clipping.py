"""Gradient clipping: clip_by_global_norm; clipnorm, global_clipnorm and clipvalue in optimizers."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import hpcdist as hd
from hpcdist.optimizers import SGD, Adam, clip_by_global_norm
from tests.unit.optimizers.test_optimizers import Reference


@settings(deadline=None, max_examples=25)
@given(
    sizes=st.lists(st.integers(0, 6), min_size=1, max_size=4),
    clip=st.floats(0.01, 20.0),
    seed=st.integers(0, 100),
)
def test_clip_by_global_norm_matches_the_tf_formula(sizes, clip, seed):
    rng = np.random.default_rng(seed)
    arrays = [rng.standard_normal(n) * 3 for n in sizes]
    before = [a.copy() for a in arrays]
    clipped, norm = clip_by_global_norm(arrays, clip)
    expected_norm = math.sqrt(sum(float(np.sum(a * a)) for a in arrays))
    assert math.isclose(norm, expected_norm, rel_tol=1e-12, abs_tol=1e-300)
    for c, a, b in zip(clipped, arrays, before, strict=True):
        np.testing.assert_allclose(c, a * clip / max(expected_norm, clip), rtol=1e-12)
        np.testing.assert_array_equal(a, b)  # inputs untouched
    if expected_norm > clip:
        total = math.sqrt(sum(float(np.sum(c * c)) for c in clipped))
        assert math.isclose(total, clip, rel_tol=1e-9)


def test_clip_by_global_norm_keeps_none_dtypes_and_gives_nan_for_inf():
    a = np.array([3.0, 0.0], np.float32)
    clipped, norm = clip_by_global_norm([a, None, np.array([[4.0]], np.float32)], 1.0)
    assert norm == 5.0 and clipped[1] is None
    assert clipped[0].dtype == np.float32 and clipped[2].shape == (1, 1)
    np.testing.assert_allclose(clipped[0], [0.6, 0.0], rtol=1e-6)
    clipped, norm = clip_by_global_norm([np.array([np.inf, 1.0])], 1.0)
    assert math.isinf(norm) and np.isnan(clipped[0]).all()
    with pytest.raises(ValueError, match="clip_norm must be >= 0"):
        clip_by_global_norm([a], -1.0)
    with pytest.raises(TypeError, match="list of arrays"):
        clip_by_global_norm(a, 1.0)


def _run(opt, ref, dtypes=(np.float64, np.float64, np.float32), steps=3, scale=4.0):
    rng = np.random.default_rng(11)
    shapes = [(3, 2), (4,), (5,)]
    init = [rng.standard_normal(s) for s in shapes]
    variables = [hd.Variable(x.astype(d)) for x, d in zip(init, dtypes, strict=True)]
    expected = [x.astype(d).astype(np.float64) for x, d in zip(init, dtypes, strict=True)]
    for _ in range(steps):
        grads = [(rng.standard_normal(s) * scale).astype(d)
                 for s, d in zip(shapes, dtypes, strict=True)]  # fmt: skip
        opt.apply_gradients(zip(grads, variables, strict=True))
        ref.step(expected, grads)
    for v, e, d in zip(variables, expected, dtypes, strict=True):
        tol = 2e-6 if d == np.float32 else 1e-12
        np.testing.assert_allclose(v.numpy(), e, rtol=tol, atol=tol)


def test_clipnorm_clips_each_gradient_by_its_own_norm():
    _run(SGD(0.1, clipnorm=1.5), Reference("sgd", 0.1, clipnorm=1.5))


def test_global_clipnorm_uses_the_norm_over_all_variables_and_dtypes():
    _run(Adam(0.1, global_clipnorm=2.0), Reference("adam", 0.1, global_clipnorm=2.0))


def test_global_clipnorm_leaves_small_gradients_alone():
    _run(SGD(0.1, global_clipnorm=1e6), Reference("sgd", 0.1), scale=1.0)


def test_clipvalue():
    _run(SGD(0.1, momentum=0.5, clipvalue=0.7),
         Reference("sgd", 0.1, momentum=0.5, clipvalue=0.7))  # fmt: skip


def test_clipping_does_not_change_the_callers_gradients():
    w = hd.Variable(np.zeros(3))
    g = np.array([10.0, -10.0, 0.5])
    SGD(1.0, clipvalue=1.0).apply_gradients([(g, w)])
    np.testing.assert_array_equal(g, [10.0, -10.0, 0.5])
    np.testing.assert_array_equal(w.numpy(), [-1.0, 1.0, -0.5])


def test_global_clipnorm_skips_missing_gradients():
    a, b = hd.Variable(np.zeros(1)), hd.Variable(np.zeros(1))
    with pytest.warns(UserWarning):
        SGD(1.0, global_clipnorm=1.0).apply_gradients([(np.array([3.0]), a), (None, b)])
    np.testing.assert_allclose(a.numpy(), [-1.0])
    np.testing.assert_array_equal(b.numpy(), [0.0])
