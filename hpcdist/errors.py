"""Typed errors of hpcdist.

Every error says what was expected, what was found and what to do. Every
error class of hpcdist is defined here and derives from :class:`HpcdistError`
and from the built-in exception it stands for, so that code written for
``tf.distribute`` keeps catching it (a configuration error is a ``ValueError``,
as TF raises). The modules that raise an error re-export it, and the API
reference's *Errors* table lists each one with its built-in base and when it
is raised.

Example:
    >>> from hpcdist.errors import ClusterConfigError
    >>> try:
    ...     raise ClusterConfigError("SLURM_NTASKS is 'x'; expected an integer")
    ... except ValueError as e:
    ...     print(type(e).__name__)
    ClusterConfigError
"""

from __future__ import annotations

from typing import Any


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

    request: Any = None  # the pending operation (has Wait() and Test()), set by the engine


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


class CollectiveStallWarning(RuntimeWarning):
    """A collective has waited longer than the stall threshold for some ranks.

    Raised as an error only under ``-W error``; then ``request``, as on
    :class:`CollectiveTimeoutError`, is the still pending operation.

    Example:
        >>> issubclass(CollectiveStallWarning, RuntimeWarning)
        True
    """

    request: Any = None  # the pending operation (has Wait() and Test()), set by the engine
    at: Any = None  # where a node barrier stalled (sequence, digest), set by the SHM backend


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
]


# -- errors first defined next to the code that raises them (issue 23); the old modules
# -- re-export them, so their old import paths keep working.


class DeviceArrayError(HpcdistError, TypeError):
    """A device array hpcdist cannot work with (unknown type, strided, mixed devices).

    Raised by the device-array helpers of :mod:`hpcdist.runtime.device` and the
    cross-device ops when a GPU value is not a C-contiguous ``__cuda_array_interface__``
    array on one device; also importable from :mod:`hpcdist.runtime.device`.

    Example:
        >>> issubclass(DeviceArrayError, TypeError)
        True
    """


class NcclUnavailableError(HpcdistError, RuntimeError):
    """NCCL cannot be used here (no CuPy, CuPy without NCCL, no GPU); the message says why.

    Raised where an NCCL communicator is built and NCCL cannot run
    (``NcclComm.create``, ``nccl_provider``); ``CommunicationImplementation.AUTO``
    checks first and falls back to MPI. Also importable from
    :mod:`hpcdist.collectives.nccl`.

    Example:
        >>> issubclass(NcclUnavailableError, RuntimeError)
        True
    """


class NcclCallError(HpcdistError, RuntimeError):
    """An NCCL call failed; the message names the operation, dtype, count and rank.

    The provider's own error (``cupy.cuda.nccl.NcclError``, ...) is the
    ``__cause__``. Also importable from :mod:`hpcdist.collectives.nccl`.

    Example:
        >>> issubclass(NcclCallError, RuntimeError)
        True
    """


class DistributedInputError(HpcdistError, RuntimeError):
    """The distributed input failed on some worker (raised on every worker, so none hangs).

    Raised by iterating a distributed dataset (``experimental_distribute_dataset``,
    ``distribute_datasets_from_function``) when a worker's input pipeline
    raised; the message names the worker and its error. Also importable from
    :mod:`hpcdist.data.distributed`.

    Example:
        >>> issubclass(DistributedInputError, RuntimeError)
        True
    """


class CheckpointNotFoundError(CheckpointError, FileNotFoundError):
    """No checkpoint at this prefix (its ``.index.json`` manifest does not exist).

    Raised by ``Checkpoint.read``/``restore`` and ``hd.nn`` model loading;
    TF raises ``tf.errors.NotFoundError`` there. Also importable from
    :mod:`hpcdist.checkpoint` and :mod:`hpcdist.checkpoint.format`.

    Example:
        >>> issubclass(CheckpointNotFoundError, FileNotFoundError)
        True
    """


class CheckpointMatchError(CheckpointError, AssertionError):
    """A ``CheckpointLoadStatus`` assertion failed (an ``AssertionError`` as in TF).

    Raised by ``assert_consumed``, ``assert_existing_objects_matched`` and
    ``assert_nontrivial_match`` of the status a restore returns. Also importable
    from :mod:`hpcdist.checkpoint` and :mod:`hpcdist.checkpoint.status`.

    Example:
        >>> issubclass(CheckpointMatchError, AssertionError)
        True
    """


class InvalidDeviceError(HpcdistError, ValueError):
    """A device string or list of devices is malformed, unsupported, or not usable here.

    Raised by the strategy constructors that take devices (``MirroredStrategy``,
    ``MultiWorkerMirroredStrategy``, ``ParameterServerStrategy``) and device parsing;
    a ``ValueError`` as TF raises.
    Also importable from :mod:`hpcdist.distribute.devices`.

    Example:
        >>> issubclass(InvalidDeviceError, ValueError)
        True
    """


class TooFewGPUsError(GPUBindingError):
    """A host has fewer GPUs than an explicit ``gpus_per_task`` needs for its ranks.

    A :class:`GPUBindingError` (so a ``ValueError``); the message says how many
    ranks share how many GPUs and what to pass or ask the scheduler for instead.
    Raised by :func:`hpcdist.cluster.gpus.bind_among_peers` and the GPU binding.

    Example:
        >>> issubclass(TooFewGPUsError, GPUBindingError)
        True
    """


class BenchmarkError(HpcdistError, RuntimeError):
    """A benchmark cannot run as asked, or a result it would time is wrong.

    Raised on every rank by ``hpcdist bench`` (and :mod:`hpcdist.bench`) for
    bad arguments, too few ranks, or results that differ between
    implementations, so no number is written for a wrong result. Also
    importable from :mod:`hpcdist.bench.allreduce`.

    Example:
        >>> issubclass(BenchmarkError, RuntimeError)
        True
    """


__all__ += [
    "DeviceArrayError",
    "NcclUnavailableError",
    "NcclCallError",
    "DistributedInputError",
    "CheckpointNotFoundError",
    "CheckpointMatchError",
    "InvalidDeviceError",
    "TooFewGPUsError",
    "BenchmarkError",
]
