"""A JAX MLP on scikit-learn's digits, distributed with hpcdist.jax (jax.grad + optax Adam).

Run it as ``mpirun -n 2 python examples/jax_mlp.py`` (or plain ``python``).
Each rank computes ``jax.grad`` of the loss on its 1/N share of every global
batch; ``hdj.all_reduce`` averages the gradient pytree over the ranks (one
fused allreduce) and optax's Adam updates the parameters, identically on every
rank. ``hdj.broadcast`` gives every rank rank 0's start parameters.
``--min-accuracy`` fails the run when the test accuracy is lower.
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split

import hpcdist.jax as hdj
from hpcdist.runtime import world


def init(key: jax.Array, sizes: tuple[int, ...] = (64, 128, 64, 10)) -> list[dict[str, jax.Array]]:
    params = []
    for fan_in, fan_out in zip(sizes[:-1], sizes[1:], strict=True):
        key, sub = jax.random.split(key)
        w = jax.random.normal(sub, (fan_in, fan_out)) * jnp.sqrt(2.0 / fan_in)
        params.append({"w": w, "b": jnp.zeros(fan_out)})
    return params


def forward(params: list[dict[str, jax.Array]], x: jax.Array) -> jax.Array:
    for layer in params[:-1]:
        x = jax.nn.relu(x @ layer["w"] + layer["b"])
    return x @ params[-1]["w"] + params[-1]["b"]


def loss_fn(params: Any, x: jax.Array, y: jax.Array) -> jax.Array:
    return optax.softmax_cross_entropy_with_integer_labels(forward(params, x), y).mean()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=20)
    parser.add_argument("--batch-size", type=int, default=64, help="global batch size")
    parser.add_argument("--learning-rate", type=float, default=2e-3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--min-accuracy", type=float, default=0.0)
    args = parser.parse_args(argv)

    w = world()
    digits = load_digits()
    x = (digits.data / 16.0).astype(np.float32)
    parts = train_test_split(x, digits.target, test_size=0.2, random_state=args.seed,
                             stratify=digits.target)
    x_train, x_test, y_train, y_test = (jnp.asarray(p) for p in parts)
    params = hdj.broadcast(init(jax.random.PRNGKey(args.seed + w.rank)), root=0)
    optimizer = optax.adam(args.learning_rate)
    state = optimizer.init(params)
    grad_fn = jax.jit(jax.value_and_grad(loss_fn))

    @jax.jit
    def update(params, state, grads):
        updates, state = optimizer.update(grads, state, params)
        return optax.apply_updates(params, updates), state

    local = args.batch_size // w.size
    start = time.perf_counter()
    for epoch in range(args.epochs):
        order = np.random.default_rng(epoch).permutation(len(x_train))
        losses = []
        for first in range(0, len(order) - args.batch_size + 1, args.batch_size):
            mine = order[first + w.rank * local : first + (w.rank + 1) * local]
            loss, grads = grad_fn(params, x_train[mine], y_train[mine])
            grads = hdj.all_reduce(grads)  # MEAN over the ranks
            params, state = update(params, state, grads)
            losses.append(float(loss))
        mean_loss = float(hdj.all_reduce(jnp.asarray(np.mean(losses))))
        if w.rank == 0 and (epoch + 1) % 5 == 0:
            print(f"epoch {epoch + 1}: loss {mean_loss:.4f}")
    right = jnp.sum(jnp.argmax(forward(params, x_test), 1) == y_test)
    accuracy = float(right) / len(y_test)  # every rank holds the same parameters
    if w.rank == 0:
        print(f"test accuracy: {accuracy:.4f}")
        print(f"wall time: {time.perf_counter() - start:.2f} s")
    if accuracy < args.min_accuracy:
        print(f"test accuracy {accuracy:.4f} is below --min-accuracy {args.min_accuracy}",
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
