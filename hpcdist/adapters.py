"""What the framework adapters (hpcdist.torch, hpcdist.jax, hpcdist.tensorflow) share.

An adapter reduces a framework's arrays among the *workers* of a strategy:
one process holds one model replica, so the strategy must have one local
replica per worker (``MultiWorkerMirroredStrategy``, or the default strategy,
which stands for all ranks of the MPI world here).

Example:
    >>> engine_for().size >= 1
    True
"""

from __future__ import annotations

from typing import Any

from hpcdist.collectives import Collectives
from hpcdist.distribute import context
from hpcdist.runtime import mpi, world

_WORLD: list[Collectives] = []


def engine_for(strategy: Any = None, private: bool = False) -> Collectives:
    """The collectives engine over the workers of ``strategy`` (default: the current one).

    ``strategy`` may also be a :class:`~hpcdist.collectives.Collectives` engine
    (a process set's, for instance), which is used as it is.

    Outside any strategy scope (the default strategy) this is every rank of
    the MPI world. ``private=True`` gives a new engine over a duplicate of
    the communicator, for a thread that runs collectives of its own.

    Example: ``engine_for(hd.MultiWorkerMirroredStrategy()).size``.
    """
    if strategy is None:
        strategy = context.get_strategy()
    if isinstance(strategy, Collectives):  # an engine given directly (e.g. a process set's)
        engine = strategy
    elif strategy is context.default_strategy():
        if not _WORLD:
            _WORLD.append(Collectives(world().comm))
        engine = _WORLD[0]
    else:
        ext = strategy.extended
        engine = ext.collectives
        if engine is None:  # a strategy of one worker: nothing to reduce with other ranks
            engine = Collectives(mpi().COMM_SELF)
        local = ext.num_local_replicas
        if local != 1:
            raise ValueError(
                f"{type(strategy).__name__} has {local} replicas in this process; the framework "
                "adapters need one replica per process (one model per MPI rank). Use "
                "hd.MultiWorkerMirroredStrategy() and start one rank per device"
            )
    if private:
        return type(engine)(engine.comm.Dup(), engine.options)
    return engine
