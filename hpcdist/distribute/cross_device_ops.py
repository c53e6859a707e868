"""Reduction among the local devices of one process (``tf.distribute.CrossDeviceOps``).

* :class:`ReductionToOneDevice`: copy every value to one device, reduce there,
  copy the result back to each destination (the CPU default).
* :class:`HierarchicalCopyAllReduce` and :class:`NcclAllReduce`: the GPU
  choices of ``MirroredStrategy``. Both split the tensors into ``num_packs``
  packs. Their arithmetic is the same as ``ReductionToOneDevice``'s, in
  replica order, so every choice gives bitwise-identical results; the GPU
  issue gives ``NcclAllReduce`` NCCL's own kernels.

Reduction between workers (MPI ranks) is not done here but by the
collectives engine (:mod:`hpcdist.collectives`).

Example:
    >>> import numpy as np
    >>> from hpcdist.distribute.values import PerReplica
    >>> ReductionToOneDevice().reduce("SUM", PerReplica((np.ones(2), np.ones(2))), "/cpu:0")
    array([2., 2.])
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from hpcdist.arrays import asarray, to_device
from hpcdist.collectives.ops import ReduceOp, reduce_arrays
from hpcdist.distribute.devices import Device, parse_device
from hpcdist.distribute.values import DistributedValues, Mirrored, local_results


def destination_devices(
    destinations: Any, local_devices: Sequence[Device] = ()
) -> tuple[Device, ...]:
    """The devices named by ``destinations``.

    ``destinations`` is a device string or :class:`Device`, a list of them, a
    distributed value or variable (its replicas' devices: ``local_devices``),
    or a plain variable or array (the first local device).

    Example: ``destination_devices("/cpu:0")[0].short == "CPU:0"``.
    """
    if destinations is None or (isinstance(destinations, (list, tuple, str)) and not destinations):
        raise ValueError(
            "destinations can not be empty: give a device string, a list of devices, or a "
            "variable / distributed value whose devices receive the result"
        )
    if isinstance(destinations, (str, Device)):
        return (parse_device(destinations),)
    if isinstance(destinations, (list, tuple)) and all(
        isinstance(d, (str, Device)) for d in destinations
    ):
        return tuple(parse_device(d) for d in destinations)
    devices = getattr(destinations, "_devices", None)
    if devices:
        return tuple(devices)
    n = len(local_results(destinations))
    if local_devices:
        return tuple(local_devices[:n])
    return (parse_device("CPU:0"),) * 1


def place(value: Any, devices: Sequence[Device]) -> Any:
    """``value`` copied to each of ``devices``: a :class:`Mirrored` for several, else one array.

    Example: ``place(np.ones(2), [cpu0, cpu1])`` is a ``Mirrored`` of two copies.
    """
    if len(devices) == 1:
        d = devices[0]
        return to_device(value, d.device_type, d.index, copy=False)
    mirrored = Mirrored(tuple(to_device(value, d.device_type, d.index) for d in devices))
    mirrored._devices = tuple(devices)
    return mirrored


class CrossDeviceOps:
    """Base class: reduce and broadcast among the devices of this process.

    Example: ``MirroredStrategy(devices, cross_device_ops=hd.ReductionToOneDevice())``.
    """

    def reduce_local(self, reduce_op: ReduceOp | str, values: Sequence[Any], device: Device) -> Any:
        """The reduction of ``values`` (one per local replica) as one array on ``device``."""
        on_device = [to_device(v, device.device_type, device.index, copy=False) for v in values]
        return reduce_arrays(on_device, reduce_op)

    def reduce(
        self,
        reduce_op: ReduceOp | str,
        per_replica_value: Any,
        destinations: Any,
        options: Any = None,
    ) -> Any:
        """Reduce the local components of ``per_replica_value`` and copy to ``destinations``.

        Example: ``ops.reduce("MEAN", per_replica, destinations="/cpu:0")``.
        """
        dests = destination_devices(destinations)
        values = [asarray(v) for v in _components(per_replica_value)]
        return place(self.reduce_local(reduce_op, values, dests[0]), dests)

    def batch_reduce(
        self,
        reduce_op: ReduceOp | str,
        value_destination_pairs: Sequence[tuple],
        options: Any = None,
    ) -> list[Any]:
        """:meth:`reduce` for each ``(value, destinations)`` pair.

        Example: ``ops.batch_reduce("SUM", [(grad_a, var_a), (grad_b, var_b)])``.
        """
        return [self.reduce(reduce_op, v, d, options) for v, d in value_destination_pairs]

    def broadcast(self, tensor: Any, destinations: Any) -> Any:
        """A copy of ``tensor`` on each destination device.

        Example: ``ops.broadcast(np.zeros(3), ["/cpu:0", "/cpu:1"])``.
        """
        return place(asarray(tensor), destination_devices(destinations))


class ReductionToOneDevice(CrossDeviceOps):
    """Copy the values to one device, reduce there and copy the result back.

    ``reduce_to_device`` is where the reduction happens (default: the first
    destination); ``accumulation_fn(list_of_arrays)`` replaces the sum of
    ``SUM`` and ``MEAN`` (TF's default is ``add_n``).

    Example: ``ReductionToOneDevice(reduce_to_device="/cpu:0")``.
    """

    def __init__(
        self,
        reduce_to_device: str | Device | None = None,
        accumulation_fn: Callable[[list[Any]], Any] | None = None,
    ) -> None:
        self.reduce_to_device = None if reduce_to_device is None else parse_device(reduce_to_device)
        if accumulation_fn is not None and not callable(accumulation_fn):
            raise TypeError(f"accumulation_fn must be callable, got {accumulation_fn!r}")
        self.accumulation_fn = accumulation_fn

    def reduce_local(self, reduce_op: ReduceOp | str, values: Sequence[Any], device: Device) -> Any:
        op = ReduceOp.from_any(reduce_op)
        target = self.reduce_to_device or device
        if self.accumulation_fn is None or op in (ReduceOp.MIN, ReduceOp.MAX):
            return super().reduce_local(op, values, target)
        moved = [to_device(v, target.device_type, target.index, copy=False) for v in values]
        total = asarray(self.accumulation_fn(moved))
        if op is ReduceOp.MEAN:
            return reduce_arrays([total], ReduceOp.MEAN, count=len(values))
        return total


class _PackedAllReduce(CrossDeviceOps):
    """Common base of the GPU choices: ``num_packs`` packs, reduction in replica order."""

    def __init__(self, num_packs: int = 1) -> None:
        if isinstance(num_packs, bool) or not isinstance(num_packs, int):
            raise TypeError(f"num_packs must be an int, got {num_packs!r}")
        if num_packs < 0:
            raise ValueError(
                f"num_packs must be >= 0, got {num_packs}; 0 means no packing, 1 one pack"
            )
        self.num_packs = num_packs


class HierarchicalCopyAllReduce(_PackedAllReduce):
    """TF's hierarchical copy among GPUs (for GPUs without NVLink all-to-all).

    Example: ``MirroredStrategy(cross_device_ops=HierarchicalCopyAllReduce(num_packs=2))``.
    """


class NcclAllReduce(_PackedAllReduce):
    """NCCL all-reduce among local GPUs (the default of ``MirroredStrategy`` on GPUs).

    Example: ``MirroredStrategy(["/gpu:0", "/gpu:1"], cross_device_ops=NcclAllReduce())``.
    """


def default_cross_device_ops(devices: Sequence[Device]) -> CrossDeviceOps:
    """``NcclAllReduce`` for several GPUs, else ``ReductionToOneDevice``."""
    if len(devices) > 1 and all(d.device_type == "GPU" for d in devices):
        return NcclAllReduce()
    return ReductionToOneDevice()


def _components(value: Any) -> tuple[Any, ...]:
    if isinstance(value, DistributedValues):
        return value.values
    return local_results(value)
