"""``AggregatingVariable``: ONE copy of a variable, updated once per step by many replicas.

The variable type of :class:`~hpcdist.distribute.central_storage.CentralStorageStrategy`
(TF's ``AggregatingVariable``). The value lives on the parameter device
only; every replica reads that single value (copied to its own device when
that is another kind of device, e.g. a GPU replica of a CPU variable).

A write in a replica context of a strategy with ``k > 1`` local replicas is
a merge call: the ``k`` replicas' values are combined with the variable's
``aggregation`` (``SUM``, ``MEAN`` or ``ONLY_FIRST_REPLICA``) and the single
copy is updated ONCE. ``NONE`` there is an error, as in TF. With one replica,
or in the cross-replica context, a write updates the copy directly.

Example:
    >>> import numpy as np, hpcdist as hd
    >>> from hpcdist.distribute.central_storage import CentralStorageStrategy
    >>> s = CentralStorageStrategy(["/cpu:0", "/cpu:1"])
    >>> with s.scope():
    ...     v = hd.Variable(0.0, aggregation="SUM")
    >>> _ = s.run(lambda: v.assign_add(1.0))
    >>> float(v), type(v).__name__
    (2.0, 'AggregatingVariable')
"""

from __future__ import annotations

from typing import Any

from hpcdist.arrays import asarray, to_device
from hpcdist.collectives.ops import ReduceOp
from hpcdist.distribute import context
from hpcdist.distribute.devices import Device
from hpcdist.distribute.values import local_results, select_mirrored
from hpcdist.distribute.variables import (
    Variable,
    VariableAggregation,
    check_replica_write,
)


class AggregatingVariable(Variable):
    """A variable stored once, on its strategy's parameter device (``tf``'s AggregatingVariable).

    Reads give the single value; replica-context writes with several replicas
    aggregate the replicas' values and update once (see the module docstring).

    Example: ``with CentralStorageStrategy(["/cpu:0", "/cpu:1"]).scope(): v = hd.Variable(1.0)``
    makes one.
    """

    @classmethod
    def _make_aggregating(cls, value: Any, **spec: Any) -> AggregatingVariable:
        """An AggregatingVariable of ``value``; ``spec``: the keywords of ``Variable._make``."""
        plain = Variable._make(value, **spec)
        var = object.__new__(cls)
        var.__dict__.update(plain.__dict__)
        return var

    @property
    def _devices(self) -> tuple[Device, ...]:
        """The one device of the value (where ``reduce_to(..., destinations=var)`` puts results)."""
        return () if self._device is None else (self._device,)

    def _replica_device(self) -> Device | None:
        """The device of the current replica of this variable's strategy, else ``None``."""
        mode = context.current_mode()
        strategy = self._distribute_strategy
        if mode.replica is None or strategy is None or mode.strategy is not strategy:
            return None
        devices = strategy.extended._devices
        local_id = mode.replica._local_id
        return devices[local_id] if local_id < len(devices) else None

    def raw_value(self) -> Any:
        """The stored value; inside a replica on another kind of device, a copy on that device."""
        value = self._value
        device = self._replica_device()
        if device is None or self._device is None:
            return value
        if device.device_type == "CPU" and self._device.device_type == "CPU":
            return value  # logical CPU devices share the host memory
        if device == self._device:
            return value
        return to_device(value, device.device_type, device.index, copy=False)

    def _write(self, op: str, value: Any, read_value: bool) -> Any:
        ctx = context.get_replica_context()
        strategy = self._distribute_strategy
        several = strategy is not None and strategy.extended._num_local_replicas > 1
        if ctx is None or ctx.strategy is not strategy or not several:
            self._set(op, select_mirrored(0, value))
            return self if read_value else None
        agg = self._aggregation
        check_replica_write(self, "AggregatingVariable")

        def merge(s: Any, v: Any) -> None:
            self._set(op, combine(s, v, agg))

        ctx._merge(merge, (value,), None, True, ("write", id(self), op))
        return self if read_value else None


def combine(strategy: Any, value: Any, aggregation: VariableAggregation) -> Any:
    """The replicas' ``value`` (a ``PerReplica``) combined with ``aggregation``, as one array.

    Example: ``combine(s, PerReplica((a, b)), VariableAggregation.MEAN)`` is ``(a + b) / 2``.
    """
    if aggregation is VariableAggregation.ONLY_FIRST_REPLICA:
        first = local_results(value)[0]
        return asarray(first.raw_value() if isinstance(first, Variable) else first)
    op = ReduceOp.from_variable_aggregation(aggregation)
    return strategy.extended.reduce_leaves(op, [value])[0]


__all__ = ["AggregatingVariable", "combine"]
