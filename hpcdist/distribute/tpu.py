"""``TPUStrategy`` exists so that TF programs import; hpcdist does not run on TPUs.

Example:
    >>> import hpcdist as hd
    >>> try:
    ...     hd.TPUStrategy()
    ... except ValueError as e:
    ...     print("MultiWorkerMirroredStrategy" in str(e))
    True
"""

from __future__ import annotations

from typing import Any

from hpcdist.distribute.strategy import Strategy


class TPUStrategy(Strategy):
    """Not available: constructing it raises ``ValueError`` (TF's type) naming what to use."""

    def __init__(
        self,
        tpu_cluster_resolver: Any = None,
        experimental_device_assignment: Any = None,
        experimental_spmd_xla_partitioning: bool = False,
    ) -> None:
        raise ValueError(
            "TPUStrategy is not available: hpcdist runs on CPUs and NVIDIA GPUs under MPI. "
            "Use hpcdist.MultiWorkerMirroredStrategy for synchronous training over MPI ranks "
            "(one or more GPUs each), hpcdist.MirroredStrategy for several GPUs in one "
            "process, or hpcdist.OneDeviceStrategy for one device."
        )
