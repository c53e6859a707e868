"""``hpcdist.experimental``: the names TF keeps under ``tf.distribute.experimental``.

Example:
    >>> import hpcdist as hd
    >>> hd.experimental.CommunicationOptions(bytes_per_pack=1 << 20).bytes_per_pack
    1048576
"""

from hpcdist.checkpoint.preemption import PreemptionCheckpointHandler, TerminationConfig
from hpcdist.collectives.options import (
    CollectiveCommunication,
    CommunicationImplementation,
    CommunicationOptions,
    get_default_timeout,
    set_default_timeout,
)
from hpcdist.distribute import coordinator, partitioners
from hpcdist.distribute.central_storage import CentralStorageStrategy
from hpcdist.distribute.multi_worker import MultiWorkerMirroredStrategy
from hpcdist.distribute.ps.strategy import ParameterServerStrategy

__all__ = [
    "CentralStorageStrategy",
    "CollectiveCommunication",
    "CommunicationImplementation",
    "CommunicationOptions",
    "MultiWorkerMirroredStrategy",
    "ParameterServerStrategy",
    "PreemptionCheckpointHandler",
    "TerminationConfig",
    "coordinator",
    "get_default_timeout",
    "partitioners",
    "set_default_timeout",
]
