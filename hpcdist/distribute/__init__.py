"""Strategies, contexts, distributed values and variables: the ``tf.distribute`` model.

Example:
    >>> import hpcdist as hd
    >>> s = hd.MirroredStrategy(["/cpu:0", "/cpu:1"])
    >>> with s.scope():
    ...     v = hd.Variable(1.0)
    >>> type(v).__name__, s.num_replicas_in_sync
    ('MirroredVariable', 2)
"""

from hpcdist.collectives.ops import ReduceOp
from hpcdist.distribute.aggregating import AggregatingVariable
from hpcdist.distribute.central_storage import CentralStorageStrategy
from hpcdist.distribute.context import (
    experimental_set_strategy,
    get_cross_replica_context,
    get_replica_context,
    get_strategy,
    has_strategy,
    in_cross_replica_context,
)
from hpcdist.distribute.cross_device_ops import (
    CrossDeviceOps,
    HierarchicalCopyAllReduce,
    NcclAllReduce,
    ReductionToOneDevice,
)
from hpcdist.distribute.default import DefaultStrategy
from hpcdist.distribute.extended import StrategyExtended
from hpcdist.distribute.indexed_slices import IndexedSlices
from hpcdist.distribute.mirrored import MirroredStrategy
from hpcdist.distribute.multi_worker import MultiWorkerMirroredStrategy
from hpcdist.distribute.one_device import OneDeviceStrategy
from hpcdist.distribute.ps.strategy import ParameterServerStrategy
from hpcdist.distribute.replica_context import ReplicaContext
from hpcdist.distribute.sharded_variable import ShardedVariable
from hpcdist.distribute.strategy import Strategy, ValueContext
from hpcdist.distribute.tpu import TPUStrategy
from hpcdist.distribute.values import DistributedValues, Mirrored, PerReplica
from hpcdist.distribute.variables import (
    DistributedVariable,
    MirroredVariable,
    SyncOnReadVariable,
    Variable,
    VariableAggregation,
    VariableSynchronization,
)

__all__ = [
    "AggregatingVariable",
    "CentralStorageStrategy",
    "CrossDeviceOps",
    "DefaultStrategy",
    "DistributedValues",
    "DistributedVariable",
    "HierarchicalCopyAllReduce",
    "IndexedSlices",
    "Mirrored",
    "MirroredStrategy",
    "MirroredVariable",
    "MultiWorkerMirroredStrategy",
    "NcclAllReduce",
    "OneDeviceStrategy",
    "ParameterServerStrategy",
    "PerReplica",
    "ReduceOp",
    "ReductionToOneDevice",
    "ReplicaContext",
    "Strategy",
    "StrategyExtended",
    "ShardedVariable",
    "SyncOnReadVariable",
    "TPUStrategy",
    "ValueContext",
    "Variable",
    "VariableAggregation",
    "VariableSynchronization",
    "experimental_set_strategy",
    "get_cross_replica_context",
    "get_replica_context",
    "get_strategy",
    "has_strategy",
    "in_cross_replica_context",
]
