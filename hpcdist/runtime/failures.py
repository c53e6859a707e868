"""After a rank has failed (fault-tolerant MPI, ULFM), the survivors skip ``MPI_Finalize``.

Under ``mpirun --with-ft ulfm`` the survivors of a dead rank go on (the
parameter-server and coordinator code acknowledge the failure), but Open MPI's
``MPI_Finalize`` can then wait for the dead rank for ever (seen here about
once in ten loaded runs). Once a failure has been noted here, or the MPI
library knows of a failed rank in the world (ranks that never talked to the
dead one learn of it from the runtime), the exit guard that
:func:`hpcdist.runtime.world` registers flushes the standard streams and ends
the process with status 0 after every other exit handler has run, so the job
ends instead of hanging. Without a failure it does nothing.

Example:
    >>> from hpcdist.runtime.failures import failure_seen
    >>> failure_seen()
    False
"""

from __future__ import annotations

import atexit
import os
import sys

_seen = False
_registered = False


def note_process_failure() -> None:
    """Record that this process has acknowledged a failed rank (skip ``MPI_Finalize`` at exit).

    Example: ``note_process_failure()`` after ``comm.Ack_failed()``.
    """
    global _seen
    _seen = True


def failure_seen() -> bool:
    """Whether a failed rank has been noted in this process."""
    return _seen


def register_exit_guard() -> None:
    """Register the exit guard once; call it before any other hpcdist exit handler.

    ``atexit`` runs handlers last-registered first, so the guard (registered
    when the world is built) runs after the strategies' and coordinators'.

    Example: ``register_exit_guard()`` in :func:`hpcdist.runtime.world`.
    """
    global _registered
    if not _registered:
        _registered = True
        atexit.register(_exit_without_finalize)


def _world_has_failed_ranks() -> bool:
    """Whether the MPI library knows of a failed rank in the world (ULFM; else ``False``)."""
    try:
        from mpi4py import MPI  # lazy: MPI start-up (importing mpi4py.MPI initialises MPI)

        if not MPI.Is_initialized() or MPI.Is_finalized():
            return False
        failed = MPI.COMM_WORLD.Get_failed()
        try:
            return failed.Get_size() > 0
        finally:
            failed.Free()
    except Exception:  # an MPI without the fault-tolerance extension
        return False


def _exit_without_finalize() -> None:
    if _seen or _world_has_failed_ranks():
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:  # a closed stream: nothing to flush
                pass
        os._exit(0)


__all__ = ["failure_seen", "note_process_failure", "register_exit_guard"]
