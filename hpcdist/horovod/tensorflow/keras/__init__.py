"""Horovod's ``horovod.tensorflow.keras`` API on hpcdist (Keras 3), over
:mod:`hpcdist.tensorflow`: ``import hpcdist.horovod.tensorflow.keras as hvd``.

Example::

    import hpcdist.horovod.tensorflow.keras as hvd
    hvd.init()
    model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(0.01 * hvd.size())))
    model.fit(x, y, callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0),
                               hvd.callbacks.MetricAverageCallback()])
"""

from __future__ import annotations

from typing import Any

import hpcdist.tensorflow as hdtf
from hpcdist.horovod.common.process_sets import ProcessSet, global_process_set
from hpcdist.horovod.tensorflow import (
    Average,
    Compression,
    Sum,
    allgather,
    allreduce,
    broadcast,
    cross_rank,
    cross_size,
    init,
    is_initialized,
    local_rank,
    local_size,
    rank,
    shutdown,
    size,
)
from hpcdist.horovod.tensorflow.keras import callbacks

__all__ = [
    "Average", "Compression", "DistributedOptimizer", "Sum", "allgather", "allreduce",
    "broadcast", "callbacks", "cross_rank", "cross_size", "init", "is_initialized",
    "local_rank", "local_size", "rank", "shutdown", "size",
]


def DistributedOptimizer(  # noqa: N802  (Horovod's name)
    optimizer: Any, name: str | None = None, device_dense: str = "", device_sparse: str = "",
    compression: Any = Compression.none, sparse_as_dense: bool = False,
    gradient_aggregation_steps: int = 1, op: int = Average, backward_passes_per_step: int = 1,
    average_aggregated_gradients: bool = False, num_groups: int = 0, groups: Any = None,
    process_set: ProcessSet = global_process_set,
) -> Any:
    """A Keras optimizer that averages its gradients over the process set before applying
    them (``hpcdist.tensorflow.DistributedOptimizer``). Only ``op=Average``, no
    compression and no aggregation steps: other values are refused with what to use."""
    if op != Average:
        raise ValueError("hvd.keras DistributedOptimizer averages (op=hvd.Average); for sums "
                         "use hvd.DistributedGradientTape(op=hvd.Sum) in a custom loop")
    if compression is not Compression.none:
        raise ValueError("hvd.keras DistributedOptimizer sends gradients uncompressed; use "
                         "hvd.DistributedGradientTape(compression=...) in a custom loop")
    if gradient_aggregation_steps != 1 or backward_passes_per_step != 1:
        raise ValueError("gradient aggregation steps are not supported by the hvd.keras "
                         "DistributedOptimizer; use a larger batch or a custom loop")
    return hdtf.DistributedOptimizer(optimizer, strategy=process_set.group().engine())
