"""``CentralStorageStrategy``: replicated computation, ONE copy of each variable.

One process (as ``MirroredStrategy``): computation is replicated over the
compute devices (default: every visible GPU, else the CPU; logical CPU
devices ``["/cpu:0", "/cpu:1"]`` give two replicas on a CPU machine), and
every variable is stored once, on the parameter device (default: the CPU
when there are several compute devices, else the only compute device).

* Variables made in the scope are
  :class:`~hpcdist.distribute.aggregating.AggregatingVariable` objects:
  reads give the single value; writes in ``strategy.run`` combine the
  replicas' values with the variable's aggregation and update it once.
* Sync-on-read variables (metrics) keep one copy per compute device, as in
  TF, and are combined when read in the cross-replica context.
* Reductions (``strategy.reduce``, the optimizer's gradient sum) go to the
  parameter device (``ReductionToOneDevice`` there), so ``apply_gradients``
  inside ``run`` sums the replicas' gradients there and updates each
  variable once.

Example:
    >>> import numpy as np, hpcdist as hd
    >>> s = CentralStorageStrategy(["/cpu:0", "/cpu:1"])
    >>> s.num_replicas_in_sync, s.extended.parameter_devices
    (2, ('/job:localhost/replica:0/task:0/device:CPU:0',))
    >>> with s.scope():
    ...     w = hd.Variable(np.zeros(2), name="w")
    ...     opt = hd.optimizers.SGD(learning_rate=1.0)
    >>> _ = s.run(lambda: opt.apply_gradients([(np.ones(2), w)]))
    >>> w.numpy(), int(opt.iterations)  # the sum of both replicas' gradients, one step
    (array([-2., -2.]), 1)
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from hpcdist.arrays import array_module, to_device
from hpcdist.distribute import variables as vs
from hpcdist.distribute.aggregating import AggregatingVariable
from hpcdist.distribute.cross_device_ops import ReductionToOneDevice
from hpcdist.distribute.devices import Device, canonical_devices, check_devices_exist
from hpcdist.distribute.extended import StrategyExtended
from hpcdist.distribute.mirrored import local_devices
from hpcdist.distribute.single_process import check_single_process
from hpcdist.distribute.strategy import Strategy
from hpcdist.distribute.values import select_mirrored


def parameter_device_for(
    compute_devices: Sequence[Device], parameter_device: str | Device | None = None
) -> Device:
    """The device that holds the variables, as TF chooses it.

    Given: that device (of this process). Not given: the only compute device
    when there is one, else the CPU.

    Example:
        >>> from hpcdist.distribute.devices import parse_device
        >>> parameter_device_for([parse_device("/cpu:0"), parse_device("/cpu:1")]).short
        'CPU:0'
        >>> parameter_device_for([parse_device("/cpu:3")]).short
        'CPU:3'
    """
    first = compute_devices[0]
    job = first.job or "localhost"
    task = 0 if first.task is None else first.task
    if parameter_device is None:
        if len(compute_devices) == 1:
            return first
        return Device(job, 0, task, "CPU", 0)
    if not isinstance(parameter_device, (str, Device)):
        raise TypeError(
            f"parameter_device must be a device string such as '/cpu:0' or None, got "
            f"{parameter_device!r}"
        )
    device = canonical_devices([parameter_device], job=job, task=task)[0]
    return check_devices_exist([device])[0]


class CentralStorageExtended(StrategyExtended):
    """``StrategyExtended`` of :class:`CentralStorageStrategy`: variables on one device.

    Example: ``CentralStorageStrategy(["/cpu:0", "/cpu:1"]).extended.parameter_devices``.
    """

    def __init__(
        self, strategy: Any, compute_devices: Sequence[Device], parameter_device: Device
    ) -> None:
        super().__init__(
            strategy,
            compute_devices,
            cross_device_ops=ReductionToOneDevice(reduce_to_device=parameter_device),
            distributed_variables=False,
        )
        self._parameter_device = parameter_device
        self._variable_device = parameter_device

    @property
    def parameter_devices(self) -> tuple[str, ...]:
        """The one device that holds the variables."""
        return (self._parameter_device.name,)

    def create_variable(self, initial_value: Any, dtype: Any, shape: Any, spec: dict) -> Any:
        """An ``AggregatingVariable`` on the parameter device (sync-on-read: one per replica)."""

        value = vs.initial_array(initial_value, dtype, shape)
        if spec["synchronization"] is vs.VariableSynchronization.ON_READ:
            return self._create_sync_on_read(value, spec)
        d = self._parameter_device
        return AggregatingVariable._make_aggregating(
            to_device(value, d.device_type, d.index), device=d, strategy=self._strategy, **spec
        )

    def _create_sync_on_read(self, value: Any, spec: dict) -> Any:
        xp = array_module(value)
        if spec["aggregation"] is vs.VariableAggregation.MEAN and not xp.issubdtype(
            value.dtype, xp.floating
        ):
            raise ValueError(
                f"a sync-on-read variable with aggregation MEAN must have a floating dtype; "
                f"variable {spec['name']!r} is {value.dtype}. Use a float initial value or "
                "another aggregation (SUM, ONLY_FIRST_REPLICA)"
            )
        components = self._replica_components(value, spec)
        return vs.SyncOnReadVariable(self._strategy, components, **spec)

    def update(
        self,
        var: Any,
        fn: Callable,
        args: tuple = (),
        kwargs: dict | None = None,
        group: bool = True,
    ) -> Any:
        """Run ``fn(var, *args, **kwargs)`` once on the single copy of ``var``.

        In a replica context this is a merge call; a ``PerReplica`` argument is
        an error (there is one copy to update: aggregate the values first).

        Example: ``extended.update(v, lambda var, x: var.assign_add(x), args=(1.0,))``.
        """
        if isinstance(var, AggregatingVariable):
            args = select_mirrored(0, tuple(args))
            kwargs = select_mirrored(0, dict(kwargs or {}))
        return super().update(var, fn, args, kwargs, group)


class CentralStorageStrategy(Strategy):
    """Replicas on several devices, variables on one (TF's experimental CentralStorageStrategy).

    ``compute_devices=None`` uses every visible GPU, else the CPU.
    ``parameter_device=None`` is the CPU with several compute devices, else
    the only compute device. One process only (see
    :func:`~hpcdist.distribute.single_process.check_single_process`).

    Example: ``CentralStorageStrategy(["/gpu:0", "/gpu:1"])`` keeps the variables on the CPU.
    """

    def __init__(
        self,
        compute_devices: Sequence[str | Device] | None = None,
        parameter_device: str | Device | None = None,
    ) -> None:
        check_single_process(type(self).__name__)
        devices = local_devices(compute_devices)
        parameter = parameter_device_for(devices, parameter_device)
        super().__init__(CentralStorageExtended(self, devices, parameter))

    def __repr__(self) -> str:
        ext = self._extended
        devices = ", ".join(d.short for d in ext._devices)
        return (
            f"<CentralStorageStrategy compute_devices=[{devices}] "
            f"parameter_device={ext._parameter_device.short}>"
        )


__all__ = ["CentralStorageExtended", "CentralStorageStrategy", "parameter_device_for"]
