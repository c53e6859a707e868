"""Workers with different amounts of data: nobody hangs and the result is the union's.

Join semantics: while any worker has data every worker takes part in each
step; a worker without data gets empty batches, so it adds zero to the
gradient sum and zero examples to the step's count. The result equals one
process training on, at step i, the union of the workers' i-th batches.
"""

from __future__ import annotations

import numpy as np
import pytest

import hpcdist as hd
from hpcdist.nn import Dense, Sequential, backend
from hpcdist.nn.losses import SparseCategoricalCrossentropy

pytestmark = pytest.mark.mpi(min_size=2)

FEATURES, CLASSES, BATCH = 5, 3, 4


@pytest.fixture(autouse=True)
def float64():
    old = backend.floatx()
    backend.set_floatx("float64")
    yield
    backend.set_floatx(old)


def worker_data(w: int) -> tuple[np.ndarray, np.ndarray]:
    """Worker w has 2 + w batches (the last one short), different for each worker."""
    n = BATCH * (2 + w) - 1
    rng = np.random.default_rng(100 + w)
    x = rng.normal(size=(n, FEATURES))
    return x, (x[:, 0] > 0).astype(np.int64) + (x[:, 1] > 0.3).astype(np.int64)


def compiled(model: Sequential) -> Sequential:
    model.compile(
        optimizer=hd.optimizers.SGD(0.1, momentum=0.9),
        loss=SparseCategoricalCrossentropy(from_logits=True),
    )
    return model


def build() -> Sequential:
    return Sequential([Dense(8, activation="tanh", input_shape=(FEATURES,)), Dense(CLASSES)])


def test_fit_on_uneven_workers_equals_one_process_on_the_union():
    strategy = hd.MultiWorkerMirroredStrategy()
    workers = strategy.num_replicas_in_sync

    def dataset_fn(ctx):
        x, y = worker_data(ctx.input_pipeline_id)
        return hd.data.Dataset.from_tensor_slices((x, y)).batch(BATCH)

    dist = strategy.distribute_datasets_from_function(dataset_fn)
    with strategy.scope():
        model = compiled(build())
    reference = compiled(build())
    reference.set_weights(model.get_weights())
    model.fit(dist, epochs=2, verbose=0)

    # One process: step i trains on the union of every worker's i-th batch.
    parts = [worker_data(w) for w in range(workers)]
    steps = max(-(-len(x) // BATCH) for x, _ in parts)
    xs, ys = [], []
    for i in range(steps):
        sl = slice(i * BATCH, (i + 1) * BATCH)
        xs.append(np.concatenate([x[sl] for x, _ in parts]))
        ys.append(np.concatenate([y[sl] for _, y in parts]))
    for _ in range(2):
        for bx, by in zip(xs, ys, strict=True):  # one fit call per step: that step's union
            reference.fit(bx, by, batch_size=len(bx), epochs=1, shuffle=False, verbose=0)
    for got, want in zip(model.get_weights(), reference.get_weights(), strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-12)
    assert int(model.optimizer.iterations.numpy()) == 2 * steps
