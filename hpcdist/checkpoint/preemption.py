"""Save a checkpoint and exit when the job is about to be stopped (``PreemptionCheckpointHandler``).

Batch systems warn a job before they stop it: SLURM sends ``SIGTERM`` to every
task and ``SIGKILL`` ``KillWait`` seconds later (and ``sbatch --signal=USR1@60``
sends ``SIGUSR1`` a minute before the time limit); Open MPI's ``mpirun``
forwards ``SIGUSR1`` and ``SIGUSR2`` to every rank (a ``SIGTERM`` sent to
``mpirun`` itself ends the job at once). So the signals watched are
:data:`PREEMPTION_SIGNALS` = ``(SIGTERM, SIGUSR1)``, where TF watches only
``SIGTERM``.

**How it works.** The signal handler only counts the signal (no I/O, no MPI
in a handler). At every :meth:`PreemptionCheckpointHandler.run` call, before
the step, the workers agree whether any of them was signalled: one
``Allreduce`` (MAX) of one int64 over a *duplicate* of the strategy's
communicator (a ``Dup``, so the agreement never mixes with the collectives
engine's messages and checks). Its cost is that of one 8-byte
``MPI_Allreduce`` plus a little Python (the *All-reduce* section of
``docs/performance.md`` has raw MPI's 4-byte latency), small next to a
training step. If any worker was
signalled, every worker saves the same checkpoint (the manager's
``checkpoint_number`` is :attr:`~PreemptionCheckpointHandler.total_run_calls`,
the number of steps done) and then calls ``exit_fn``, which by default exits
with :data:`PREEMPTION_EXIT_CODE` (42, TF's code on platforms it does not
recognise) so that a wrapper script can tell "preempted, restart me" from an
error. With one worker there is no communicator and no collective.

Differences from TF, on purpose:

* the step to save at is agreed by a collective at each step, not by a
  coordination service and watcher threads: MPI ranks run in lock-step, so
  every worker sees the signal at the same ``run`` call;
* errors are not broadcast by the handler: an uncaught exception on one rank
  ends the whole job through hpcdist's abort hook (:mod:`hpcdist.runtime.abort`);
* a ``CheckpointManager`` the handler makes keeps 2 checkpoints (TF: 1), so
  that a damaged newest one falls back to the previous one;
* with a ``grace_period``, the earliest deadline of all signalled workers wins.

Example:
    >>> cfg = TerminationConfig(exit_fn=lambda: None, grace_period=0)
    >>> cfg.grace_period, PREEMPTION_EXIT_CODE
    (0, 42)
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import numpy as np

from hpcdist.checkpoint.checkpoint import Checkpoint
from hpcdist.checkpoint.manager import CheckpointManager
from hpcdist.checkpoint.watcher import PREEMPTION_SIGNALS, PreemptionWatcher
from hpcdist.distribute import context
from hpcdist.errors import CheckpointError

if TYPE_CHECKING:
    from hpcdist.checkpoint.checkpoint import Checkpoint
    from hpcdist.checkpoint.manager import CheckpointManager
    from hpcdist.cluster.base import ClusterResolver

__all__ = [
    "PREEMPTION_EXIT_CODE",
    "PREEMPTION_SIGNALS",
    "PreemptionCheckpointHandler",
    "PreemptionWatcher",
    "TerminationConfig",
]

log = logging.getLogger("hpcdist.checkpoint")

#: The exit status after the preemption checkpoint is saved (TF's default, 42): "restart me".
#: ``mpirun`` (and ``srun``) then end with it too, as every rank exits with it.
PREEMPTION_EXIT_CODE: int = 42

# Values of the per-step agreement (MAX over the workers): nothing, a notice, save and exit now.
_NOTHING, _SIGNALLED, _DEADLINE = 0, 1, 2


def _default_exit() -> None:
    sys.exit(PREEMPTION_EXIT_CODE)


class TerminationConfig:
    """How a :class:`PreemptionCheckpointHandler` learns of, and reacts to, a termination.

    Args:
        termination_watcher_fn: ``() -> bool``, called about once a second in a
            daemon thread; ``True`` means a termination notice arrived. When
            given, no signal handler is installed (as in TF). It must not block.
        exit_fn: ``() -> None``, called on every worker after the checkpoint is
            saved. Default: ``sys.exit(PREEMPTION_EXIT_CODE)``. If it returns,
            training goes on and a later signal saves again.
        grace_period: seconds between the notice and the real termination.
            ``None`` or ``0``: save and exit at the next step. ``> 0``: save at
            once, keep training, and save again and exit shortly before the
            deadline (leaving three times the time of two steps and a save).
        save_fn: replaces the manager's save: called on every worker with the
            arguments of :meth:`PreemptionCheckpointHandler.save_checkpoint_if_preempted`
            (none from ``run``). It must be collective like ``CheckpointManager.save``.

    Raises ``TypeError`` for a non-callable function and ``ValueError`` for a
    negative or non-finite ``grace_period``.

    Example:
        >>> TerminationConfig(grace_period=3600).grace_period
        3600
        >>> TerminationConfig(grace_period=-1)
        Traceback (most recent call last):
        ...
        ValueError: TerminationConfig(grace_period=-1): expected None or a number of seconds >= 0
    """

    def __init__(
        self,
        termination_watcher_fn: Callable[[], bool] | None = None,
        exit_fn: Callable[[], Any] | None = None,
        grace_period: float | None = None,
        save_fn: Callable[..., Any] | None = None,
    ) -> None:
        for name, fn in (
            ("termination_watcher_fn", termination_watcher_fn),
            ("exit_fn", exit_fn),
            ("save_fn", save_fn),
        ):
            if fn is not None and not callable(fn):
                raise TypeError(
                    f"TerminationConfig({name}={fn!r}): expected a function or None; "
                    f"got a {type(fn).__name__}"
                )
        if grace_period is not None:
            ok = isinstance(grace_period, (int, float)) and not isinstance(grace_period, bool)
            if not ok or not np.isfinite(grace_period) or grace_period < 0:
                raise ValueError(
                    f"TerminationConfig(grace_period={grace_period!r}): expected None or a "
                    "number of seconds >= 0"
                )
        self.termination_watcher_fn = termination_watcher_fn
        self.exit_fn = exit_fn
        self.grace_period = grace_period
        self.save_fn = save_fn

    def __repr__(self) -> str:
        return (
            f"TerminationConfig(termination_watcher_fn={self.termination_watcher_fn!r}, "
            f"exit_fn={self.exit_fn!r}, grace_period={self.grace_period!r}, "
            f"save_fn={self.save_fn!r})"
        )


def _find_strategy(checkpoint: Any) -> Any:
    """The strategy whose workers save ``checkpoint`` (its objects', else the current one)."""
    finder = getattr(checkpoint, "_strategy", None)
    if callable(finder):
        return finder()

    return context.get_strategy()


class _RunCounter:
    """``total_run_calls`` as a checkpointed object (TF's ``checkpointed_runs`` variable)."""

    def __init__(self) -> None:
        self.value = 0

    def _checkpoint_state(self) -> tuple[dict[str, np.ndarray], dict]:
        return {"value": np.array([self.value], dtype=np.int64)}, {}

    def _restore_checkpoint_state(self, arrays: dict[str, np.ndarray], meta: dict) -> None:
        value = np.asarray(arrays.get("value", np.zeros(1, np.int64))).reshape(-1)
        if value.size != 1:
            raise CheckpointError(
                f"the saved run counter has {value.size} values; expected 1 (a checkpoint "
                "that PreemptionCheckpointHandler wrote)"
            )
        self.value = int(value[0])


_ITERATION_NAME = "checkpointed_runs"  # TF's name for the saved run counter


def _attach_counter(checkpoint: Any) -> _RunCounter:
    """The run counter tracked by ``checkpoint`` under ``checkpointed_runs`` (added if missing)."""
    existing = getattr(checkpoint, _ITERATION_NAME, None)
    if isinstance(existing, _RunCounter):
        return existing
    if existing is not None:
        raise CheckpointError(
            f"the checkpoint already tracks an object named {_ITERATION_NAME!r} "
            f"({type(existing).__name__}); PreemptionCheckpointHandler keeps its run counter "
            "under that name: rename your object"
        )
    counter = _RunCounter()
    setattr(checkpoint, _ITERATION_NAME, counter)
    return counter


class PreemptionCheckpointHandler:
    """Save a checkpoint on every worker at the same step when any worker is told to stop.

    Args:
        cluster_resolver: the cluster resolver (e.g. ``strategy.cluster_resolver``);
            kept for TF compatibility and logging, may be ``None``.
        checkpoint_or_checkpoint_manager: a ``Checkpoint`` (then ``checkpoint_dir``
            is required and a ``CheckpointManager(max_to_keep=2)`` is made there)
            or a ``CheckpointManager`` (its directory is used; ``checkpoint_dir``
            must then be ``None`` or that directory).
        checkpoint_dir: where checkpoints are saved and restored from.
        termination_config: a :class:`TerminationConfig` (default: signals,
            exit with :data:`PREEMPTION_EXIT_CODE`, no grace period).

    On creation (collective: every worker, same point) the handler makes a
    communicator of its own for the strategy's workers, restores the newest
    valid checkpoint of the directory (``restore_or_initialize``) including
    :attr:`total_run_calls`, and starts watching :data:`PREEMPTION_SIGNALS`.
    The strategy is the one of the checkpointed objects (else the current one):
    the workers that save the checkpoint are the ones that agree. The
    checkpoint gets one more object, ``checkpointed_runs`` (as in TF).

    Example (every worker runs it under ``mpirun``)::

        with strategy.scope():
            model, optimizer = ...
        ckpt = hd.checkpoint.Checkpoint(model=model, optimizer=optimizer)
        handler = PreemptionCheckpointHandler(strategy.cluster_resolver, ckpt, "/scratch/ckpt")
        for step in range(handler.total_run_calls, num_steps):
            handler.run(train_step, next(iterator))
    """

    def __init__(
        self,
        cluster_resolver: ClusterResolver | None,
        checkpoint_or_checkpoint_manager: Checkpoint | CheckpointManager,
        checkpoint_dir: str | os.PathLike[str] | None = None,
        termination_config: TerminationConfig | None = None,
    ) -> None:
        config = TerminationConfig() if termination_config is None else termination_config
        if not isinstance(config, TerminationConfig):
            raise TypeError(
                f"termination_config must be a TerminationConfig or None; got "
                f"{type(config).__name__}"
            )
        target = checkpoint_or_checkpoint_manager
        if isinstance(target, CheckpointManager):
            manager = target
            checkpoint = manager.checkpoint
            if checkpoint_dir is not None and os.path.abspath(
                os.fspath(checkpoint_dir)
            ) != os.path.abspath(manager.directory):
                raise ValueError(
                    f"checkpoint_dir={os.fspath(checkpoint_dir)!r} differs from the manager's "
                    f"directory {manager.directory!r}; pass checkpoint_dir=None with a "
                    "CheckpointManager"
                )
        elif isinstance(target, Checkpoint):
            if checkpoint_dir is None:
                raise ValueError(
                    "PreemptionCheckpointHandler got a Checkpoint but no checkpoint_dir; pass "
                    "checkpoint_dir=... (where to save) or a CheckpointManager"
                )
            checkpoint = target
            manager = None
        else:
            raise TypeError(
                "checkpoint_or_checkpoint_manager must be an hpcdist Checkpoint or "
                f"CheckpointManager; got {type(target).__name__}"
            )
        self._cluster_resolver = cluster_resolver
        self._counter = _attach_counter(checkpoint)
        if manager is None:
            assert checkpoint_dir is not None  # checked above for a Checkpoint
            manager = CheckpointManager(checkpoint, os.fspath(checkpoint_dir), max_to_keep=2)
        self._manager = manager
        self._checkpoint = checkpoint
        self._exit_fn = config.exit_fn or _default_exit
        self._save_fn = config.save_fn
        self._grace_period = float(config.grace_period or 0.0)
        self._watcher = PreemptionWatcher(_find_strategy(checkpoint), config.termination_watcher_fn)
        self._manager.restore_or_initialize()
        self._run_counter = int(self._counter.value)
        self._countdown = False
        self._closed = False
        self._mean_run_time = 0.0
        self._timed_runs = 0
        self._save_time = 0.0
        self._watcher.start()

    # -- TF's API
    @property
    def total_run_calls(self) -> int:
        """How many times :meth:`run` was called, counting the runs before the restart.

        With single-step training functions it is the number of steps done: the
        loop restarts at ``epoch = total_run_calls // steps_per_epoch`` and
        ``step = total_run_calls % steps_per_epoch``.
        """
        return self._run_counter

    def run(self, distributed_train_function: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """Check for preemption, then return ``distributed_train_function(*args, **kwargs)``.

        The check comes *before* the step (as in TF), so a checkpoint holds
        whole steps and :attr:`total_run_calls` of them. Pass a function that
        runs one step (with ``strategy.run`` inside) so the save comes soon.
        Every worker must call ``run`` the same number of times: each call
        makes one tiny collective.

        Example: ``loss = handler.run(train_step, next(iterator))``.
        """
        self._check_and_maybe_save()
        start = time.monotonic()
        result = distributed_train_function(*args, **kwargs)
        self._timed_runs += 1
        self._mean_run_time += (time.monotonic() - start - self._mean_run_time) / self._timed_runs
        self._run_counter += 1
        return result

    def save_checkpoint_if_preempted(self, *args: Any, **kwargs: Any) -> None:
        """Save (and exit) if any worker was signalled; call it once per step, before the step.

        The alternative to :meth:`run` (use one or the other): it counts one
        run per call. ``args``/``kwargs`` go to ``save_fn`` when configured,
        else to ``CheckpointManager.save`` (default: ``checkpoint_number=total_run_calls``).

        Example::

            for step in range(handler.total_run_calls, num_steps):
                handler.save_checkpoint_if_preempted()
                train_step(next(iterator))
        """
        self._check_and_maybe_save(*args, **kwargs)
        self._run_counter += 1

    @contextlib.contextmanager
    def watch_preemption_scope(self) -> Iterator[None]:
        """Watch for preemption during the block, and stop watching at its end.

        The handler watches from its creation (as TF's); this scope bounds the
        watch: on leaving it the previous signal handlers are back, so a
        ``SIGTERM`` after training ends the process as usual. Inside it,
        :meth:`run` works as outside (TF needs the scope for TPUs only).

        Example::

            with handler.watch_preemption_scope():
                while handler.total_run_calls < num_steps:
                    handler.run(train_step, next(iterator))
        """
        self._watcher.start()
        try:
            yield
        finally:
            self._watcher.stop()

    def close(self) -> None:
        """Stop watching and free the handler's communicator (collective; hpcdist addition).

        Example: ``handler.close()`` after the training loop, on every worker.
        """
        self._watcher.close()
        self._closed = True

    # -- the check
    def _margin(self) -> float:
        """Time kept before the deadline: three times (two steps + one save)."""
        return 3.0 * (2.0 * self._mean_run_time + self._save_time)

    def _local_value(self) -> int:
        w = self._watcher
        if w.local_value() == _NOTHING and not (self._countdown and w.first_notice is not None):
            return _NOTHING
        if self._grace_period <= 0 or w.first_notice is None:
            return _DEADLINE
        deadline = w.first_notice + self._grace_period - self._margin()
        if time.monotonic() >= deadline:
            return _DEADLINE
        return _NOTHING if self._countdown else _SIGNALLED

    def _check_and_maybe_save(self, *args: Any, **kwargs: Any) -> None:
        if self._closed:
            raise RuntimeError(
                "this PreemptionCheckpointHandler is closed; make a new one to go on training"
            )
        received = self._watcher.received
        agreed = self._watcher.agree(self._local_value())
        if agreed == _NOTHING or (agreed == _SIGNALLED and self._countdown):
            return
        path = self._save(*args, **kwargs)
        if agreed == _SIGNALLED:  # a grace period: train on, save again before the deadline
            self._countdown = True
            log.info(
                "preemption notice: saved %s at step %d; training on for the grace period",
                path,
                self._run_counter,
            )
            return
        log.info("preemption: saved %s at step %d; exiting", path, self._run_counter)
        self._countdown = False
        self._watcher.mark_handled(received)
        self._exit_fn()

    def _save(self, *args: Any, **kwargs: Any) -> Any:
        self._counter.value = self._run_counter
        start = time.monotonic()
        if self._save_fn is not None:
            path = self._save_fn(*args, **kwargs)
        elif args or kwargs:
            path = self._manager.save(*args, **kwargs)
        else:
            path = self._manager.save(checkpoint_number=self._run_counter, check_interval=False)
        self._save_time = time.monotonic() - start
        return path

    def __repr__(self) -> str:
        return (
            f"<PreemptionCheckpointHandler directory={self._manager.directory!r} "
            f"total_run_calls={self._run_counter} grace_period={self._grace_period}>"
        )
