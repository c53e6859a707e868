"""Horovod's exception names, which are hpcdist's typed errors (defined in :mod:`hpcdist.errors`).

Example:
    >>> from hpcdist.errors import HorovodMismatchError
    >>> issubclass(HorovodMismatchError, HorovodInternalError)
    True
"""

from hpcdist.errors import (
    HorovodInternalError,
    HorovodMismatchError,
    HorovodTimeoutError,
    HostsUpdatedInterrupt,
    ProcessSetError,
)

__all__ = [
    "HorovodInternalError",
    "HorovodMismatchError",
    "HorovodTimeoutError",
    "HostsUpdatedInterrupt",
    "ProcessSetError",
]
