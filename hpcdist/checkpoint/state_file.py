"""The state file of a checkpoint directory: which checkpoints it holds, the newest first read.

``directory/checkpoint`` (JSON, written atomically by the chief) names the
newest checkpoint and the managed ones, relative to the directory, with TF's
keys. :class:`~hpcdist.checkpoint.Checkpoint` writes it after a save and
:class:`~hpcdist.checkpoint.CheckpointManager` keeps it; both build on this module.

Example:
    >>> import tempfile
    >>> d = tempfile.mkdtemp()
    >>> write_state_file(d, ["ckpt-1"], [1.0])
    >>> read_state_file(d)["all_model_checkpoint_paths"]
    ['ckpt-1']
"""

from __future__ import annotations

import json
import os
import time

from hpcdist.errors import CheckpointCorruptError
from hpcdist.runtime.atomic import atomic_write

__all__ = ["STATE_FILE", "read_state_file", "write_state_file"]

STATE_FILE = "checkpoint"


def write_state_file(
    directory: str, names: list[str], timestamps: list[float], last_preserved: float | None = None
) -> None:
    """Write ``directory/checkpoint`` atomically (``names`` relative, oldest first).

    Example:
        >>> import tempfile
        >>> d = tempfile.mkdtemp()
        >>> write_state_file(d, ["ckpt-1", "ckpt-2"], [1.0, 2.0])
        >>> read_state_file(d)["model_checkpoint_path"]
        'ckpt-2'
    """
    state = {
        "model_checkpoint_path": names[-1] if names else "",
        "all_model_checkpoint_paths": list(names),
        "all_model_checkpoint_timestamps": [float(t) for t in timestamps],
        "last_preserved_timestamp": time.time() if last_preserved is None else last_preserved,
    }
    text = json.dumps(state, indent=1).encode()
    atomic_write(os.path.join(directory, STATE_FILE), lambda f: f.write(text))


def read_state_file(directory: str) -> dict | None:
    """The state file of ``directory`` (``None`` when there is none).

    Raises ``CheckpointCorruptError`` naming the file when it is not a valid state file.

    Example: ``read_state_file("/ckpt")["all_model_checkpoint_paths"]``.
    """
    path = os.path.join(os.fspath(directory), STATE_FILE)
    try:
        with open(path, "rb") as f:
            state = json.loads(f.read())
    except FileNotFoundError:
        return None
    except (OSError, ValueError, RecursionError) as error:
        raise CheckpointCorruptError(f"state file {path!r} cannot be read: {error}") from None
    names = state.get("all_model_checkpoint_paths") if isinstance(state, dict) else None
    if not (
        isinstance(names, list)
        and all(isinstance(n, str) and n for n in names)
        and isinstance(state.get("model_checkpoint_path"), str)
    ):
        raise CheckpointCorruptError(
            f"state file {path!r} is not a checkpoint state file (expected the keys "
            "model_checkpoint_path and all_model_checkpoint_paths); delete it to start over"
        )
    stamps = state.get("all_model_checkpoint_timestamps")
    if not (isinstance(stamps, list) and len(stamps) == len(names)
            and all(isinstance(t, (int, float)) for t in stamps)):  # fmt: skip
        state["all_model_checkpoint_timestamps"] = [0.0] * len(names)
    if not isinstance(state.get("last_preserved_timestamp"), (int, float)):
        state["last_preserved_timestamp"] = None
    return state
