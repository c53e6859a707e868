"""``hvd.elastic``: refused. hpcdist has no elastic mode; resume from a checkpoint at any
world size instead (``hd.train.CheckpointManager`` and the preemption handling).
Every name looked up here raises :class:`~hpcdist.errors.ElasticUnsupportedError`.
"""

from __future__ import annotations

from typing import Any

from hpcdist.errors import ElasticUnsupportedError

_WHAT = (
    "Horovod's elastic mode is not part of hpcdist.horovod: restart the job (any number of "
    "ranks) and resume from a checkpoint instead (hpcdist.train.CheckpointManager, or "
    "torch.save on rank 0 plus hvd.broadcast_parameters/broadcast_optimizer_state)"
)


def __getattr__(name: str) -> Any:
    if name.startswith("_") or name.startswith("pytest"):  # tools probing the module
        raise AttributeError(name)
    raise ElasticUnsupportedError(f"hvd.elastic.{name}: {_WHAT}")
