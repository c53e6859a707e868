"""hpcdist.nn mixed precision: policies, 16-bit compute with float32 weights, loss scaling."""

from __future__ import annotations

import numpy as np
import pytest

import hpcdist as hd
from hpcdist.arrays import BFLOAT16
from hpcdist.nn import Dense, Sequential
from hpcdist.nn import mixed_precision as mp


@pytest.fixture(autouse=True)
def reset_policy():
    yield
    mp.set_global_policy(None)


def _data(n: int = 512):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((n, 20)).astype(np.float32)
    return x, x @ rng.standard_normal((20, 1)).astype(np.float32)


def _fit(policy: str, optimizer, epochs: int = 12) -> tuple[Sequential, list[float]]:
    mp.set_global_policy(policy)
    hd.utils.set_random_seed(1)
    model = Sequential([Dense(32, activation="relu", input_shape=(20,)), Dense(1)])
    model.compile(optimizer=optimizer, loss="mse")
    x, y = _data()
    history = model.fit(x, y, epochs=epochs, batch_size=64, verbose=0, shuffle=False)
    return model, history.history["loss"]


def test_policy_names_follow_keras() -> None:
    assert mp.global_policy() == mp.Policy("float32")
    mp.set_global_policy("mixed_bfloat16")
    assert hd.nn.mixed_precision.global_policy().name == "mixed_bfloat16"
    p = mp.Policy("mixed_float16")
    assert (p.compute_dtype, p.variable_dtype) == ("float16", "float32")
    assert repr(mp.Policy("float32")) == '<Policy "float32">'
    with pytest.raises(ValueError, match="policy name is 'mixed_int8'.*mixed_bfloat16"):
        mp.set_global_policy("mixed_int8")


def test_dense_computes_in_bf16_and_keeps_float32_master_weights() -> None:
    mp.set_global_policy("mixed_bfloat16")
    layer = Dense(4, input_shape=(3,))
    layer.build((None, 3))
    assert layer.kernel.dtype == np.float32 and layer.compute_dtype == "bfloat16"
    y, cache = layer.forward(np.ones((2, 3), np.float32))
    assert y.dtype == BFLOAT16
    _, grads = layer.backward(cache, np.ones((2, 4), np.float32))
    assert [g.dtype for g in grads] == [np.float32, np.float32]
    explicit = Dense(4, dtype="float32")  # an explicit dtype wins over the policy
    assert explicit.compute_dtype == "float32"


def test_mixed_bfloat16_fit_converges_like_float32() -> None:
    model, losses = _fit("mixed_bfloat16", hd.optimizers.Adam(0.01))
    _, reference = _fit("float32", hd.optimizers.Adam(0.01))
    assert losses[-1] < losses[0] / 50
    assert losses[-1] < 5 * reference[-1] + 0.05  # bf16 noise, the same descent
    assert all(w.dtype == np.float32 for w in model.get_weights())


def test_loss_scaling_skips_overflowing_steps_and_grows_the_scale() -> None:
    opt = mp.LossScaleOptimizer(hd.optimizers.Adam(0.01), dynamic_growth_steps=4)
    _, losses = _fit("mixed_float16", opt)
    assert losses[-1] < losses[0] / 20
    # 2**15 overflows float16 gradients here: those steps were skipped, the scale halved,
    # then grown again after each 4 good steps
    assert opt.skipped_steps > 0 and opt.loss_scale != 2.0**15


def test_loss_scale_optimizer_by_hand() -> None:
    var = hd.Variable(np.ones(2, np.float32))
    opt = mp.LossScaleOptimizer(hd.optimizers.SGD(1.0), initial_scale=8.0, dynamic_growth_steps=2)
    assert opt.get_scaled_loss(np.float32(0.5)) == 4.0
    assert not opt.apply_gradients([(np.array([np.inf, 1.0], np.float32), var)])
    np.testing.assert_array_equal(var.numpy(), [1.0, 1.0])  # skipped
    assert opt.loss_scale == 4.0 and opt.skipped_steps == 1
    assert opt.apply_gradients([(np.array([4.0, 8.0], np.float32), var)])  # unscaled: 1, 2
    np.testing.assert_array_equal(var.numpy(), [0.0, -1.0])
    opt.apply_gradients([(np.zeros(2, np.float32), var)])
    assert opt.loss_scale == 8.0  # two good steps in a row
    with pytest.raises(TypeError, match="hpcdist optimizer"):
        mp.LossScaleOptimizer("sgd")
    with pytest.raises(ValueError, match="initial_scale"):
        mp.LossScaleOptimizer(hd.optimizers.SGD(1.0), initial_scale=0.0)
