"""``MirroredStrategy``: synchronous replicas on the devices of one process.

One thread per replica when there is more than one; the replicas meet at
every ``merge_call`` (``all_reduce``, ``all_gather``, variable updates).
Devices may be GPUs or logical CPU devices: ``["/cpu:0", "/cpu:1"]`` gives
two replicas on a CPU machine (TF needs ``tf.config`` logical devices first;
hpcdist accepts them directly).

Example:
    >>> import hpcdist as hd
    >>> s = hd.MirroredStrategy(["/cpu:0", "/cpu:1"])
    >>> s.num_replicas_in_sync
    2
"""

from __future__ import annotations

from collections.abc import Sequence

from hpcdist.distribute.cross_device_ops import CrossDeviceOps
from hpcdist.distribute.devices import (
    Device,
    canonical_devices,
    check_devices_exist,
    default_devices,
    parse_device,
)
from hpcdist.distribute.extended import StrategyExtended
from hpcdist.distribute.single_process import check_single_process
from hpcdist.distribute.strategy import Strategy


def local_devices(devices: Sequence[str | Device] | None) -> tuple[Device, ...]:
    """Parse the devices of one process; all must belong to the same job and task.

    Example: ``local_devices(["/gpu:0", "GPU:1"])`` gives two local GPU devices.
    """
    if devices is None or (isinstance(devices, (list, tuple)) and not devices):
        return default_devices()  # as TF: no devices means all GPUs, else the CPU
    if isinstance(devices, (str, Device)):
        raise TypeError(
            f"devices must be a list of device strings, got {devices!r}; write [{devices!r}]"
        )
    parsed = [parse_device(d, default_job=None, default_task=None) for d in devices]
    owners = {(d.job, d.task) for d in parsed if d.job is not None or d.task is not None}
    if len(owners) > 1:
        raise ValueError(
            f"MirroredStrategy runs in one process, but the devices {list(devices)} belong to "
            f"several tasks {sorted(owners, key=str)}; use MultiWorkerMirroredStrategy for "
            "replicas on several workers"
        )
    job, task = next(iter(owners)) if owners else (None, None)
    canonical = canonical_devices(devices, job=job or "localhost", task=0 if task is None else task)
    check_devices_exist(canonical)
    return canonical


class MirroredStrategy(Strategy):
    """Synchronous training on several devices of one process (``tf.distribute.MirroredStrategy``).

    ``devices=None`` uses every visible GPU, else the CPU. ``cross_device_ops``
    picks how local values are combined (default: ``NcclAllReduce`` for
    several GPUs, else ``ReductionToOneDevice``).
    """

    def __init__(
        self,
        devices: Sequence[str | Device] | None = None,
        cross_device_ops: CrossDeviceOps | None = None,
    ) -> None:
        check_single_process(type(self).__name__)
        local = local_devices(devices)
        super().__init__(StrategyExtended(self, local, cross_device_ops=cross_device_ops))

    def __repr__(self) -> str:
        devices = ", ".join(d.short for d in self._extended._devices)
        return f"<MirroredStrategy devices=[{devices}]>"
