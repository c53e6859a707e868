"""Learning-rate schedules against their closed forms."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import hpcdist as hd
from hpcdist.optimizers import schedules
from hpcdist.optimizers.schedules import (
    Constant,
    CosineDecay,
    ExponentialDecay,
    LinearWarmup,
    PiecewiseConstantDecay,
)


@settings(deadline=None, max_examples=30)
@given(step=st.integers(0, 500), staircase=st.booleans())
def test_exponential_decay(step, staircase):
    s = ExponentialDecay(0.2, decay_steps=30, decay_rate=0.7, staircase=staircase)
    p = step // 30 if staircase else step / 30
    assert math.isclose(s(step), 0.2 * 0.7**p, rel_tol=1e-12)


def test_exponential_decay_accepts_arrays_and_variables_as_steps():
    s = ExponentialDecay(1.0, 2, 0.5)
    assert s(np.int64(4)) == 0.25 and s(np.array(2)) == 0.5
    assert s(hd.Variable(np.int64(2))) == 0.5


@settings(deadline=None, max_examples=30)
@given(step=st.integers(0, 300), alpha=st.sampled_from([0.0, 0.1]))
def test_cosine_decay_without_warmup(step, alpha):
    s = CosineDecay(0.5, decay_steps=100, alpha=alpha)
    frac = min(step, 100) / 100
    expected = 0.5 * ((1 - alpha) * 0.5 * (1 + math.cos(math.pi * frac)) + alpha)
    assert math.isclose(s(step), expected, rel_tol=1e-12, abs_tol=1e-15)


def test_cosine_decay_with_warmup():
    s = CosineDecay(0.01, decay_steps=100, alpha=0.1, warmup_target=0.1, warmup_steps=10)
    assert s(0) == 0.01
    assert math.isclose(s(5), 0.01 + (0.1 - 0.01) * 0.5)
    assert math.isclose(s(10), 0.1)  # the warm-up target, start of the decay
    assert math.isclose(s(60), 0.1 * (0.9 * 0.5 * (1 + math.cos(math.pi * 0.5)) + 0.1))
    assert math.isclose(s(110), 0.1 * 0.1) and math.isclose(s(1000), 0.1 * 0.1)


def test_linear_warmup():
    after = ExponentialDecay(0.1, decay_steps=10, decay_rate=0.5)
    s = LinearWarmup(after, warmup_steps=4, initial_learning_rate=0.02)
    assert [s(i) for i in range(4)] == pytest.approx([0.02, 0.04, 0.06, 0.08])
    assert s(4) == pytest.approx(0.1)
    assert s(14) == pytest.approx(0.05)
    flat = LinearWarmup(0.3, warmup_steps=3)
    assert [flat(i) for i in range(5)] == pytest.approx([0.0, 0.1, 0.2, 0.3, 0.3])


def test_piecewise_constant_decay():
    s = PiecewiseConstantDecay([10, 20], [1.0, 0.5, 0.1])
    assert [s(x) for x in (0, 10, 11, 20, 21, 1000)] == [1.0, 1.0, 0.5, 0.5, 0.1, 0.1]
    with pytest.raises(ValueError, match="one more than the length of boundaries"):
        PiecewiseConstantDecay([10, 20], [1.0, 0.5])
    with pytest.raises(ValueError, match="increasing"):
        PiecewiseConstantDecay([20, 10], [1.0, 0.5, 0.1])


def test_constant():
    assert Constant(0.3)(12345) == 0.3


def test_errors():
    with pytest.raises(ValueError, match="decay_steps must be > 0"):
        ExponentialDecay(0.1, 0, 0.5)
    with pytest.raises(TypeError, match="must be a number"):
        ExponentialDecay("0.1", 10, 0.5)
    with pytest.raises(ValueError, match="warmup_steps is 0"):
        CosineDecay(0.1, 10, warmup_target=1.0)
    with pytest.raises(TypeError, match="step must be a number"):
        Constant(0.1)("now")
    with pytest.raises(NotImplementedError):
        schedules.LearningRateSchedule()(0)
    with pytest.raises(ValueError, match="unknown learning rate schedule"):
        schedules.deserialize({"class_name": "Nope", "config": {}})


def test_serialize_round_trip():
    for s in [
        Constant(0.1),
        ExponentialDecay(0.1, 10, 0.9, staircase=True),
        CosineDecay(0.0, 50, alpha=0.2, warmup_target=0.3, warmup_steps=5),
        LinearWarmup(CosineDecay(0.1, 10), warmup_steps=3),
        PiecewiseConstantDecay([1, 2], [3.0, 2.0, 1.0]),
    ]:
        copy = schedules.deserialize(schedules.serialize(s))
        assert type(copy) is type(s)
        assert [copy(i) for i in range(20)] == [s(i) for i in range(20)]
    assert schedules.deserialize(schedules.serialize(0.5)) == 0.5
