"""``OneDeviceStrategy``: everything on one device, the strategy API without distribution.

Variables created in its scope are plain variables placed on the device;
``run`` calls the function once (replica 0 of 1); ``reduce`` gives the value
back.

Example:
    >>> import hpcdist as hd
    >>> s = hd.OneDeviceStrategy("/cpu:0")
    >>> s.reduce("SUM", s.run(lambda: 3.0), axis=None)
    np.float64(3.0)
"""

from __future__ import annotations

from hpcdist.distribute.devices import Device, check_devices_exist, parse_device
from hpcdist.distribute.extended import StrategyExtended
from hpcdist.distribute.single_process import check_single_process
from hpcdist.distribute.strategy import Strategy


class OneDeviceStrategy(Strategy):
    """Run on the single ``device`` (``tf.distribute.OneDeviceStrategy``)."""

    def __init__(self, device: str | Device) -> None:
        if not isinstance(device, (str, Device)):
            raise TypeError(f"device must be a device string such as '/cpu:0', got {device!r}")
        check_single_process(type(self).__name__)
        devices = check_devices_exist([parse_device(device)])
        super().__init__(StrategyExtended(self, devices, distributed_variables=False))

    def __repr__(self) -> str:
        return f"<OneDeviceStrategy device={self._extended._devices[0].short}>"
