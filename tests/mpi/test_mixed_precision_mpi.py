"""Mixed precision and compressed gradients in hpcdist.nn fit on several ranks.

Run under `mpirun -n 2` and `-n 4` (and with HPCDIST_VIRTUAL_NODES=2) by `make test`.
"""

from __future__ import annotations

import numpy as np
import pytest

import hpcdist as hd
from hpcdist.collectives import CommunicationOptions
from hpcdist.nn import (
    Dense,
    Dropout,
    Embedding,
    Flatten,
    Input,
    LayerNormalization,
    Sequential,
)
from hpcdist.nn import mixed_precision as mp
from hpcdist.runtime import mpi

pytestmark = pytest.mark.mpi(min_size=2)


@pytest.fixture(autouse=True)
def reset_policy():
    yield
    mp.set_global_policy(None)


def _fit(policy: str, compression: str | None = None, optimizer=None) -> tuple[list, list]:
    mp.set_global_policy(policy)
    options = CommunicationOptions(compression=compression)
    strategy = hd.MultiWorkerMirroredStrategy(communication_options=options)
    rng = np.random.default_rng(0)  # the same global data on every rank
    x = rng.standard_normal((512, 20)).astype(np.float32)
    y = x @ rng.standard_normal((20, 1)).astype(np.float32)
    with strategy.scope():
        hd.utils.set_random_seed(1)
        model = Sequential([Dense(32, activation="relu", input_shape=(20,)), Dense(1)])
        model.compile(optimizer=optimizer or hd.optimizers.Adam(0.01), loss="mse")
    history = model.fit(x, y, epochs=8, batch_size=64, verbose=0, shuffle=False)
    return model.get_weights(), history.history["loss"]


def _same_on_every_rank(weights: list) -> None:
    blobs = mpi().COMM_WORLD.allgather([w.tobytes() for w in weights])
    assert all(b == blobs[0] for b in blobs), "ranks hold different weights"


def test_mixed_bfloat16_fit_converges_with_the_same_weights_everywhere() -> None:
    weights, losses = _fit("mixed_bfloat16")
    _same_on_every_rank(weights)
    assert all(w.dtype == np.float32 for w in weights)
    assert losses[-1] < losses[0] / 20


def test_loss_scaling_decisions_agree_across_ranks() -> None:
    opt = mp.LossScaleOptimizer(hd.optimizers.Adam(0.01), dynamic_growth_steps=4)
    weights, losses = _fit("mixed_float16", optimizer=opt)
    _same_on_every_rank(weights)
    seen = mpi().COMM_WORLD.allgather((opt.loss_scale, opt.skipped_steps))
    assert all(s == seen[0] for s in seen) and opt.skipped_steps > 0
    assert losses[-1] < losses[0] / 10


def test_fit_with_compressed_gradients(monkeypatch) -> None:
    monkeypatch.setenv("HPCDIST_COLLECTIVES", "mpi")  # the compressed MPI transport
    compressed, losses = _fit("float32", compression="bf16")
    exact, reference = _fit("float32")
    _same_on_every_rank(compressed)
    assert any(not np.array_equal(a, b) for a, b in zip(compressed, exact, strict=True))
    assert losses[-1] < losses[0] / 20
    np.testing.assert_allclose(losses[-1], reference[-1], rtol=0.5, atol=0.02)


def test_mixed_bfloat16_embedding_layernorm_dropout_model_is_the_same_everywhere() -> None:
    mp.set_global_policy("mixed_bfloat16")
    strategy = hd.MultiWorkerMirroredStrategy()
    rng = np.random.default_rng(0)  # the same global data on every rank
    ids = rng.integers(0, 40, (512, 6))
    y = rng.standard_normal(40).astype(np.float32)[ids].sum(axis=1, keepdims=True) / 2.0
    with strategy.scope():
        hd.utils.set_random_seed(1)
        model = Sequential([
            Input((6,)), Embedding(40, 8), LayerNormalization(), Dense(16, activation="relu"),
            Dropout(0.1, seed=0), Flatten(), Dense(1),
        ])  # fmt: skip
        model.compile(optimizer=hd.optimizers.Adam(0.01), loss="mse")
    assert {layer.compute_dtype for layer in model.layers} == {"bfloat16"}
    history = model.fit(ids, y, epochs=6, batch_size=64, verbose=0, shuffle=False)
    weights = model.get_weights()
    _same_on_every_rank(weights)
    assert all(w.dtype == np.float32 for w in weights)
    losses = history.history["loss"]
    assert losses[-1] < losses[0] / 3, losses
