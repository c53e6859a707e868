"""hpcdist: the tf.distribute programming model for MPI codes on NumPy and CuPy.

``import hpcdist as hd`` reads like ``tf.distribute``: ``hd.MirroredStrategy``,
``hd.MultiWorkerMirroredStrategy``, ``hd.ReduceOp``, ``hd.get_replica_context``,
``hd.Variable``, ``hd.experimental.CommunicationOptions``,
``hd.cluster_resolver.SlurmClusterResolver``; training reads like ``tf.keras``:
``hd.nn.Sequential``, ``hd.nn.Dense``, ``hd.optimizers.Adam``,
``hd.callbacks.EarlyStopping``. Importing hpcdist does not
start MPI; :func:`hpcdist.runtime.world` (and a multi-worker strategy) does.

Example:
    >>> import hpcdist as hd
    >>> spec = hd.cluster_resolver.ClusterSpec({"worker": ["n1:2222", "n2:2222"]})
    >>> spec.num_tasks("worker")
    2
"""

from hpcdist import (
    callbacks,
    checkpoint,
    cluster_resolver,
    data,
    errors,
    experimental,
    nn,
    optimizers,
    runtime,
    train,
    utils,
)
from hpcdist.collectives.options import CommunicationImplementation, CommunicationOptions
from hpcdist.data.input_context import InputContext, InputOptions, InputReplicationMode
from hpcdist.distribute import *  # noqa: F403  (the tf.distribute names, listed in __all__)
from hpcdist.distribute import __all__ as _distribute_names
from hpcdist.distribute import coordinator
from hpcdist.runtime import World, world

__version__ = "0.1.0"

__all__ = [
    "CommunicationImplementation",
    "CommunicationOptions",
    "InputContext",
    "InputOptions",
    "InputReplicationMode",
    "World",
    "__version__",
    "callbacks",
    "checkpoint",
    "cluster_resolver",
    "coordinator",
    "data",
    "errors",
    "experimental",
    "nn",
    "optimizers",
    "runtime",
    "train",
    "utils",
    "world",
    *_distribute_names,
]
