"""A tour of the strategy API: what each call returns.

Run it as ``mpirun -n 2 python examples/strategies_tour.py`` (or plain
``python``). Every rank is a worker with two logical CPU devices, so with 2
ranks there are 4 replicas in sync. The chief prints; every worker computes.
"""

from __future__ import annotations

import numpy as np

import hpcdist as hd


def show(label: str, value: object) -> None:
    if hd.world().is_chief:
        print(f"{label:<48} {value!r}".replace("\n", "\n" + " " * 49))


def main() -> None:
    strategy = hd.MultiWorkerMirroredStrategy(devices=["/cpu:0", "/cpu:1"])
    ext = strategy.extended
    show("strategy", strategy)
    show("num_replicas_in_sync", strategy.num_replicas_in_sync)
    show("extended.worker_devices (this worker)", ext.worker_devices)
    show("extended.should_checkpoint", ext.should_checkpoint)
    show("cluster_resolver", type(strategy.cluster_resolver).__name__)
    show("outside scope: get_strategy()", hd.get_strategy())
    show("outside scope: in_cross_replica_context()", hd.in_cross_replica_context())

    with strategy.scope():
        show("in scope: has_strategy()", hd.has_strategy())
        show("in scope: in_cross_replica_context()", hd.in_cross_replica_context())
        weights = hd.Variable(np.ones(3), name="weights")
        steps = hd.Variable(0, name="steps", aggregation=hd.VariableAggregation.ONLY_FIRST_REPLICA)
        seen = hd.Variable(
            0.0,
            name="seen",
            synchronization=hd.VariableSynchronization.ON_READ,
            aggregation=hd.VariableAggregation.SUM,
        )
    show("hd.Variable in scope", weights)
    show("  its local components", strategy.experimental_local_results(weights))

    def replica_fn(scale):
        ctx = hd.get_replica_context()
        r = ctx.replica_id_in_sync_group
        batch = np.arange(4.0 if r % 2 == 0 else 2.0) + 10 * r  # uneven: 4 or 2 elements
        seen.assign_add(float(batch.size))  # each replica counts its own
        steps.assign_add(1)  # replica 0's value wins
        mean_sum = ctx.all_reduce(hd.ReduceOp.MEAN, batch.sum() * scale)
        everything = ctx.all_gather(batch, axis=0)
        return batch, mean_sum, everything.size

    batch, mean_sum, gathered = strategy.run(replica_fn, args=(1.0,))
    show("run(...) per-replica batches", batch)
    show("experimental_local_results(batch)", strategy.experimental_local_results(batch))
    show("ctx.all_reduce(MEAN, sum) in each replica", strategy.experimental_local_results(mean_sum))
    show("ctx.all_gather(batch).size", gathered)
    show("reduce(SUM, batch, axis=0)", strategy.reduce(hd.ReduceOp.SUM, batch, axis=0))
    show("reduce(MEAN, batch, axis=0) exact mean", strategy.reduce("MEAN", batch, axis=0))
    show("reduce(MAX, batch, axis=0)", strategy.reduce("MAX", batch, axis=0))
    show("gather(batch, axis=0)", strategy.gather(batch, axis=0))
    show("seen (ON_READ, SUM) read in cross-replica", seen.read_value())
    show("steps (ONLY_FIRST_REPLICA) after one step", steps.numpy())

    values = strategy.experimental_distribute_values_from_function(
        lambda ctx: np.full(2, ctx.replica_id_in_sync_group, dtype=np.float32)
    )
    show("distribute_values_from_function", values)
    per_replica = strategy.run(lambda v: v * 2, args=(values,))
    show("reduce(SUM, run(v * 2), axis=None)", strategy.reduce("SUM", per_replica, axis=None))

    def merge_fn(s, value):
        return s.reduce(hd.ReduceOp.SUM, value, axis=None)

    merged = strategy.run(
        lambda: hd.get_replica_context().merge_call(merge_fn, args=(np.float64(1.0),))
    )
    show("merge_call(reduce SUM of 1.0)", merged)
    weights.assign_add(np.full(3, 0.5))
    show("weights after a cross-replica assign_add", weights.numpy())
    try:
        strategy.run(lambda: weights.assign(np.zeros(3)))
    except ValueError as error:
        show("replica-context assign with aggregation NONE", f"ValueError: {error}"[:80] + "...")


if __name__ == "__main__":
    main()
