"""What an input function learns about its place in the job, and how input is distributed.

* :class:`InputContext` is what ``dataset_fn`` receives in
  ``distribute_datasets_from_function``: how many input pipelines there are,
  which one this is, and how many replicas train in sync.
* :class:`InputOptions` tunes how a distributed dataset is fed to the replicas.
* :class:`InputReplicationMode` says whether ``dataset_fn`` runs once per worker
  or once per replica.

Example:
    >>> ctx = InputContext(num_input_pipelines=2, input_pipeline_id=1, num_replicas_in_sync=4)
    >>> ctx.get_per_replica_batch_size(64)
    16
    >>> InputOptions().experimental_fetch_to_device
    True
"""

from __future__ import annotations

import enum
import operator
from dataclasses import dataclass
from typing import Any

import numpy as np


def check_count(name: str, value: Any, minimum: int) -> int:
    """``value`` as an int >= ``minimum`` (NumPy integers accepted, bools refused).

    Example: ``check_count("num_replicas_in_sync", np.int32(4), 1) == 4``.
    """
    number = None
    if not isinstance(value, (bool, np.bool_)) and hasattr(value, "__index__"):
        try:
            number = operator.index(value)
        except TypeError:  # a NumPy array of more than one element has __index__ too
            number = None
    if number is None:
        raise TypeError(f"{name} must be an int, got {type(value).__name__} {_short(value)}")
    if number < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {_short(number)}")
    return number


def _short(value: Any) -> str:
    """``repr(value)`` cut to about 80 characters for a message; never raises."""
    try:
        text = repr(value)
    except Exception:  # noqa: BLE001 - an int too long to print, a broken __repr__
        return f"<a {type(value).__name__}>"
    return text if len(text) <= 80 else f"{text[:75]}...{text[-2:]}"


class InputContext:
    """Information for ``dataset_fn`` about the input pipeline it builds.

    ``num_input_pipelines`` is how many times ``dataset_fn`` is called in the
    whole job (once per worker, or once per replica in ``PER_REPLICA`` mode),
    ``input_pipeline_id`` which call this is (``0 .. num_input_pipelines - 1``),
    and ``num_replicas_in_sync`` the number of replicas over all workers.

    Example:
        >>> ctx = InputContext(2, 0, 4)
        >>> ctx.num_input_pipelines, ctx.input_pipeline_id, ctx.num_replicas_in_sync
        (2, 0, 4)
        >>> str(ctx)
        'hpcdist.InputContext(input pipeline id 0, total: 2)'
    """

    def __init__(
        self,
        num_input_pipelines: int = 1,
        input_pipeline_id: int = 0,
        num_replicas_in_sync: int = 1,
    ) -> None:
        self._num_input_pipelines = check_count("num_input_pipelines", num_input_pipelines, 1)
        self._input_pipeline_id = check_count("input_pipeline_id", input_pipeline_id, 0)
        self._num_replicas_in_sync = check_count("num_replicas_in_sync", num_replicas_in_sync, 1)
        if self._input_pipeline_id >= self._num_input_pipelines:
            raise ValueError(
                f"input_pipeline_id is {input_pipeline_id} but there are only "
                f"{num_input_pipelines} input pipelines; expected 0 <= input_pipeline_id < "
                f"{num_input_pipelines}"
            )

    @property
    def num_input_pipelines(self) -> int:
        """The number of input pipelines (``dataset_fn`` calls) in the job."""
        return self._num_input_pipelines

    @property
    def input_pipeline_id(self) -> int:
        """The id of this input pipeline, ``0 .. num_input_pipelines - 1``."""
        return self._input_pipeline_id

    @property
    def num_replicas_in_sync(self) -> int:
        """The number of replicas that train in sync, over all workers."""
        return self._num_replicas_in_sync

    def get_per_replica_batch_size(self, global_batch_size: int) -> int:
        """``global_batch_size // num_replicas_in_sync``; ``ValueError`` if it does not divide.

        Example:
            >>> InputContext(num_replicas_in_sync=4).get_per_replica_batch_size(8)
            2
        """
        global_batch_size = check_count("global_batch_size", global_batch_size, 0)
        if global_batch_size % self._num_replicas_in_sync != 0:
            raise ValueError(
                f"the global batch size {global_batch_size} is not divisible by "
                f"num_replicas_in_sync {self._num_replicas_in_sync}; use a global batch size "
                f"that is a multiple of {self._num_replicas_in_sync}"
            )
        return global_batch_size // self._num_replicas_in_sync

    def __str__(self) -> str:
        return (
            f"hpcdist.InputContext(input pipeline id {self._input_pipeline_id}, "
            f"total: {self._num_input_pipelines})"
        )

    def __repr__(self) -> str:
        return (
            f"InputContext(num_input_pipelines={self._num_input_pipelines}, "
            f"input_pipeline_id={self._input_pipeline_id}, "
            f"num_replicas_in_sync={self._num_replicas_in_sync})"
        )


class InputReplicationMode(enum.Enum):
    """How many input pipelines ``distribute_datasets_from_function`` builds.

    ``PER_WORKER``: ``dataset_fn`` is called once on each worker, and the
    worker's replicas take turns reading that one pipeline. ``PER_REPLICA``:
    ``dataset_fn`` is called once for each replica, which reads only its own.

    Example:
        >>> InputReplicationMode("PER_REPLICA") is InputReplicationMode.PER_REPLICA
        True
    """

    PER_WORKER = "PER_WORKER"
    PER_REPLICA = "PER_REPLICA"


@dataclass(frozen=True)
class InputOptions:
    """Options for distributed datasets (``tf.distribute.InputOptions``).

    * ``experimental_fetch_to_device``: copy each replica's batch to its
      device (a CuPy array on a GPU replica). ``None`` means ``True``.
      CPU replicas get their NumPy batch as it is either way.
    * ``experimental_replication_mode``: :class:`InputReplicationMode`
      (``distribute_datasets_from_function`` only supports ``PER_REPLICA``).
    * ``experimental_place_dataset_on_device``: the dataset itself yields
      arrays on the replica's device, so nothing is copied; only with
      ``PER_REPLICA`` and ``experimental_fetch_to_device=False``.
    * ``experimental_per_replica_buffer_size``: with ``n > 0`` a background
      thread reads up to ``2 * (n + 1)`` steps ahead wherever something waits
      outside the GIL (several workers, file readers, a parallel ``map``,
      generators, GPU copies); an in-memory pipeline on one worker is read in
      the caller's thread, where a thread would only add hand-over cost. 0
      never starts a thread.

    Example:
        >>> o = InputOptions(experimental_fetch_to_device=False)
        >>> o.experimental_replication_mode.name, o.experimental_per_replica_buffer_size
        ('PER_WORKER', 1)
    """

    experimental_fetch_to_device: bool | None = None
    experimental_replication_mode: InputReplicationMode = InputReplicationMode.PER_WORKER
    experimental_place_dataset_on_device: bool = False
    experimental_per_replica_buffer_size: int = 1

    def __post_init__(self) -> None:
        fetch = self.experimental_fetch_to_device
        if fetch is None:
            object.__setattr__(self, "experimental_fetch_to_device", True)
        elif not isinstance(fetch, bool):
            raise TypeError(f"experimental_fetch_to_device must be a bool or None, got {fetch!r}")
        mode = self.experimental_replication_mode
        if not isinstance(mode, InputReplicationMode):
            try:
                mode = InputReplicationMode(mode)
            except ValueError:
                raise ValueError(
                    f"experimental_replication_mode is {mode!r}; expected "
                    "InputReplicationMode.PER_WORKER or InputReplicationMode.PER_REPLICA"
                ) from None
            object.__setattr__(self, "experimental_replication_mode", mode)
        if not isinstance(self.experimental_place_dataset_on_device, bool):
            raise TypeError(
                "experimental_place_dataset_on_device must be a bool, got "
                f"{self.experimental_place_dataset_on_device!r}"
            )
        size = check_count(
            "experimental_per_replica_buffer_size", self.experimental_per_replica_buffer_size, 0
        )
        object.__setattr__(self, "experimental_per_replica_buffer_size", size)


def check_input_options(options: InputOptions | None, *, from_function: bool) -> InputOptions:
    """``options`` (or the defaults) after TF's checks for the distributing call.

    ``from_function`` is ``True`` for ``distribute_datasets_from_function``,
    ``False`` for ``experimental_distribute_dataset``. ``PER_REPLICA`` is only
    for the former (``NotImplementedError`` otherwise, as in TF), and
    ``experimental_place_dataset_on_device`` needs ``PER_REPLICA`` without
    ``experimental_fetch_to_device``.

    Example:
        >>> check_input_options(None, from_function=False).experimental_fetch_to_device
        True
    """
    if options is None:
        return InputOptions()
    if not isinstance(options, InputOptions):
        raise TypeError(
            f"options must be an hpcdist InputOptions (tf.distribute.InputOptions), got "
            f"{type(options).__name__}; note that dataset options (Options, DistributeOptions) "
            "go on the dataset with dataset.with_options(...)"
        )
    per_replica = options.experimental_replication_mode is InputReplicationMode.PER_REPLICA
    if per_replica and not from_function:
        raise NotImplementedError(
            "InputReplicationMode.PER_REPLICA works only with distribute_datasets_from_function; "
            "experimental_distribute_dataset always reads one pipeline per worker"
        )
    if options.experimental_place_dataset_on_device:
        if not per_replica:
            raise ValueError(
                "experimental_place_dataset_on_device=True needs experimental_replication_mode="
                "InputReplicationMode.PER_REPLICA (with distribute_datasets_from_function); "
                "it is set with the replication mode "
                f"{options.experimental_replication_mode.name}"
            )
        if options.experimental_fetch_to_device:
            raise ValueError(
                "experimental_place_dataset_on_device=True cannot be combined with "
                "experimental_fetch_to_device=True (the default) in PER_REPLICA mode: the "
                "dataset is already on the device; pass experimental_fetch_to_device=False"
            )
    return options


__all__ = ["InputContext", "InputOptions", "InputReplicationMode", "check_input_options"]
