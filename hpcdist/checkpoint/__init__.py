"""Checkpoints: ``Checkpoint``, ``CheckpointManager`` and the file format (no pickle).

``Checkpoint(model=..., optimizer=..., iterator=..., rng=...)`` saves and
restores the state of its objects; under a multi-worker strategy every worker
calls it, the chief writes the files, and restores are broadcast from the
chief after it verified every file against the manifest (SHA-256, sizes,
dtypes, shapes). Damaged files raise :class:`~hpcdist.errors.CheckpointCorruptError`
on every worker; :meth:`CheckpointManager.restore_or_initialize` then falls
back to the previous intact checkpoint.

Example:
    >>> import tempfile, numpy as np, hpcdist as hd
    >>> from hpcdist.checkpoint import Checkpoint, CheckpointManager
    >>> w = hd.Variable(np.ones(3))
    >>> manager = CheckpointManager(Checkpoint(w=w), tempfile.mkdtemp(), max_to_keep=1)
    >>> path = manager.save()
    >>> _ = w.assign(np.zeros(3))
    >>> manager.restore_or_initialize() == path, w.numpy()
    (True, array([1., 1., 1.]))
"""

from hpcdist.checkpoint.checkpoint import Checkpoint, CheckpointLoadStatus, CheckpointMatchError
from hpcdist.checkpoint.format import CheckpointNotFoundError
from hpcdist.checkpoint.manager import CheckpointManager, latest_checkpoint
from hpcdist.checkpoint.preemption import (
    PREEMPTION_EXIT_CODE,
    PREEMPTION_SIGNALS,
    PreemptionCheckpointHandler,
    TerminationConfig,
)
from hpcdist.errors import CheckpointCorruptError, CheckpointError
from hpcdist.runtime.atomic import atomic_write

__all__ = [
    "PREEMPTION_EXIT_CODE",
    "PREEMPTION_SIGNALS",
    "PreemptionCheckpointHandler",
    "TerminationConfig",
    "Checkpoint",
    "CheckpointCorruptError",
    "CheckpointError",
    "CheckpointLoadStatus",
    "CheckpointManager",
    "CheckpointMatchError",
    "CheckpointNotFoundError",
    "atomic_write",
    "latest_checkpoint",
]
