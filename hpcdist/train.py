"""``hpcdist.train``: the checkpoint names TF keeps under ``tf.train``.

Example:
    >>> import hpcdist as hd
    >>> hd.train.Checkpoint is hd.checkpoint.Checkpoint
    True
"""

from hpcdist.checkpoint import Checkpoint, CheckpointManager, latest_checkpoint

__all__ = ["Checkpoint", "CheckpointManager", "latest_checkpoint"]
