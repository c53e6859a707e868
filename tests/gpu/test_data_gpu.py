"""Distributed datasets on GPU replicas: batches arrive as CuPy arrays on the right GPU.

With the prefetch thread (the default for GPU replicas) each batch is copied
on a side stream and the consumer's stream waits for it; with
``experimental_per_replica_buffer_size=0`` the copy is synchronous. The race
tests keep the consumer's stream busy (``spin``) while the prefetch thread
copies the next batches, and drop every batch after use, so memory is
recycled while the GPU still lags: any missing wait shows as a wrong sum.
"""

from __future__ import annotations

import numpy as np
import pytest

import hpcdist as hd
from hpcdist.data.dataset import Dataset

ROWS_PER_REPLICA = 8


def gpu_names(n: int) -> list[str]:
    return [f"/gpu:{i}" for i in range(n)]


def data(rows: int) -> tuple[np.ndarray, np.ndarray]:
    x = np.arange(rows * 3, dtype=np.float32).reshape(rows, 3)
    return x, np.arange(rows, dtype=np.int64)


@pytest.mark.parametrize("buffer_size", [1, 0])
def test_batches_arrive_as_cupy_arrays_on_each_replica_gpu(cp, gpus, buffer_size):
    strategy = hd.MirroredStrategy(gpu_names(gpus))
    global_batch = ROWS_PER_REPLICA * gpus
    x, y = data(global_batch * 5)
    options = hd.InputOptions(experimental_per_replica_buffer_size=buffer_size)
    dist = strategy.experimental_distribute_dataset(
        Dataset.from_tensor_slices((x, y)).batch(global_batch), options
    )
    it = iter(dist)
    assert it.reads_ahead is (buffer_size > 0)
    steps = 0
    for xb, yb in it:
        xs = strategy.experimental_local_results(xb)
        ys = strategy.experimental_local_results(yb)
        assert len(xs) == len(ys) == gpus
        for i, (a, b) in enumerate(zip(xs, ys, strict=True)):
            assert isinstance(a, cp.ndarray) and isinstance(b, cp.ndarray)
            assert a.device.id == b.device.id == i
            assert a.dtype == np.float32 and b.dtype == np.int64
            rows = cp.asnumpy(b)
            np.testing.assert_array_equal(cp.asnumpy(a), x[rows])
        together = np.concatenate([cp.asnumpy(b) for b in ys])
        lo = steps * global_batch
        np.testing.assert_array_equal(together, np.arange(lo, lo + global_batch))
        steps += 1
    assert steps == 5


def test_replicas_compute_on_prefetched_batches(cp, gpus):
    strategy = hd.MirroredStrategy(gpu_names(gpus))
    global_batch = ROWS_PER_REPLICA * gpus
    x, y = data(global_batch * 4)
    dist = strategy.experimental_distribute_dataset(
        Dataset.from_tensor_slices((x, y)).batch(global_batch)
    )
    totals = []
    for xb, yb in dist:
        out = strategy.run(lambda a, b: a.sum() + b.sum(), args=(xb, yb))
        totals.append(float(cp.asnumpy(cp.asarray(strategy.reduce("SUM", out, axis=None)))))
    expected = [x[s * global_batch:(s + 1) * global_batch].sum()
                + y[s * global_batch:(s + 1) * global_batch].sum() for s in range(4)]  # fmt: skip
    np.testing.assert_allclose(totals, expected, rtol=1e-6)


@pytest.mark.parametrize("own_stream", [False, True])
def test_prefetch_never_races_a_busy_consumer_stream(cp, spin, own_stream):
    steps, rows = 24, 4096
    x = np.random.default_rng(2).normal(size=(steps * rows, 16)).astype(np.float32)
    dist = hd.MirroredStrategy(["/gpu:0"]).experimental_distribute_dataset(
        Dataset.from_tensor_slices(x).batch(rows),
        hd.InputOptions(experimental_per_replica_buffer_size=2),
    )
    with cp.cuda.Device(0):
        stream = cp.cuda.Stream(non_blocking=True) if own_stream else cp.cuda.get_current_stream()
        with stream:
            it = iter(dist)
            assert it.reads_ahead
            sums = []
            for batch in it:
                assert batch.device.id == 0
                spin(stream, 0.005)  # the GPU lags the host: batches pile up in the prefetch
                sums.append(batch.sum(axis=0))  # behind the spin, on the consumer's stream
                del batch  # its memory may be reused for a later batch right away
            got = cp.asnumpy(cp.stack(sums))
    expected = x.reshape(steps, rows, 16).sum(axis=1)
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-3)


def test_host_only_leaves_stay_on_the_host_and_scalars_keep_their_shape(cp):
    strategy = hd.MirroredStrategy(["/gpu:0"])

    def dataset_fn(ctx):
        return [{"x": np.ones((2, 3), np.float32), "w": np.float32(0.5), "name": "b"}] * 3

    dist = strategy.distribute_datasets_from_function(dataset_fn)
    for batch in dist:
        assert isinstance(batch["x"], cp.ndarray) and batch["x"].shape == (2, 3)
        assert isinstance(batch["w"], cp.ndarray) and batch["w"].shape == ()
        assert float(batch["w"]) == 0.5 and batch["name"] == "b"
