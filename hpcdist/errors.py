"""Typed errors of hpcdist.

Every error says what was expected, what was found and what to do. The
configuration errors also derive from ``ValueError`` so that code written for
``tf.distribute`` (which raises ``ValueError``) keeps catching them.

Example:
    >>> from hpcdist.errors import ClusterConfigError
    >>> try:
    ...     raise ClusterConfigError("SLURM_NTASKS is 'x'; expected an integer")
    ... except ValueError as e:
    ...     print(type(e).__name__)
    ClusterConfigError
"""

from __future__ import annotations


class HpcdistError(Exception):
    """Base class of every error raised by hpcdist."""


class ClusterConfigError(HpcdistError, ValueError):
    """A cluster description (ClusterSpec, resolver argument, variable) is invalid."""


class TFConfigError(ClusterConfigError):
    """The ``TF_CONFIG`` variable is malformed or inconsistent."""


class SlurmConfigError(ClusterConfigError):
    """The ``SLURM_*`` variables are malformed or inconsistent with the arguments."""


class LauncherConfigError(ClusterConfigError):
    """The variables of an MPI launcher (mpirun, Hydra, PALS, jsrun, Flux) are malformed."""


class GPUBindingError(ClusterConfigError):
    """GPUs cannot be bound as asked (too few GPUs, bad ``CUDA_VISIBLE_DEVICES``)."""


class DuplicateTaskError(ClusterConfigError, KeyError):
    """A task index is given twice when cluster specs are merged (``UnionResolver``).

    A ``KeyError`` as in TF, and a ``ValueError`` like every configuration error;
    its message prints plainly (``KeyError`` alone would quote it).

    Example:
        >>> str(DuplicateTaskError("job 'worker' has task 0 twice"))
        "job 'worker' has task 0 twice"
    """

    def __str__(self) -> str:
        return str(self.args[0]) if len(self.args) == 1 else super().__str__()


class LaunchError(HpcdistError, RuntimeError):
    """The job was launched wrongly (singleton worlds under srun, disagreeing sizes)."""


class CollectiveTimeoutError(HpcdistError, TimeoutError):
    """A collective did not complete within ``CommunicationOptions.timeout_seconds``.

    Usually some rank never joined it (a hang, a crash, a rank that skipped
    the call). MPI cannot cancel a collective, so the communicator is
    unusable afterwards: abort the job. ``request`` is the still pending
    operation; where every rank is known to join eventually, ``request.Wait()``
    completes it and leaves the communicator clean again.

    Example:
        >>> err = CollectiveTimeoutError("allreduce did not complete within 5 s")
        >>> isinstance(err, TimeoutError), err.request
        (True, None)
    """

    request = None  # the pending operation (has Wait() and Test()), set by the engine


class CollectiveMismatchError(HpcdistError, ValueError):
    """Ranks called a collective with disagreeing arguments (operation, shapes, dtypes, root).

    Raised on every rank of the communicator, naming which ranks passed what.

    Example:
        >>> issubclass(CollectiveMismatchError, ValueError)
        True
    """


class RankFailedError(HpcdistError, RuntimeError):
    """A rank this one waited for has ended or left the collective (killed, interrupted).

    ``rank`` is the world rank that is gone. The collective cannot complete,
    so the job must end; raised uncaught, it aborts the job.

    Example:
        >>> RankFailedError("rank 1 has ended", rank=1).rank
        1
    """

    def __init__(self, message: str, rank: int | None = None) -> None:
        super().__init__(message)
        self.rank = rank


class CheckpointError(HpcdistError, ValueError):
    """A checkpoint cannot be written or read (missing files, a layout that does not fit).

    Example:
        >>> issubclass(CheckpointError, ValueError)
        True
    """


class CheckpointCorruptError(CheckpointError):
    """A checkpoint's files are truncated, altered or inconsistent with its manifest.

    Example:
        >>> issubclass(CheckpointCorruptError, CheckpointError)
        True
    """


class ArrayInteropError(HpcdistError, TypeError):
    """An array of another framework (PyTorch, JAX, TensorFlow) that hpcdist cannot take as it is.

    Raised for a tensor that requires grad, a non-contiguous view, a dtype
    the engine lacks (bfloat16) or a tensor on another GPU than the rank's;
    the message says which and how to convert it.

    Example:
        >>> issubclass(ArrayInteropError, TypeError)
        True
    """


class NotRegisteredError(HpcdistError, RuntimeError):
    """A lower layer needs what an upper layer registers when imported, and none is registered.

    The layers are one-way (see docs/architecture.md): the strategy layer reaches
    the input pipeline, and the cluster layer the MPI bootstrap, through a
    provider that ``import hpcdist`` registers. Importing only a lower package
    by hand leaves it unset.

    Example:
        >>> issubclass(NotRegisteredError, RuntimeError)
        True
    """


class CollectiveStallWarning(RuntimeWarning):
    """A collective has waited longer than the stall threshold for some ranks.

    Example:
        >>> issubclass(CollectiveStallWarning, RuntimeWarning)
        True
    """


__all__ = [
    "HpcdistError",
    "ClusterConfigError",
    "TFConfigError",
    "SlurmConfigError",
    "LauncherConfigError",
    "GPUBindingError",
    "ArrayInteropError",
    "DuplicateTaskError",
    "LaunchError",
    "CollectiveTimeoutError",
    "CollectiveMismatchError",
    "RankFailedError",
    "CheckpointError",
    "CheckpointCorruptError",
    "CollectiveStallWarning",
    "NotRegisteredError",
]
