"""hpcdist.jax on several ranks: N ranks on 1/N of each global batch == 1 process on it."""

from __future__ import annotations

import jax
import numpy as np
import pytest

import hpcdist.jax as hdj
from hpcdist.runtime import world

pytestmark = pytest.mark.mpi
jax.config.update("jax_enable_x64", True)
import jax.numpy as jnp  # noqa: E402  (after enabling float64)


def _params(seed: int):
    rng = np.random.default_rng(seed)
    return [{"w": jnp.asarray(rng.normal(size=(5, 8))), "b": jnp.zeros(8)},
            {"w": jnp.asarray(rng.normal(size=(8, 3))), "b": jnp.zeros(3)}]


def _loss(params, x, y):
    h = jnp.tanh(x @ params[0]["w"] + params[0]["b"])
    return jnp.mean((h @ params[1]["w"] + params[1]["b"] - y) ** 2)


def _train(params, rank, size, reduce):
    grad = jax.grad(_loss)
    for step in range(4):
        rng = np.random.default_rng(100 + step)
        x, y = rng.normal(size=(24, 5)), rng.normal(size=(24, 3))
        per = 24 // size
        g = grad(params, jnp.asarray(x[rank * per:(rank + 1) * per]),
                 jnp.asarray(y[rank * per:(rank + 1) * per]))
        g = reduce(g)
        params = jax.tree_util.tree_map(lambda p, d: p - 0.1 * d, params, g)
    return params


def test_equivalence_with_one_process() -> None:
    w = world()
    reference = _train(_params(0), 0, 1, lambda g: g)
    start = hdj.broadcast(_params(w.rank), root=0)  # rank 0's start everywhere
    mine = _train(start, w.rank, w.size, hdj.all_reduce)
    for a, b in zip(jax.tree_util.tree_leaves(mine), jax.tree_util.tree_leaves(reference),
                    strict=True):
        assert a.dtype == jnp.float64
        assert np.allclose(np.asarray(a), np.asarray(b), rtol=0, atol=1e-9)


def test_all_gather_and_sum() -> None:
    w = world()
    tree = {"r": jnp.full((w.rank + 1,), float(w.rank))}
    gathered = hdj.all_gather(tree)["r"]
    assert isinstance(gathered, jax.Array)
    assert gathered.tolist() == [float(r) for r in range(w.size) for _ in range(r + 1)]
    assert float(hdj.all_reduce(jnp.asarray(1.0), "SUM")) == w.size
