"""Optimizers under MultiWorkerMirroredStrategy: summed gradients, one allreduce per step.

Run under ``mpirun -n 2`` and ``-n 4``. Every rank is a worker with one or two
CPU replicas; each replica's gradient depends on its global replica id, and
every rank checks its parameters against a local NumPy computation with the
gradient summed over all replicas.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

import hpcdist as hd
from hpcdist.optimizers import SGD, Adagrad, Adam, Nadam, RMSprop

pytestmark = pytest.mark.mpi(min_size=2)

SHAPES = [(4, 3), (3,)]
_STRATEGIES: dict[int, hd.MultiWorkerMirroredStrategy] = {}


def strategy(replicas: int) -> hd.MultiWorkerMirroredStrategy:
    """One strategy per local replica count, built once on every rank (collective)."""
    if replicas not in _STRATEGIES:
        devices = [f"/cpu:{i}" for i in range(replicas)]
        _STRATEGIES[replicas] = hd.MultiWorkerMirroredStrategy(devices=devices)
    return _STRATEGIES[replicas]


def grads_of(step: int, replica: int, dtypes) -> list[np.ndarray]:
    rng = np.random.default_rng(1000 * step + replica)
    return [(rng.standard_normal(s) * (replica + 1)).astype(d)
            for s, d in zip(SHAPES, dtypes, strict=True)]  # fmt: skip


def summed(step: int, n: int, dtypes) -> list[np.ndarray]:
    per = [grads_of(step, r, dtypes) for r in range(n)]
    return [sum(p[i].astype(np.float64) for p in per) for i in range(len(SHAPES))]


def reference_step(kind, params, grads, state, t, lr, global_clipnorm=None):
    """Keras's SGD-momentum / Adam / RMSprop / Adagrad / Nadam step in NumPy float64 (t:
    iterations before)."""
    if global_clipnorm is not None:
        norm = math.sqrt(sum(float(np.sum(g * g)) for g in grads))
        grads = [g * global_clipnorm / max(norm, global_clipnorm) for g in grads]
    for i, (p, g) in enumerate(zip(params, grads, strict=True)):
        s = state.setdefault(i, {"a": np.zeros_like(p), "b": np.zeros_like(p)})
        if kind == "sgd":  # momentum 0.9
            s["a"] = 0.9 * s["a"] - lr * g
            p += s["a"]
        elif kind == "adam":
            s["a"] += (g - s["a"]) * (1 - 0.9)
            s["b"] += (g * g - s["b"]) * (1 - 0.999)
            alpha = lr * math.sqrt(1 - 0.999 ** (t + 1)) / (1 - 0.9 ** (t + 1))
            p -= alpha * s["a"] / (np.sqrt(s["b"]) + 1e-7)
        elif kind == "adagrad":  # initial accumulator 0.1
            s["a"] = s["a"] + g * g + (0.1 if t == 0 else 0.0)
            p -= lr * g / np.sqrt(s["a"] + 1e-7)
        elif kind == "nadam":
            u = [0.9 * (1 - 0.5 * 0.96**k) for k in range(1, t + 3)]  # u_1 ... u_{t+2}
            product = float(np.prod(u[: t + 1]))
            s["a"] += (g - s["a"]) * (1 - 0.9)
            s["b"] += (g * g - s["b"]) * (1 - 0.999)
            m_hat = u[t + 1] * s["a"] / (1 - product * u[t + 1]) + (1 - u[t]) * g / (1 - product)
            p -= lr * m_hat / (np.sqrt(s["b"] / (1 - 0.999 ** (t + 1))) + 1e-7)
        else:  # rmsprop, centered
            s["a"] = 0.9 * s["a"] + 0.1 * g * g
            s["b"] = 0.9 * s["b"] + 0.1 * g
            p -= lr * g / np.sqrt(s["a"] - s["b"] ** 2 + 1e-7)


def _count_allreduces(s, monkeypatch) -> list[int]:
    calls: list[int] = []
    collectives = s.extended._collectives
    original = collectives.allreduce

    def counting(tensors, op, options=None, **kwargs):
        calls.append(len(tensors))
        return original(tensors, op, options, **kwargs)

    monkeypatch.setattr(collectives, "allreduce", counting)
    return calls


@pytest.mark.parametrize("replicas", [1, 2])
@pytest.mark.parametrize("kind", ["sgd", "adam", "rmsprop", "adagrad", "nadam"])
@pytest.mark.parametrize("dtypes", [(np.float64, np.float64), (np.float32, np.float64)])
def test_parameters_follow_the_summed_gradient(replicas, kind, dtypes, monkeypatch):
    s = strategy(replicas)
    n = s.num_replicas_in_sync
    rng = np.random.default_rng(42)  # the same initial values everywhere (also broadcast)
    init = [rng.standard_normal(shape).astype(d) for shape, d in zip(SHAPES, dtypes, strict=True)]
    lr = 0.01
    with s.scope():
        variables = [hd.Variable(x, name=f"v{i}") for i, x in enumerate(init)]
        opt = {
            "sgd": lambda: SGD(lr, momentum=0.9),
            "adam": lambda: Adam(lr),
            "rmsprop": lambda: RMSprop(lr, centered=True),
            "adagrad": lambda: Adagrad(lr),
            "nadam": lambda: Nadam(lr),
        }[kind]()
    calls = _count_allreduces(s, monkeypatch)

    def replica_fn(step):
        rid = hd.get_replica_context().replica_id_in_sync_group
        return opt.apply_gradients(zip(grads_of(step, rid, dtypes), variables, strict=True))

    expected = [x.astype(np.float64) for x in init]
    state: dict = {}
    for step in range(3):
        s.run(replica_fn, args=(step,))
        assert len(calls) == step + 1  # exactly one allreduce per apply_gradients
        reference_step(kind, expected, summed(step, n, dtypes), state, step, lr)
    assert calls == [len(set(dtypes))] * 3  # one flat buffer per dtype in that allreduce
    assert int(opt.iterations) == 3
    for v, e, d in zip(variables, expected, dtypes, strict=True):
        comps = [c.numpy() for c in v.values]
        for c in comps[1:]:
            np.testing.assert_array_equal(c, comps[0])
        tol = 5e-5 if d == np.float32 else 1e-10
        np.testing.assert_allclose(comps[0], e, rtol=tol, atol=tol)
    # every worker holds bitwise the same parameters
    from hpcdist.runtime import world

    gathered = world().comm.allgather(np.concatenate([v.numpy().ravel() for v in variables]))
    for other in gathered[1:]:
        np.testing.assert_array_equal(other, gathered[0])


@pytest.mark.parametrize("replicas", [1, 2])
def test_global_clipnorm_uses_the_norm_of_the_summed_gradients(replicas, monkeypatch):
    s = strategy(replicas)
    n = s.num_replicas_in_sync
    dtypes = (np.float64, np.float32)
    with s.scope():
        variables = [
            hd.Variable(np.zeros(shape, d)) for shape, d in zip(SHAPES, dtypes, strict=True)
        ]
        opt = SGD(0.5, momentum=0.9, global_clipnorm=1.0)
    calls = _count_allreduces(s, monkeypatch)

    def replica_fn(step):
        rid = hd.get_replica_context().replica_id_in_sync_group
        return opt.apply_gradients(zip(grads_of(step, rid, dtypes), variables, strict=True))

    expected = [np.zeros(shape) for shape in SHAPES]
    state: dict = {}
    for step in range(2):
        s.run(replica_fn, args=(step,))
        total = summed(step, n, dtypes)
        assert math.sqrt(sum(float(np.sum(g * g)) for g in total)) > 1.0  # clipping is active
        reference_step("sgd", expected, total, state, step, 0.5, global_clipnorm=1.0)
    assert len(calls) == 2
    for v, e in zip(variables, expected, strict=True):
        np.testing.assert_allclose(v.numpy(), e, rtol=2e-5, atol=2e-6)


def test_cross_replica_apply_issues_no_allreduce(monkeypatch):
    s = strategy(1)
    with s.scope():
        w = hd.Variable(np.ones(3))
        opt = SGD(0.5)
        calls = _count_allreduces(s, monkeypatch)
        opt.apply_gradients([(np.ones(3), w)])
    assert calls == []
    np.testing.assert_array_equal(w.numpy(), np.full(3, 0.5))
