"""Optimizer trajectories against an independent NumPy implementation of the Keras formulas."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest

import hpcdist as hd
from hpcdist import optimizers
from hpcdist.optimizers import SGD, Adagrad, Adam, AdamW, Nadam, RMSprop, schedules

SHAPES = [(3, 4), (5,), ()]


class Reference:
    """Keras 2.11+ update rules in plain NumPy float64 (written from the documented formulas)."""

    def __init__(self, kind, learning_rate=0.01, *, weight_decay=None, clipnorm=None,
                 clipvalue=None, global_clipnorm=None, momentum=0.0, nesterov=False, beta_1=0.9,
                 beta_2=0.999, epsilon=1e-7, amsgrad=False, rho=0.9, centered=False,
                 initial_accumulator_value=0.1):  # fmt: skip
        self.kind = kind
        self.lr = learning_rate
        self.wd = weight_decay
        self.clipnorm, self.clipvalue, self.global_clipnorm = clipnorm, clipvalue, global_clipnorm
        self.momentum, self.nesterov = momentum, nesterov
        self.b1, self.b2, self.eps, self.amsgrad = beta_1, beta_2, epsilon, amsgrad
        self.rho, self.centered = rho, centered
        self.initial_accumulator_value = initial_accumulator_value
        self.u_product = 1.0  # Nadam's product of momentum-schedule values (a Keras variable)
        self.iterations = 0
        self.state: dict[int, dict[str, np.ndarray]] = {}

    def _clip(self, grads):
        if self.clipnorm is not None:
            return {i: g * self.clipnorm / max(np.linalg.norm(g), self.clipnorm)
                    for i, g in grads.items()}  # fmt: skip
        if self.global_clipnorm is not None:
            norm = math.sqrt(sum(float(np.sum(g * g)) for g in grads.values()))
            c = self.global_clipnorm
            return {i: g * c / max(norm, c) for i, g in grads.items()}
        if self.clipvalue is not None:
            return {i: np.clip(g, -self.clipvalue, self.clipvalue) for i, g in grads.items()}
        return grads

    def step(self, params, grads):
        """Apply ``grads`` (``None`` entries skipped) to ``params`` (float64 arrays, in place)."""
        lr = self.lr(self.iterations) if callable(self.lr) else self.lr
        given = {i: np.asarray(g, np.float64) for i, g in enumerate(grads) if g is not None}
        if self.kind == "nadam":  # Keras updates u_product once per step, before the variables
            u_t = self.b1 * (1.0 - 0.5 * 0.96 ** (self.iterations + 1))
            u_next = self.b1 * (1.0 - 0.5 * 0.96 ** (self.iterations + 2))
            self.u_product *= u_t
        for i, g in self._clip(given).items():
            p = params[i]
            if self.wd:
                p -= p * self.wd * lr
            s = self.state.setdefault(i, {})
            zeros = lambda p=p: np.zeros_like(p)  # noqa: E731
            if self.kind == "sgd":
                if self.momentum > 0:
                    m = s.setdefault("momentum", zeros())
                    m[...] = self.momentum * m - lr * g
                    p += self.momentum * m - lr * g if self.nesterov else m
                else:
                    p -= lr * g
            elif self.kind == "adam":
                t = self.iterations + 1
                alpha = lr * math.sqrt(1 - self.b2**t) / (1 - self.b1**t)
                m, v = s.setdefault("m", zeros()), s.setdefault("v", zeros())
                m += (g - m) * (1 - self.b1)
                v += (g * g - v) * (1 - self.b2)
                denom = v
                if self.amsgrad:
                    vhat = s.setdefault("vhat", zeros())
                    np.maximum(vhat, v, out=vhat)
                    denom = vhat
                p -= alpha * m / (np.sqrt(denom) + self.eps)
            elif self.kind == "adagrad":
                acc = s.setdefault("accumulator", np.full_like(p, self.initial_accumulator_value))
                acc += g * g
                p -= lr * g / np.sqrt(acc + self.eps)
            elif self.kind == "nadam":
                t = self.iterations + 1
                m, v = s.setdefault("m", zeros()), s.setdefault("v", zeros())
                m += (g - m) * (1 - self.b1)
                v += (g * g - v) * (1 - self.b2)
                m_hat = (u_next * m / (1 - self.u_product * u_next)
                         + (1 - u_t) * g / (1 - self.u_product))  # fmt: skip
                v_hat = v / (1 - self.b2**t)
                p -= lr * m_hat / (np.sqrt(v_hat) + self.eps)
            elif self.kind == "rmsprop":
                vel = s.setdefault("velocity", zeros())
                vel[...] = self.rho * vel + (1 - self.rho) * g * g
                if self.centered:
                    avg = s.setdefault("average_gradient", zeros())
                    avg[...] = self.rho * avg + (1 - self.rho) * g
                    denom = vel - avg * avg + self.eps
                else:
                    denom = vel + self.eps
                inc = lr * g / np.sqrt(denom)
                if self.momentum > 0:
                    mb = s.setdefault("momentum", zeros())
                    mb[...] = self.momentum * mb + inc
                    p -= mb
                else:
                    p -= inc
        self.iterations += 1


CASES = [
    ("sgd", dict(learning_rate=0.1)),
    ("sgd", dict(learning_rate=0.05, momentum=0.9)),
    ("sgd", dict(learning_rate=0.05, momentum=0.9, nesterov=True, weight_decay=0.01)),
    ("adam", dict(learning_rate=0.01)),
    ("adam", dict(learning_rate=0.01, amsgrad=True, beta_1=0.8, beta_2=0.9)),
    ("adam", dict(learning_rate=0.02, weight_decay=0.05, amsgrad=True, epsilon=1e-4)),
    ("adamw", dict(learning_rate=0.01, weight_decay=0.1)),
    ("rmsprop", dict(learning_rate=0.01)),
    ("rmsprop", dict(learning_rate=0.01, centered=True, momentum=0.8, rho=0.8)),
    ("rmsprop", dict(learning_rate=0.01, momentum=0.5, weight_decay=0.02)),
    ("adagrad", dict(learning_rate=0.1)),
    ("adagrad", dict(learning_rate=0.05, initial_accumulator_value=0.5, epsilon=1e-3,
                     weight_decay=0.01)),  # fmt: skip
    ("nadam", dict(learning_rate=0.01)),
    ("nadam", dict(learning_rate=0.02, beta_1=0.8, beta_2=0.9, clipnorm=1.0, weight_decay=0.01)),
]


def make(kind, **kw):
    classes = {"sgd": SGD, "adam": Adam, "adamw": AdamW, "rmsprop": RMSprop, "adagrad": Adagrad,
               "nadam": Nadam}  # fmt: skip
    return classes[kind](**kw)


def reference(kind, **kw):
    if kind == "adamw":
        kw.setdefault("weight_decay", 0.004)
        kind = "adam"
    return Reference(kind, **kw)


def grads_for(step, shapes, rng, dtype=np.float64):
    # shrinking gradients: v decays below its running max, so amsgrad matters
    scale = 3.0 / (step + 1)
    return [(rng.standard_normal(s) * scale).astype(dtype) for s in shapes]


def tol(dtype):
    return {"rtol": 2e-5, "atol": 2e-6} if dtype == np.float32 else {"rtol": 1e-11, "atol": 1e-12}


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize(("kind", "config"), CASES)
def test_trajectory_matches_the_keras_formulas(kind, config, dtype):
    rng = np.random.default_rng(7)
    init = [rng.standard_normal(s) for s in SHAPES]
    variables = [hd.Variable(x.astype(dtype), name=f"v{i}") for i, x in enumerate(init)]
    expected = [x.astype(dtype).astype(np.float64) for x in init]
    opt, ref = make(kind, **config), reference(kind, **config)
    for step in range(6):
        grads = grads_for(step, SHAPES, rng, dtype)
        assert int(opt.apply_gradients(zip(grads, variables, strict=True))) == step + 1
        ref.step(expected, grads)
        for v, e in zip(variables, expected, strict=True):
            assert v.dtype == dtype and v.shape == e.shape
            np.testing.assert_allclose(v.numpy(), e, **tol(dtype))
    for name, value in ref.state[0].items():
        np.testing.assert_allclose(opt.get_slot(variables[0], name).numpy(), value, **tol(dtype))
    assert sorted(opt.get_slot_names()) == sorted(ref.state[0])


def test_mixed_float32_and_float64_variables():
    rng = np.random.default_rng(3)
    init = [rng.standard_normal((4, 2)), rng.standard_normal(3), rng.standard_normal(5)]
    dtypes = [np.float32, np.float64, np.float32]
    variables = [hd.Variable(x.astype(d)) for x, d in zip(init, dtypes, strict=True)]
    expected = [x.astype(d).astype(np.float64) for x, d in zip(init, dtypes, strict=True)]
    opt, ref = Adam(0.05, amsgrad=True), Reference("adam", 0.05, amsgrad=True)
    for step in range(4):
        grads = [(rng.standard_normal(x.shape) / (step + 1)).astype(d)
                 for x, d in zip(init, dtypes, strict=True)]  # fmt: skip
        opt.apply_gradients(zip(grads, variables, strict=True))
        ref.step(expected, grads)
    for v, e, d in zip(variables, expected, dtypes, strict=True):
        assert v.dtype == d
        np.testing.assert_allclose(v.numpy(), e, **tol(d))
    # the two float32 variables share one flat buffer, the float64 one has its own
    assert variables[0].raw_value().base is variables[2].raw_value().base
    assert variables[1].raw_value().base is not variables[0].raw_value().base


def test_gradients_of_another_dtype_are_cast_to_the_variable_dtype():
    w = hd.Variable(np.ones(3, np.float32))
    SGD(0.5).apply_gradients([(np.array([1.0, 2.0, 4.0]), w)])  # float64 gradient
    assert w.dtype == np.float32
    np.testing.assert_array_equal(w.numpy(), np.float32([0.5, 0.0, -1.0]))
    s = hd.Variable(2.0)
    SGD(0.5).apply_gradients([(1.0, s)])  # a Python float for a scalar variable
    assert float(s) == 1.5


def test_none_gradients_are_skipped():
    rng = np.random.default_rng(5)
    init = [rng.standard_normal(s) for s in [(2, 2), (3,), (4,), (2,)]]
    variables = [hd.Variable(x) for x in init]
    expected = [x.copy() for x in init]
    opt = Adam(0.1, weight_decay=0.1)
    ref = Reference("adam", 0.1, weight_decay=0.1)
    with pytest.warns(UserWarning, match="Gradients do not exist"):
        for step in range(3):
            grads = [rng.standard_normal(x.shape) for x in init]
            grads[1] = None  # a gap in the middle: two ranges of the flat buffer
            if step == 2:
                grads[3] = None
            opt.apply_gradients(zip(grads, variables, strict=True))
            ref.step(expected, grads)
    for v, e in zip(variables, expected, strict=True):
        np.testing.assert_allclose(v.numpy(), e, rtol=1e-12)
    np.testing.assert_array_equal(variables[1].numpy(), init[1])  # untouched, even by decay
    assert not opt.get_slot(variables[1], "m").numpy().any()
    assert int(opt.iterations) == 3


def test_learning_rate_schedule_is_called_with_iterations_before_the_increment():
    w = hd.Variable(np.zeros(2))
    sched = schedules.PiecewiseConstantDecay([0, 1], [1.0, 0.5, 0.25])
    opt = SGD(sched)
    assert opt.learning_rate == 1.0
    seen = []
    for _ in range(4):
        seen.append(opt.learning_rate)
        opt.apply_gradients([(np.ones(2), w)])
    assert seen == [1.0, 0.5, 0.25, 0.25]
    np.testing.assert_allclose(w.numpy(), -(1.0 + 0.5 + 0.25 + 0.25))
    opt.learning_rate = 0.125  # settable, also through the alias
    assert opt.lr == 0.125
    opt.lr = 0.5
    opt.apply_gradients([(np.ones(2), w)])
    np.testing.assert_allclose(w.numpy(), -2.5)


def test_a_callable_learning_rate_gets_the_step():
    w = hd.Variable(np.zeros(1))
    opt = SGD(lambda step: 0.1 * (step + 1))
    for _ in range(3):
        opt.apply_gradients([(np.ones(1), w)])
    np.testing.assert_allclose(w.numpy(), [-0.6])


def test_iterations_slots_and_variables():
    w, b = hd.Variable(np.ones((2, 2)), name="w"), hd.Variable(np.zeros(2), name="b")
    opt = RMSprop(0.01, momentum=0.9, centered=True)
    assert int(opt.iterations) == 0
    with pytest.raises(KeyError, match="first apply_gradients"):
        opt.get_slot(w, "velocity")
    it = opt.apply_gradients([(np.ones((2, 2)), w), (np.ones(2), b)])
    assert it is opt.iterations and int(it) == 1 and it.dtype == np.int64
    assert opt.get_slot(w, "rms") is opt.get_slot(w, "velocity")
    assert opt.get_slot(w, "mg") is opt.get_slot(w, "average_gradient")
    assert opt.get_slot(b, "momentum").shape == (2,)
    assert opt.get_slot(w, "velocity").name == "w/velocity"
    with pytest.raises(KeyError, match="no slot 'm'"):
        opt.get_slot(w, "m")
    assert len(opt.variables()) == 1 + 2 * 3
    opt.iterations = 10
    assert int(opt.iterations) == 10


def test_build_creates_slots_before_the_first_step():
    w = hd.Variable(np.ones(3))
    opt = SGD(0.1, momentum=0.5)
    opt.build([w])
    assert not opt.get_slot(w, "m").numpy().any()
    assert int(opt.iterations) == 0


def test_errors():
    w = hd.Variable(np.ones(3), name="w")
    with pytest.raises(ValueError, match=r"No gradients provided for any variable: \['w'\]"):
        SGD().apply_gradients([(None, w)])
    with pytest.raises(ValueError, match="No gradients provided"):
        SGD().apply_gradients([])
    with pytest.raises(TypeError, match="'h' has dtype float16"):
        SGD().apply_gradients([(np.ones(2), hd.Variable(np.ones(2, np.float16), name="h"))])
    with pytest.raises(TypeError, match="'i' has dtype int64"):
        SGD().apply_gradients([(np.ones(2), hd.Variable(np.ones(2, np.int64), name="i"))])
    with pytest.raises(ValueError, match=r"variable 'w' has shape \(4,\) but the variable has"):
        SGD().apply_gradients([(np.ones(4), w)])
    with pytest.raises(ValueError, match="appears twice"):
        SGD().apply_gradients([(np.ones(3), w), (np.ones(3), w)])
    with pytest.raises(TypeError, match="pairs"):
        SGD().apply_gradients([np.ones(3)])
    with pytest.raises(TypeError, match="hpcdist Variables"):
        SGD().apply_gradients([(np.ones(3), np.ones(3))])
    with pytest.raises(TypeError, match="expected a float"):
        SGD().apply_gradients([(np.ones(3, complex), w)])
    with pytest.raises(ValueError, match="only one of clipnorm, clipvalue and global_clipnorm"):
        SGD(clipnorm=1.0, global_clipnorm=1.0)
    with pytest.raises(ValueError, match="only one of"):
        Adam(clipnorm=1.0, clipvalue=1.0)
    with pytest.raises(ValueError, match="momentum"):
        SGD(momentum=1.5)
    with pytest.raises(ValueError, match="learning_rate must be >= 0"):
        SGD(-1.0)
    with pytest.raises(TypeError, match="learning_rate must be a number"):
        SGD("fast")
    with pytest.raises(ValueError, match="weight_decay must be a float"):
        AdamW(weight_decay=None)
    with pytest.raises(TypeError, match="unexpected keyword"):
        SGD(decay=0.1)
    opt = SGD(0.1)
    opt.apply_gradients([(np.ones(3), w)])
    with pytest.raises(ValueError, match="one optimizer per strategy"):
        strategy = hd.MirroredStrategy(["/cpu:0", "/cpu:1"])
        with strategy.scope():
            m = hd.Variable(np.ones(3))
        opt.apply_gradients([(np.ones(3), m)])
    opt = SGD(0.1)  # SGD() changes its mind about momentum after the slots exist
    opt.apply_gradients([(np.ones(3), w)])
    opt.momentum = 0.9
    with pytest.raises(ValueError, match="settings changed"):
        opt.apply_gradients([(np.ones(3), w)])


def test_sync_on_read_variables_are_rejected():
    strategy = hd.MirroredStrategy(["/cpu:0", "/cpu:1"])
    with strategy.scope():
        v = hd.Variable(np.zeros(2), synchronization="ON_READ", aggregation="SUM", name="s")
        with pytest.raises(TypeError, match="'s' is a SyncOnReadVariable"):
            SGD().apply_gradients([(np.ones(2), v)])


def test_get_and_config_round_trip():
    assert type(optimizers.get("adam")) is Adam
    assert type(optimizers.get("SGD")) is SGD
    assert type(optimizers.get("rmsprop")) is RMSprop
    assert type(optimizers.get("adamw")) is AdamW
    opt = Adam(0.01)
    assert optimizers.get(opt) is opt
    with pytest.raises(ValueError, match="Could not interpret optimizer identifier"):
        optimizers.get("adadelta")
    with pytest.raises(ValueError, match="Could not interpret"):
        optimizers.get(3)
    sched = schedules.CosineDecay(0.1, 100, alpha=0.1, warmup_target=0.5, warmup_steps=10)
    for original in [
        SGD(0.2, momentum=0.5, nesterov=True, clipnorm=2.0),
        Adam(sched, amsgrad=True, global_clipnorm=1.0),
        AdamW(0.003, weight_decay=0.01, clipvalue=0.5),
        RMSprop(0.1, rho=0.8, centered=True, momentum=0.3, weight_decay=0.1),
        Adagrad(0.2, initial_accumulator_value=0.3, epsilon=1e-5, clipnorm=1.0),
        Nadam(0.004, beta_1=0.8, beta_2=0.99, epsilon=1e-6, weight_decay=0.1),
    ]:
        config = optimizers.serialize(original)
        copy = optimizers.get(config)
        assert type(copy) is type(original)
        assert copy.get_config() == original.get_config()
    assert Adam.from_config(Adam(sched).get_config()).learning_rate == sched(0)
    assert SGD().get_config() == {
        "name": "SGD", "learning_rate": 0.01, "weight_decay": None, "clipnorm": None,
        "global_clipnorm": None, "clipvalue": None, "momentum": 0.0, "nesterov": False,
    }  # fmt: skip


def test_keras_defaults():
    assert (SGD().learning_rate, Adam().learning_rate, RMSprop().learning_rate) == (
        0.01,
        0.001,
        0.001,
    )
    adam, rms, adamw = Adam(), RMSprop(), AdamW()
    assert (adam.beta_1, adam.beta_2, adam.epsilon, adam.amsgrad) == (0.9, 0.999, 1e-7, False)
    assert (rms.rho, rms.momentum, rms.epsilon, rms.centered) == (0.9, 0.0, 1e-7, False)
    assert adamw.weight_decay == 0.004
    adagrad, nadam = optimizers.get("adagrad"), optimizers.get("nadam")
    assert (adagrad.learning_rate, adagrad.initial_accumulator_value, adagrad.epsilon) == (
        0.001, 0.1, 1e-7)  # fmt: skip
    assert (nadam.learning_rate, nadam.beta_1, nadam.beta_2, nadam.epsilon) == (
        0.001, 0.9, 0.999, 1e-7)  # fmt: skip


def test_warning_for_missing_gradients_is_given_once_per_set():
    a, b = hd.Variable(np.ones(1), name="a"), hd.Variable(np.ones(1), name="b")
    opt = SGD()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(3):
            opt.apply_gradients([(np.ones(1), a), (None, b)])
    assert len([w for w in caught if "Gradients do not exist" in str(w.message)]) == 1
