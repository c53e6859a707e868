"""CentralStorageStrategy: one copy of each variable, replicated computation, one update a step."""

from __future__ import annotations

import importlib

import numpy as np
import pytest

import hpcdist as hd
from hpcdist.distribute.aggregating import AggregatingVariable
from hpcdist.distribute.central_storage import CentralStorageStrategy
from hpcdist.distribute.devices import InvalidDeviceError, parse_device
from hpcdist.distribute.single_process import INDEPENDENT_VAR
from hpcdist.distribute.variables import SyncOnReadVariable
from hpcdist.errors import LaunchError
from hpcdist.nn import Dense, Sequential, backend
from hpcdist.nn.losses import Reduction, SparseCategoricalCrossentropy

from .conftest import rid

CPU0 = "/job:localhost/replica:0/task:0/device:CPU:0"
CPU1 = "/job:localhost/replica:0/task:0/device:CPU:1"


@pytest.fixture
def cs():
    return CentralStorageStrategy(["/cpu:0", "/cpu:1"])


@pytest.fixture
def float64():
    old = backend.floatx()
    backend.set_floatx("float64")
    yield
    backend.set_floatx(old)


# -- placement and properties ---------------------------------------------------------------------


def test_properties_with_two_compute_devices(cs):
    ext = cs.extended
    assert cs.num_replicas_in_sync == 2
    assert ext.worker_devices == (CPU0, CPU1)
    assert ext.parameter_devices == (CPU0,)  # several compute devices: the CPU
    assert not ext.experimental_between_graph and ext.should_checkpoint
    assert cs.cluster_resolver is None
    want = "<CentralStorageStrategy compute_devices=[CPU:0, CPU:1] parameter_device=CPU:0>"
    assert repr(cs) == want


def test_default_parameter_device_is_the_only_compute_device():
    s = CentralStorageStrategy(["/cpu:3"])
    assert s.num_replicas_in_sync == 1
    assert s.extended.parameter_devices == ("/job:localhost/replica:0/task:0/device:CPU:3",)
    with s.scope():
        v = hd.Variable(1.0)
    assert v.device.endswith("CPU:3")


def test_default_compute_devices_without_gpus(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")  # no GPU: the CPU computes and stores
    s = CentralStorageStrategy()
    assert s.extended.worker_devices == (CPU0,)
    assert s.extended.parameter_devices == (CPU0,)


def test_explicit_parameter_device():
    s = CentralStorageStrategy(["/cpu:0", "/cpu:1"], parameter_device="CPU:1")
    assert s.extended.parameter_devices == (CPU1,)
    with s.scope():
        v = hd.Variable(np.zeros(3))
    assert v.device == CPU1
    # reductions go to the parameter device
    assert s.extended._cross_device_ops.reduce_to_device == parse_device("/cpu:1")


def test_bad_parameter_devices_are_refused(monkeypatch):
    with pytest.raises(TypeError, match="parameter_device must be a device string"):
        CentralStorageStrategy(["/cpu:0"], parameter_device=0)
    with pytest.raises(InvalidDeviceError, match="belongs to task 1"):
        CentralStorageStrategy(["/cpu:0"], parameter_device="/job:localhost/task:1/cpu:0")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    with pytest.raises(InvalidDeviceError, match="sees 0 GPU"):
        CentralStorageStrategy(["/cpu:0"], parameter_device="/gpu:0")


def test_refuses_to_start_in_a_multi_rank_job(monkeypatch):
    check = importlib.import_module("hpcdist.distribute.single_process")  # where it is used
    monkeypatch.setattr(check, "is_initialized", lambda: False)
    monkeypatch.delenv(INDEPENDENT_VAR, raising=False)
    for key, value in {
        "OMPI_COMM_WORLD_RANK": "1",
        "OMPI_COMM_WORLD_SIZE": "2",
        "OMPI_COMM_WORLD_LOCAL_RANK": "1",
        "OMPI_COMM_WORLD_LOCAL_SIZE": "2",
    }.items():
        monkeypatch.setenv(key, value)
    with pytest.raises(LaunchError, match="CentralStorageStrategy runs in one process"):
        CentralStorageStrategy(["/cpu:0", "/cpu:1"])


def test_variables_are_one_copy_on_the_parameter_device(cs):
    with cs.scope():
        v = hd.Variable(np.arange(3.0), name="v")
    assert isinstance(v, AggregatingVariable) and isinstance(v, hd.Variable)
    assert v.device == CPU0 and v.name == "v"
    assert cs.extended.variable_created_in_scope(v)
    assert cs.experimental_local_results(v) == (v,)  # not mirrored: one component
    seen = cs.run(lambda: (rid(), v.raw_value()))
    (r0, first), (r1, second) = cs.experimental_local_results(seen)
    assert (r0, r1) == (0, 1)
    assert first is v._value and second is v._value  # both replicas read the single copy


def test_cross_replica_writes_and_reduce(cs):
    with cs.scope():
        v = hd.Variable(np.array([1.0, 2.0]))
    v.assign_add(np.array([1.0, 1.0]))
    np.testing.assert_array_equal(v.numpy(), [2.0, 3.0])
    # MEAN of a value that is the same on every replica is itself; SUM of it is refused.
    np.testing.assert_array_equal(cs.reduce("MEAN", v, axis=None), [2.0, 3.0])
    with pytest.raises(ValueError, match="cannot be SUM-reduced"):
        cs.reduce("SUM", v, axis=None)


# -- writes in replica context ---------------------------------------------------------------------


def count_sets(monkeypatch):
    calls = []
    original = AggregatingVariable._set

    def counted(self, op, value):
        calls.append(op)
        return original(self, op, value)

    monkeypatch.setattr(AggregatingVariable, "_set", counted)
    return calls


@pytest.mark.parametrize(
    ("aggregation", "op", "expected"),
    [
        ("SUM", "assign", 10.0 + 20.0),
        ("SUM", "assign_add", 100.0 + 10.0 + 20.0),
        ("SUM", "assign_sub", 100.0 - 10.0 - 20.0),
        ("MEAN", "assign", 15.0),
        ("MEAN", "assign_add", 115.0),
        ("MEAN", "assign_sub", 85.0),
        ("ONLY_FIRST_REPLICA", "assign", 10.0),
        ("ONLY_FIRST_REPLICA", "assign_add", 110.0),
        ("ONLY_FIRST_REPLICA", "assign_sub", 90.0),
    ],
)
def test_replica_writes_are_aggregated_and_applied_once(cs, monkeypatch, aggregation, op, expected):
    with cs.scope():
        v = hd.Variable(100.0, aggregation=aggregation)
    calls = count_sets(monkeypatch)

    def step():
        out = getattr(v, op)(np.float64(10.0 * (rid() + 1)))
        return out is v, float(v)  # every replica sees the updated single copy

    result = cs.experimental_local_results(cs.run(step))
    assert calls == [op.replace("assign_", "") if op != "assign" else "assign"]
    assert float(v) == expected
    assert result == ((True, expected), (True, expected))


def test_none_aggregation_in_replica_context_is_an_error(cs):
    with cs.scope():
        v = hd.Variable(1.0)
    with pytest.raises(ValueError, match="You must specify an aggregation method"):
        cs.run(lambda: v.assign_add(1.0))
    assert float(v) == 1.0
    v.assign(5.0)  # cross-replica writes need no aggregation
    assert float(v) == 5.0


def test_one_replica_writes_directly():
    s = CentralStorageStrategy(["/cpu:0"])
    with s.scope():
        v = hd.Variable(1.0)  # aggregation NONE is fine with one replica, as in TF
    s.run(lambda: v.assign_add(2.0))
    assert float(v) == 3.0


def test_mean_of_an_integer_variable_is_refused(cs):
    with cs.scope():
        v = hd.Variable(np.int64(3), aggregation="MEAN")
    with pytest.raises(ValueError, match="MEAN aggregation"):
        cs.run(lambda: v.assign_add(np.int64(1)))


def test_per_replica_values_cannot_update_the_single_copy(cs):
    with cs.scope():
        v = hd.Variable(0.0)
    per_replica = cs.experimental_distribute_values_from_function(
        lambda ctx: np.float64(ctx.replica_id_in_sync_group)
    )
    with pytest.raises(TypeError, match="PerReplica"):
        v.assign(per_replica)
    with pytest.raises(TypeError, match="PerReplica"):
        cs.extended.update(v, lambda var, x: var.assign(x), args=(per_replica,))
    with cs.scope():
        cs.extended.update(v, lambda var, x: var.assign_add(x), args=(np.float64(4.0),))
    assert float(v) == 4.0


def test_extended_update_in_replica_context_runs_once(cs, monkeypatch):
    with cs.scope():
        v = hd.Variable(0.0)
    calls = count_sets(monkeypatch)
    cs.run(lambda: cs.extended.update(v, lambda var, x: var.assign_add(x), args=(2.0,)))
    assert float(v) == 2.0 and calls == ["add"]


# -- sync-on-read variables and metrics ------------------------------------------------------------


def test_sync_on_read_variables_are_per_replica(cs):
    with cs.scope():
        v = hd.Variable(0.0, synchronization="ON_READ", aggregation="SUM")
    assert isinstance(v, SyncOnReadVariable)
    assert [c.device for c in v.values] == [CPU0, CPU1]
    cs.run(lambda: v.assign_add(np.float64(rid() + 1)))
    assert [float(c.raw_value()) for c in v.values] == [1.0, 2.0]
    assert float(v) == 3.0  # summed when read in the cross-replica context


def test_metrics_sum_over_the_compute_replicas(cs):
    values = [np.array([1.0, 2.0, 6.0]), np.array([4.0])]
    with cs.scope():
        mean = hd.nn.metrics.Mean()
    assert all(isinstance(w, SyncOnReadVariable) for w in mean.variables)
    per_replica = cs.experimental_distribute_values_from_function(
        lambda ctx: values[ctx.replica_id_in_sync_group]
    )
    cs.run(mean.update_state, args=(per_replica,))
    assert float(mean.result()) == pytest.approx(np.mean(np.concatenate(values)))
    mean.reset_state()
    assert all(float(c.raw_value()) == 0.0 for w in mean.variables for c in w.values)


# -- the strategy API as for MirroredStrategy ------------------------------------------------------


def test_reference_usage_pattern(cs):
    ds = hd.data.Dataset.range(5).batch(2)
    dist_dataset = cs.experimental_distribute_dataset(ds)
    outputs = []
    with cs.scope():

        def train_step(val):
            return val + 1

        for x in dist_dataset:
            outputs.append(cs.gather(cs.run(train_step, args=(x,)), axis=0))
    assert [o.tolist() for o in outputs] == [[1, 2], [3, 4], [5]]


def test_reduce_gather_and_all_reduce(cs):
    per_replica = cs.experimental_distribute_values_from_function(
        lambda ctx: np.arange(2.0) + 10 * ctx.replica_id_in_sync_group
    )
    np.testing.assert_array_equal(cs.reduce("SUM", per_replica, axis=None), [10.0, 12.0])
    assert float(cs.reduce("MEAN", per_replica, axis=0)) == pytest.approx(5.5)
    np.testing.assert_array_equal(cs.gather(per_replica, axis=0), [0.0, 1.0, 10.0, 11.0])

    def fn():
        return hd.get_replica_context().all_reduce("SUM", np.float64(rid() + 1))

    assert cs.experimental_local_results(cs.run(fn)) == (3.0, 3.0)
    with cs.scope():
        v = hd.Variable(np.zeros(2))
        to_var = cs.extended.reduce_to("SUM", per_replica, destinations=v)
    np.testing.assert_array_equal(to_var, [10.0, 12.0])  # one array: v has one device


# -- optimizers: one update of the single copy per step --------------------------------------------


def make_data(n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, 5))
    y = (x[:, 0] + x[:, 1] > 0).astype(np.int64) + (x[:, 2] > 1).astype(np.int64)
    return x, y


def build() -> Sequential:
    return Sequential([Dense(8, activation="tanh", input_shape=(5,)), Dense(3)])


def train_custom(strategy, optimizer_fn, weights, x, y, batch_size):
    """Custom loop as examples/custom_loop.py; ``strategy=None`` trains on one device."""
    per_example = SparseCategoricalCrossentropy(from_logits=True, reduction=Reduction.NONE)

    def compute_loss(labels, predictions):
        return hd.nn.compute_average_loss(per_example(labels, predictions), batch_size)

    dataset = hd.data.Dataset.from_tensor_slices((x, y)).batch(batch_size)
    if strategy is None:
        model, optimizer = build(), optimizer_fn()
        model.set_weights(weights)
        step = hd.nn.value_and_grad(model, compute_loss)
        losses = []
        for bx, by in dataset:
            loss, grads = step(bx, by)
            optimizer.apply_gradients(zip(grads, model.trainable_variables, strict=True))
            losses.append(float(loss))
        return model, optimizer, losses
    with strategy.scope():
        model, optimizer = build(), optimizer_fn()
    model.set_weights(weights)
    step = hd.nn.value_and_grad(model, compute_loss)

    def train_step(inputs):
        loss, grads = step(*inputs)
        optimizer.apply_gradients(zip(grads, model.trainable_variables, strict=True))
        return loss

    losses = []
    for batch in strategy.experimental_distribute_dataset(dataset):
        per_replica = strategy.run(train_step, args=(batch,))
        losses.append(float(strategy.reduce("SUM", per_replica, axis=None)))
    return model, optimizer, losses


@pytest.mark.parametrize(
    "optimizer_fn",
    [
        lambda: hd.optimizers.SGD(learning_rate=0.1, momentum=0.9),
        lambda: hd.optimizers.Adam(learning_rate=0.05),
    ],
    ids=["sgd_momentum", "adam"],
)
def test_custom_loop_matches_one_device(float64, cs, monkeypatch, optimizer_fn):
    x, y = make_data(45)  # 6 steps of 8 and one of 5 (split 3 + 2)
    weights = build().get_weights()
    updates = []
    original = type(optimizer_fn())._update

    def counted(self, *args):
        updates.append(1)
        return original(self, *args)

    ref_model, ref_opt, ref_losses = train_custom(None, optimizer_fn, weights, x, y, 8)
    monkeypatch.setattr(type(ref_opt), "_update", counted)
    model, opt, losses = train_custom(cs, optimizer_fn, weights, x, y, 8)
    assert len(updates) == 6  # one fused update of the single copy per step, not one per replica
    np.testing.assert_allclose(losses, ref_losses, rtol=1e-10)
    for a, b in zip(model.get_weights(), ref_model.get_weights(), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-14)
    assert int(opt.iterations) == int(ref_opt.iterations) == 6
    assert isinstance(opt.iterations, AggregatingVariable)
    pairs = zip(model.trainable_variables, ref_model.trainable_variables, strict=True)
    for v, ref_v in pairs:
        assert isinstance(v, AggregatingVariable) and v.device == CPU0
        for name in opt.get_slot_names():
            slot, ref_slot = opt.get_slot(v, name), ref_opt.get_slot(ref_v, name)
            assert isinstance(slot, AggregatingVariable) and slot.device == CPU0
            np.testing.assert_allclose(slot.numpy(), ref_slot.numpy(), rtol=1e-9, atol=1e-14)


def test_unaggregated_gradients_are_refused(cs):
    with cs.scope():
        w = hd.Variable(np.zeros(2))
        opt = hd.optimizers.SGD(0.1)
    with pytest.raises(ValueError, match="single copy"):
        cs.run(lambda: opt.apply_gradients([(np.ones(2), w)], skip_gradients_aggregation=True))
    np.testing.assert_array_equal(w.numpy(), [0.0, 0.0])


def test_variables_of_another_strategy_are_refused(cs):
    other = CentralStorageStrategy(["/cpu:0", "/cpu:1"])
    with other.scope():
        w = hd.Variable(np.zeros(2))
    with cs.scope():
        opt = hd.optimizers.SGD(0.1)
    with pytest.raises(ValueError, match="belongs to"):
        cs.run(lambda: opt.apply_gradients([(np.ones(2), w)]))


def test_fit_matches_one_device(float64, cs):
    x, y = make_data(23)  # batches of 8, 8, 7: the last one splits 4 + 3
    with cs.scope():
        model = build()
        model.compile(
            optimizer=hd.optimizers.Adam(0.01),
            loss=SparseCategoricalCrossentropy(from_logits=True),
            metrics=["accuracy"],
        )
    reference = build()
    reference.compile(
        optimizer=hd.optimizers.Adam(0.01),
        loss=SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
    )
    reference.set_weights(model.get_weights())
    h = model.fit(x, y, batch_size=8, epochs=3, shuffle=False, verbose=0)
    r = reference.fit(x, y, batch_size=8, epochs=3, shuffle=False, verbose=0)
    assert all(isinstance(v, AggregatingVariable) for v in model.trainable_variables)
    for a, b in zip(model.get_weights(), reference.get_weights(), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-14)
    np.testing.assert_allclose(h.history["loss"], r.history["loss"], rtol=1e-10)
    np.testing.assert_allclose(h.history["accuracy"], r.history["accuracy"], rtol=1e-12)
    assert int(model.optimizer.iterations) == 9
    loss, accuracy = model.evaluate(x, y, verbose=0)
    ref_loss, ref_accuracy = reference.evaluate(x, y, verbose=0)
    assert loss == pytest.approx(ref_loss, rel=1e-10)
    assert accuracy == pytest.approx(ref_accuracy, rel=1e-12)
