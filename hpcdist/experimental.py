"""``hpcdist.experimental``: the names TF keeps under ``tf.distribute.experimental``.

Example:
    >>> import hpcdist as hd
    >>> hd.experimental.CommunicationOptions(bytes_per_pack=1 << 20).bytes_per_pack
    1048576
"""

from collections.abc import Iterator as _Iterator
from contextlib import contextmanager as _contextmanager

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
from hpcdist.observe import timeline as _timeline
from hpcdist.runtime import world as _world


def start_timeline(directory: str) -> str:
    """Start writing this rank's timeline to ``directory/rank-R.json`` (every rank calls it).

    Collective over the world: the ranks estimate their clock offsets first.
    See :mod:`hpcdist.observe.timeline`. Example: ``hd.experimental.start_timeline("traces")``.
    """
    w = _world()
    return _timeline.start(directory, w.rank, w.size, w.comm)


def stop_timeline() -> str | None:
    """Stop the timeline and close this rank's file; returns its path (``None``: it was off).

    Example: ``hd.experimental.stop_timeline()``.
    """
    return _timeline.stop()


@_contextmanager
def timeline(directory: str) -> _Iterator[str]:
    """Write every rank's timeline to ``directory`` inside the ``with`` block (collective).

    Example: ``with hd.experimental.timeline("traces"): model.fit(ds, epochs=1)``, then
    ``hpcdist timeline merge traces -o run.json``.
    """
    path = start_timeline(directory)
    try:
        yield path
    finally:
        stop_timeline()

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
    "start_timeline",
    "stop_timeline",
    "timeline",
]
