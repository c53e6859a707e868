"""Collective operations among ranks: reduce ops, communication options and the engine.

Example:
    >>> import numpy as np
    >>> from hpcdist.runtime import mpi
    >>> Collectives(mpi().COMM_SELF).allreduce([np.ones(2)], ReduceOp.SUM)
    [array([1., 1.])]
"""

from hpcdist.collectives.engine import Collectives
from hpcdist.collectives.ops import ReduceOp, reduce_arrays
from hpcdist.collectives.options import (
    CollectiveCommunication,
    CommunicationImplementation,
    CommunicationOptions,
)

__all__ = [
    "CollectiveCommunication",
    "Collectives",
    "CommunicationImplementation",
    "CommunicationOptions",
    "ReduceOp",
    "reduce_arrays",
]
