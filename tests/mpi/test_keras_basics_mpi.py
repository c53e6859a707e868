"""The Keras basics under MultiWorkerMirroredStrategy (run under ``mpirun -n 2`` and ``-n 4``).

* Precision, Recall, AUC and top-k accuracy: each replica counts its own data; the result on
  every rank is the metric of all ranks' data (counts summed before dividing).
* BatchNormalization(synchronized=True): N ranks x (global batch / N) train exactly as one
  process on the global batch (weights and moving statistics); without it, each rank's
  statistics are its own.
* Regularizers: the distributed step equals one process's (penalty gradients not counted N
  times).
* Callbacks that act on the logs take the same decision on every rank.
"""

from __future__ import annotations

import numpy as np
import pytest

import hpcdist as hd
from hpcdist.nn import BatchNormalization, Dense, Sequential, backend, regularizers
from hpcdist.nn.confusion_metrics import AUC, Precision, Recall
from hpcdist.nn.metrics import TopKCategoricalAccuracy, results
from hpcdist.runtime import world

pytestmark = [pytest.mark.mpi(min_size=2), pytest.mark.timeout(120)]


@pytest.fixture(autouse=True)
def float64():
    old = backend.floatx()
    backend.set_floatx("float64")
    yield
    backend.set_floatx(old)


def all_ranks_agree(values) -> None:
    everyone = world().comm.allgather(np.asarray(values, dtype=np.float64))
    for other in everyone[1:]:
        np.testing.assert_array_equal(other, everyone[0])


def test_confusion_and_top_k_metrics_sum_their_counts_over_ranks():
    strategy = hd.MultiWorkerMirroredStrategy()
    size, rank = world().size, world().rank
    rng = np.random.default_rng(0)  # the same data everywhere; each rank takes its part
    sizes = [3 + 2 * r for r in range(size)]  # uneven parts
    n = sum(sizes)
    t = rng.integers(0, 2, (n, 3))
    p = np.clip(0.3 * t + 0.7 * rng.uniform(size=(n, 3)), 0, 1)
    w = rng.uniform(0.5, 2.0, n)
    lo = sum(sizes[:rank])
    mine = slice(lo, lo + sizes[rank])
    with strategy.scope():
        ms = [Precision(thresholds=[0.4, 0.6]), Recall(top_k=1), AUC(num_thresholds=50),
              TopKCategoricalAccuracy(k=2)]  # fmt: skip

    def update(tt, pp, ww):
        ms[0].update_state(tt, pp, sample_weight=ww)
        ms[1].update_state(tt, pp)
        ms[2].update_state(tt, pp, sample_weight=ww)
        onehot = np.eye(3)[np.argmax(tt + 0.1 * np.arange(3), axis=1)]
        ms[3].update_state(onehot, pp)

    strategy.run(update, args=(t[mine], p[mine], w[mine]))
    got = results(ms[1:]) + [ms[0].result()]
    alone = [Precision(thresholds=[0.4, 0.6]), Recall(top_k=1), AUC(num_thresholds=50),
             TopKCategoricalAccuracy(k=2)]  # fmt: skip
    ms_saved, ms[:] = list(ms), alone
    update(t, p, w)  # one process, all the data
    expected = results(alone[1:]) + [alone[0].result()]
    ms[:] = ms_saved
    np.testing.assert_allclose(got[:3], expected[:3], rtol=1e-12)
    np.testing.assert_allclose(got[3], expected[3], rtol=1e-12)
    all_ranks_agree(np.concatenate([np.ravel(g) for g in got]))


def bn_model(synchronized: bool, reg: bool = False) -> Sequential:
    kw = {"kernel_regularizer": regularizers.l1_l2(0.01, 0.02)} if reg else {}
    return Sequential([
        Dense(5, input_shape=(4,), **kw),
        BatchNormalization(momentum=0.8, synchronized=synchronized),
        Dense(3, activation="tanh", **kw),
        BatchNormalization(synchronized=synchronized),
        Dense(1),
    ])  # fmt: skip


def train(model, x, y, epochs=3):
    model.compile(optimizer=hd.optimizers.SGD(0.1, momentum=0.5), loss="mse")
    return model.fit(x, y, batch_size=len(x) // 2, epochs=epochs, verbose=0, shuffle=False)


@pytest.mark.parametrize("devices", [1, 2])
def test_synchronized_batch_norm_equals_one_process_on_the_global_batch(devices):
    """N ranks x half the global batch each == 1 process x the global batch."""
    strategy = hd.MultiWorkerMirroredStrategy(
        devices=None if devices == 1 else [f"/cpu:{i}" for i in range(devices)]
    )
    n = strategy.num_replicas_in_sync
    rng = np.random.default_rng(1)
    x = rng.normal(size=(8 * n, 4)) * [1, 2, 3, 4] + np.repeat(np.arange(n), 8)[:, None]
    y = rng.normal(size=(8 * n, 1))
    np.random.seed(2)
    alone = bn_model(True, reg=True)
    init = alone.get_weights()
    history_alone = train(alone, x, y)
    with strategy.scope():
        model = bn_model(True, reg=True)
    model.set_weights(init)
    history = train(model, x, y)
    np.testing.assert_allclose(history.history["loss"], history_alone.history["loss"], rtol=1e-9)
    for got, want, var in zip(model.get_weights(), alone.get_weights(), model.weights,
                              strict=True):  # fmt: skip
        np.testing.assert_allclose(got, want, rtol=1e-8, atol=1e-10, err_msg=var.name)
    bn = model.layers[1]
    for copy in bn.moving_mean.values:  # every replica's moving statistics are the global ones
        np.testing.assert_allclose(copy.numpy(), alone.layers[1].moving_mean.numpy(), rtol=1e-9)
    np.testing.assert_allclose(model.predict(x), alone.predict(x), rtol=1e-8, atol=1e-12)
    all_ranks_agree(np.concatenate([w.ravel() for w in model.get_weights()]))


def test_synchronized_batch_norm_with_a_last_batch_smaller_than_the_replicas():
    """The last global batch has one example: one replica has it, the others have none, and
    they all still take part in the statistics' allreduces (forward and backward)."""
    strategy = hd.MultiWorkerMirroredStrategy()
    n = strategy.num_replicas_in_sync
    rng = np.random.default_rng(8)
    x, y = rng.normal(size=(4 * n + 1, 4)), rng.normal(size=(4 * n + 1, 1))
    np.random.seed(9)
    alone = bn_model(True)
    init = alone.get_weights()
    alone.compile(optimizer=hd.optimizers.Adam(0.01), loss="mae")
    expected = alone.fit(x, y, batch_size=2 * n, epochs=2, verbose=0, shuffle=False)
    with strategy.scope():
        model = bn_model(True)
        model.compile(optimizer=hd.optimizers.Adam(0.01), loss="mae")
    model.set_weights(init)
    history = model.fit(x, y, batch_size=2 * n, epochs=2, verbose=0, shuffle=False)
    np.testing.assert_allclose(history.history["loss"], expected.history["loss"], rtol=1e-9)
    for got, want, var in zip(model.get_weights(), alone.get_weights(), model.weights,
                              strict=True):  # fmt: skip
        # atol: the first bias has no effect through BatchNormalization; its gradient is
        # rounding noise (1e-17), and so are its values (1e-12)
        np.testing.assert_allclose(got, want, rtol=1e-8, atol=1e-10, err_msg=var.name)


def test_per_replica_batch_norm_statistics_differ_from_the_global_ones():
    strategy = hd.MultiWorkerMirroredStrategy()
    n = strategy.num_replicas_in_sync
    rng = np.random.default_rng(3)
    x = rng.normal(size=(4 * n, 4)) + np.repeat(np.arange(n), 4)[:, None] * 3.0
    with strategy.scope():
        bn = BatchNormalization(momentum=0.0)
        bn.build((None, 4))
    strategy.run(lambda part: bn(part, training=True),
                 args=(x[4 * world().rank : 4 * world().rank + 4],))  # fmt: skip
    local = bn.moving_mean.values[0].numpy()
    np.testing.assert_allclose(local, x[4 * world().rank : 4 * world().rank + 4].mean(0))
    # a cross-replica read is the MEAN of the replicas' statistics (sync on read)
    np.testing.assert_allclose(bn.moving_mean.numpy(), x.mean(0), rtol=1e-12)
    all_ranks_agree(bn.moving_mean.numpy())


def callback_model(strategy, lr=0.05):
    with strategy.scope():
        model = Sequential([Dense(4, activation="tanh", input_shape=(3,)), Dense(1)])
        model.compile(optimizer=hd.optimizers.SGD(lr), loss="mse")
    return model


def test_terminate_on_nan_stops_every_rank_at_the_same_batch():
    from hpcdist.callbacks import LambdaCallback, TerminateOnNaN

    strategy = hd.MultiWorkerMirroredStrategy()
    n = strategy.num_replicas_in_sync
    rng = np.random.default_rng(4)
    x, y = rng.normal(size=(8 * n, 3)), rng.normal(size=(8 * n, 1))
    y[2 * n + n - 1] = np.nan  # batch 2, in the last replica's share only
    model = callback_model(strategy)
    batches = []
    spy = LambdaCallback(on_train_batch_end=lambda b, logs: batches.append(b))
    history = model.fit(x, y, batch_size=n, epochs=2, verbose=0, shuffle=False,
                        callbacks=[TerminateOnNaN(), spy])  # fmt: skip
    assert batches == [0, 1, 2]
    assert len(history.history["loss"]) == 1 and np.isnan(history.history["loss"][0])
    all_ranks_agree(batches)


def test_learning_rate_callbacks_take_one_decision_on_every_rank():
    from hpcdist.callbacks import LearningRateScheduler, ReduceLROnPlateau

    strategy = hd.MultiWorkerMirroredStrategy()
    rng = np.random.default_rng(5)
    x, y = rng.normal(size=(16, 3)), rng.normal(size=(16, 1))
    model = callback_model(strategy)
    mine = np.random.default_rng(100 + world().rank)  # a schedule that differs between ranks
    sched = LearningRateScheduler(lambda epoch, lr: float(mine.uniform(0.01, 0.1)))
    plateau = ReduceLROnPlateau(monitor="loss", factor=0.5, patience=1, min_delta=10.0)
    history = model.fit(x, y, batch_size=8, epochs=4, verbose=0, callbacks=[sched, plateau])
    rates = history.history["learning_rate"]
    chief = float(np.random.default_rng(100).uniform(0.01, 0.1))
    assert rates[0] == pytest.approx(chief)  # the chief's draw, on every rank
    all_ranks_agree(rates)
    all_ranks_agree(np.concatenate([w.ravel() for w in model.get_weights()]))


def test_save_on_all_ranks_load_alone_and_under_the_strategy():
    import shutil
    import tempfile

    from hpcdist.nn import load_model

    comm = world().comm
    path = comm.bcast(tempfile.mkdtemp() if world().rank == 0 else None, root=0)
    try:
        strategy = hd.MultiWorkerMirroredStrategy()
        rng = np.random.default_rng(6)
        x, y = rng.normal(size=(16, 4)), rng.normal(size=(16, 1))
        np.random.seed(7)
        with strategy.scope():
            model = bn_model(True, reg=True)
            model.compile(optimizer=hd.optimizers.Adagrad(0.1), loss="huber", metrics=["mae"])
        model.fit(x, y, batch_size=8, epochs=2, verbose=0, shuffle=False)
        model.save(f"{path}/m.keras")
        expected = model.predict(x)
        with strategy.scope():
            again = load_model(f"{path}/m.keras")
        alone = load_model(f"{path}/m.keras")  # this rank alone, no strategy
        for loaded in (again, alone):
            np.testing.assert_allclose(loaded.predict(x), expected, rtol=1e-12, atol=1e-14)
            assert int(loaded.optimizer.iterations) == int(model.optimizer.iterations) == 4
            for u, v in zip(model.trainable_variables, loaded.trainable_variables, strict=True):
                np.testing.assert_array_equal(
                    loaded.optimizer.get_slot(v, "accumulator").numpy(),
                    model.optimizer.get_slot(u, "accumulator").numpy(),
                )
        h1 = model.fit(x, y, batch_size=8, epochs=1, verbose=0, shuffle=False)
        h2 = again.fit(x, y, batch_size=8, epochs=1, verbose=0, shuffle=False)
        assert h1.history == h2.history
    finally:
        comm.Barrier()
        if world().rank == 0:
            shutil.rmtree(path, ignore_errors=True)
