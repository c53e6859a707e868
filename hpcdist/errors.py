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


class MessageError(HpcdistError, ValueError):
    """A point-to-point message (:mod:`hpcdist.runtime.messages`) is malformed.

    Raised by the receiver for a header or value that is not what the protocol sends;
    the subclasses say which check failed.

    Example:
        >>> issubclass(MessageError, ValueError)
        True
    """


class MessageHeaderError(MessageError):
    """A message header has a wrong size, magic word, reserved word, flag or length.

    Example:
        >>> issubclass(MessageHeaderError, MessageError)
        True
    """


class MessageVersionError(MessageError):
    """A message was sent by a different version of the message protocol.

    Example:
        >>> issubclass(MessageVersionError, MessageError)
        True
    """


class UnknownMessageTypeError(MessageError):
    """A message (or an extension inside a message value) has a type the receiver does not know.

    Example:
        >>> issubclass(UnknownMessageTypeError, MessageError)
        True
    """


class MessageTruncatedError(MessageError):
    """A message or message value ends before the parts it announces.

    Example:
        >>> issubclass(MessageTruncatedError, MessageError)
        True
    """


class MessageSizeError(MessageError):
    """A message is larger than the size limit or than its header announced.

    Example:
        >>> issubclass(MessageSizeError, MessageError)
        True
    """


class MessageEncodeError(HpcdistError, TypeError):
    """A value that cannot travel in a message (an object, a cycle, a structured dtype).

    Example:
        >>> issubclass(MessageEncodeError, TypeError)
        True
    """


class PSError(HpcdistError, RuntimeError):
    """A parameter-server request failed (bad request, mismatch, a failed ps, a closed client).

    ``error_class`` is the MPI error class when an MPI call failed (e.g. 75,
    ``MPI.ERR_PROC_FAILED``, when the ps died under ULFM), else ``None``.

    Example:
        >>> str(PSError("closed"))
        'closed'
    """

    def __init__(self, message: str, error_class: int | None = None) -> None:
        super().__init__(message)
        self.error_class = error_class


class PSTypeError(PSError, TypeError):
    """A value of a dtype the parameter server cannot hold or optimize.

    Example:
        >>> isinstance(PSTypeError("complex64"), TypeError)
        True
    """


class PSRequestError(HpcdistError, RuntimeError):
    """A parameter-server request the server cannot do; its message goes back to the client.

    Raised inside the server's handlers; the client raises :class:`PSError` with the message.

    Example:
        >>> issubclass(PSRequestError, RuntimeError)
        True
    """


class PSClientFailedError(HpcdistError, RuntimeError):
    """A parameter server's MPI call with client ``rank`` failed because that process died.

    Raised and handled inside the server (under ULFM it drops the client and serves the
    others); ``rank`` is the client's rank on the ps communicator.

    Example:
        >>> PSClientFailedError(3).rank
        3
    """

    def __init__(self, rank: int) -> None:
        super().__init__(f"client rank {rank} failed (its process died)")
        self.rank = rank


class CancelledError(HpcdistError, RuntimeError):
    """A scheduled function that never ran (or was dropped) because an earlier one failed.

    Example: after ``join()`` raised, ``rv.fetch()`` of a function queued behind the failed
    one raises ``CancelledError``; schedule it again to run it.
    """


class OutOfRangeError(HpcdistError, RuntimeError):
    """A scheduled function reached the end of an iterator (``StopIteration`` on the worker).

    Example: ``try: coordinator.join()`` / ``except OutOfRangeError:`` ends an epoch.
    """


class RemoteError(HpcdistError, RuntimeError):
    """A scheduled function raised an exception whose type cannot be made again here.

    Example: an exception class defined inside a function arrives as
    ``RemoteError("module.f.<locals>.MyError: message")``.
    """


class ProgramsDivergedError(HpcdistError, RuntimeError):
    """The chief and a worker did not run the same sequence of schedule/join/done/fetch.

    Example: ``if is_chief: schedule(f) else: schedule(g)`` makes the next ``join`` raise it.
    """


class UnavailableError(HpcdistError, RuntimeError):
    """No worker is left to run the scheduled functions, or the chief is gone.

    Example: ``join()`` raises it on the chief once every worker rank has died.
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
    "MessageError",
    "MessageHeaderError",
    "MessageVersionError",
    "UnknownMessageTypeError",
    "MessageTruncatedError",
    "MessageSizeError",
    "MessageEncodeError",
    "PSError",
    "PSTypeError",
    "PSRequestError",
    "PSClientFailedError",
    "CancelledError",
    "OutOfRangeError",
    "RemoteError",
    "ProgramsDivergedError",
    "UnavailableError",
    "NotRegisteredError",
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


class ShardingError(HpcdistError, ValueError):
    """A sharding request (ZeRO-1/ZeRO-2) or a sharded state that does not fit.

    Raised for a ``shard=`` / ``experimental_sharding=`` value that is not a
    stage, and for a sharded ``state_dict`` or checkpoint manifest whose
    layout (world size, parameter sizes, slices) does not match the model.

    Example:
        >>> issubclass(ShardingError, ValueError)
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
    "ShardingError",
]


class GpuSetupError(HpcdistError, RuntimeError):
    """CuPy is installed but cannot use this machine's GPUs (a broken install, or a wheel
    built for a newer CUDA than the driver), so hpcdist refuses to fall back to the CPU
    silently. The message names the wheel to install, or how to run on CPUs on purpose.

    Example:
        >>> issubclass(GpuSetupError, RuntimeError)
        True
    """


__all__ += ["GpuSetupError"]


class TimelineError(HpcdistError, ValueError):
    """A timeline or flight-recorder directory holds nothing hpcdist can read.

    Example:
        >>> issubclass(TimelineError, ValueError)
        True
    """


__all__ += ["TimelineError"]


class ProcessSetError(HpcdistError, ValueError):
    """A process set was used wrongly: a rank outside the set called one of its
    collectives, its ranks are invalid, or it was removed or never added.

    Example:
        >>> issubclass(ProcessSetError, ValueError)
        True
    """


class HorovodInternalError(HpcdistError, RuntimeError):
    """A collective of :mod:`hpcdist.horovod` failed: Horovod's name, so that
    ``except HorovodInternalError`` in Horovod scripts keeps catching.

    Example:
        >>> issubclass(HorovodInternalError, RuntimeError)
        True
    """


class HorovodNotInitializedError(HpcdistError, ValueError):
    """A function of :mod:`hpcdist.horovod` that needs ``hvd.init()`` ran before it
    (a ``ValueError``, as Horovod raises).

    Example:
        >>> issubclass(HorovodNotInitializedError, ValueError)
        True
    """


class HostsUpdatedInterrupt(HpcdistError, RuntimeError):  # noqa: N818  (Horovod's name)
    """Horovod's elastic interrupt; hpcdist never raises it (no elastic mode), it exists
    so that ``except`` clauses in Horovod scripts still import.

    Example:
        >>> issubclass(HostsUpdatedInterrupt, RuntimeError)
        True
    """


class HorovodMismatchError(HorovodInternalError, CollectiveMismatchError):
    """Ranks called a :mod:`hpcdist.horovod` collective with disagreeing or invalid
    arguments (on some ranks only): raised on every rank of the process set, naming
    which ranks passed what. Both a ``HorovodInternalError`` and a
    :class:`CollectiveMismatchError`.

    Example:
        >>> issubclass(HorovodMismatchError, (RuntimeError, ValueError))
        True
    """


class HorovodTimeoutError(HorovodInternalError, CollectiveTimeoutError):
    """A :mod:`hpcdist.horovod` collective waited longer than the timeout in effect
    (``HPCDIST_TIMEOUT_SECONDS``): both a ``HorovodInternalError`` and a
    :class:`CollectiveTimeoutError`.

    Example:
        >>> issubclass(HorovodTimeoutError, TimeoutError)
        True
    """


class ElasticUnsupportedError(HorovodInternalError, NotImplementedError):
    """A name of ``hvd.elastic`` was used: hpcdist has no elastic mode (resume from a
    checkpoint at any world size instead).

    Example:
        >>> issubclass(ElasticUnsupportedError, NotImplementedError)
        True
    """


__all__ += [
    "ElasticUnsupportedError",
    "ProcessSetError",
    "HorovodInternalError",
    "HorovodNotInitializedError",
    "HostsUpdatedInterrupt",
    "HorovodMismatchError",
    "HorovodTimeoutError",
]
