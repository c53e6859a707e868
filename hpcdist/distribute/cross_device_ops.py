"""Reduction among the local devices of one process (``tf.distribute.CrossDeviceOps``).

* :class:`ReductionToOneDevice`: copy every value to one device, reduce there,
  copy the result back to each destination (the CPU default).
* :class:`HierarchicalCopyAllReduce` and :class:`NcclAllReduce`: the GPU
  choices of ``MirroredStrategy``. On host (NumPy) values their arithmetic
  is the same as ``ReductionToOneDevice``'s, in replica order, so every
  choice gives bitwise-identical results. On CuPy values, one per local GPU,
  reduced to those same GPUs, ``NcclAllReduce`` runs an NCCL all-reduce
  instead (see its docstring): that result is not bitwise identical.

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

import numpy as np

from hpcdist.arrays import asarray, to_device
from hpcdist.collectives.nccl import NCCL_DTYPE_NAMES, LocalNcclGroup, nccl_available
from hpcdist.collectives.ops import ReduceOp, reduce_arrays
from hpcdist.distribute.devices import Device, parse_device
from hpcdist.distribute.values import DistributedValues, Mirrored, local_results
from hpcdist.runtime.device import DeviceArrayError, is_c_contiguous, is_device_array, runtime_for


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
        """Reduce the local components of ``per_replica_value`` and copy to ``destinations``."""
        dests = destination_devices(destinations)
        values = [asarray(v) for v in _components(per_replica_value)]
        return place(self.reduce_local(reduce_op, values, dests[0]), dests)

    def batch_reduce(
        self,
        reduce_op: ReduceOp | str,
        value_destination_pairs: Sequence[tuple],
        options: Any = None,
    ) -> list[Any]:
        """:meth:`reduce` for each ``(value, destinations)`` pair."""
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

    :meth:`reduce` (and :meth:`batch_reduce`, pair by pair) takes the **NCCL
    route** when the values are device arrays (CuPy), one per GPU on distinct
    GPUs, all of one shape and an NCCL dtype (int8, uint8, int32, uint32,
    int64, uint64, float16, float32, float64), C-contiguous, the destinations
    are exactly those GPUs (in any order), and NCCL can be used
    (``hpcdist.collectives.nccl.nccl_available()``). Then one grouped NCCL
    all-reduce (a ``LocalNcclGroup``, made once per tuple of GPUs and kept)
    runs on each GPU's current stream of the calling thread, ``MEAN`` sums
    and divides afterwards, and the result is a ``Mirrored`` with one copy per
    destination, each on its own GPU; nothing waits on the host. NCCL sums in
    its own order (ring or tree), so the result may differ from the replica-order
    sum in the last bits: the bitwise-identical promise of the host path does
    not hold here. Otherwise (host values, other destinations, a dtype NCCL
    lacks, NCCL unavailable) it takes the **arithmetic route**: the
    ``ReductionToOneDevice`` arithmetic in replica order. ``last_route`` says
    which one the last call took (``"nccl"`` or ``"arithmetic"``).
    ``num_packs`` does not change the NCCL route: each value is one NCCL call
    (the optimizers already hand over one flat buffer per dtype).

    Example: ``MirroredStrategy(["/gpu:0", "/gpu:1"], cross_device_ops=NcclAllReduce())``.
    """

    def __init__(self, num_packs: int = 1) -> None:
        super().__init__(num_packs)
        self._groups: dict[tuple[int, ...], Any] = {}
        self.last_route: str | None = None

    def reduce(
        self,
        reduce_op: ReduceOp | str,
        per_replica_value: Any,
        destinations: Any,
        options: Any = None,
    ) -> Any:
        """Reduce over the local replicas; with NCCL on the GPUs when the class docstring says.

        Example: ``NcclAllReduce().reduce("SUM", per_replica_gpu_values, ["/gpu:0", "/gpu:1"])``.
        """
        op = ReduceOp.from_any(reduce_op)
        values = _components(per_replica_value)
        if all(is_device_array(v) for v in values):
            dests = destination_devices(destinations)
            result = self._nccl_reduce(op, values, dests)
            if result is not None:
                self.last_route = "nccl"
                return result
        self.last_route = "arithmetic"
        return super().reduce(op, per_replica_value, destinations, options)

    def _nccl_reduce(
        self, op: ReduceOp, values: Sequence[Any], dests: Sequence[Device]
    ) -> Any | None:
        """The NCCL route's result (a ``Mirrored`` over ``dests``); ``None``: not this route."""
        k = len(values)
        if k < 2 or len(dests) != k or any(d.device_type != "GPU" for d in dests):
            return None
        try:
            rt = runtime_for(values[0])
            gpus = tuple(rt.device_id(v) for v in values)
        except DeviceArrayError:
            return None
        first = values[0]
        same = all(
            runtime_for(v) is rt
            and tuple(v.shape) == tuple(first.shape)
            and v.dtype == first.dtype
            and is_c_contiguous(v)
            for v in values
        )
        if not same or np.dtype(first.dtype) not in NCCL_DTYPE_NAMES:
            return None
        if len(set(gpus)) != k or set(gpus) != {d.index for d in dests}:
            return None
        if not nccl_available()[0]:
            return None
        group = self._groups.get(gpus)
        if group is None:
            group = self._groups[gpus] = LocalNcclGroup(gpus)
        streams = [rt.current_stream(g) for g in gpus]
        shape, dtype = tuple(first.shape), np.dtype(first.dtype)
        recvs = [rt.view(rt.empty(first.size, dtype, g), dtype, shape) for g in gpus]
        nccl_op = ReduceOp.SUM if op is ReduceOp.MEAN else op
        group.allreduce(list(values), recvs, nccl_op, streams)
        if op is ReduceOp.MEAN:
            recvs = [rt.divide(r, k, s) for r, s in zip(recvs, streams, strict=True)]
        on_gpu = dict(zip(gpus, recvs, strict=True))
        mirrored = Mirrored(tuple(on_gpu[d.index] for d in dests))
        mirrored._devices = tuple(dests)
        return mirrored

    def close(self) -> None:
        """Destroy the NCCL communicators this object made (they are made again when needed).

        Example: ``ops.close()`` before the GPUs are handed to another library.
        """
        groups, self._groups = self._groups, {}
        for group in groups.values():
            group.close()



def default_cross_device_ops(devices: Sequence[Device]) -> CrossDeviceOps:
    """``NcclAllReduce`` for several GPUs, else ``ReductionToOneDevice``."""
    if len(devices) > 1 and all(d.device_type == "GPU" for d in devices):
        return NcclAllReduce()
    return ReductionToOneDevice()


def _components(value: Any) -> tuple[Any, ...]:
    if isinstance(value, DistributedValues):
        return value.values
    return local_results(value)
