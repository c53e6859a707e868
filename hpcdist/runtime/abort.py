"""An uncaught exception or an interrupt on one rank aborts the whole job instead of hanging it.

Without this, a rank that dies of an exception leaves the others waiting
forever in their next collective, and ``MPI_Finalize`` on the dying rank can
wait for them too. :func:`hpcdist.runtime.world` installs the hook in worlds
of more than one rank; then ``MPI_Abort`` ends every rank (the launcher
reports the exit code: 1, or 130 after ``SIGINT``).

What each rank prints:

* ``KeyboardInterrupt`` (``SIGINT``, Ctrl-C): one line naming the rank and the
  signal, no traceback, on the first interrupted rank of a host; the others
  (Ctrl-C on ``srun`` interrupts every rank at once) print nothing.
* another exception: the first rank of a host to fail prints
  ``hpcdist: rank R: uncaught exception, aborting the job`` and the full
  traceback; ranks failing after it print one line each (their error and
  which rank failed first). :class:`~hpcdist.errors.RankFailedError` (a peer
  that this rank waited for is gone) is always one line.

"First" is decided by a claim file in the temporary directory, created
atomically by the first failing rank of each host (so a job over several
hosts shows at most one traceback per host). An aborted job leaves its empty claim
file behind; rank 0 of every later job removes those older than ten minutes.
``HPCDIST_ABORT_ON_ERROR=0`` keeps Python's own behaviour.

Example:
    >>> from hpcdist.runtime.abort import abort_on_error_enabled
    >>> abort_on_error_enabled({"HPCDIST_ABORT_ON_ERROR": "0"})
    False
"""

from __future__ import annotations

import glob
import os
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Mapping
from typing import Any

from hpcdist.cluster.envparse import env_flag, environ_or_default
from hpcdist.errors import RankFailedError
from hpcdist.observe.recorder import dump_now

ABORT_VAR = "HPCDIST_ABORT_ON_ERROR"
INTERRUPT_EXIT_CODE = 130  # 128 + SIGINT, what a shell reports for Ctrl-C
CLAIM_PREFIX = "hpcdist-failed-"
STALE_CLAIM_S = 600  # claims only matter while a job aborts; later jobs remove older ones
_installed = False


def abort_on_error_enabled(environ: Mapping[str, str] | None = None) -> bool:
    """Whether the abort hook is wanted (``HPCDIST_ABORT_ON_ERROR``, default on)."""
    return env_flag(environ_or_default(environ), ABORT_VAR) is not False


def claim_first_failure(path: str, rank: int) -> int | None:
    """Claim ``path`` for ``rank``: ``None`` if this rank is the first, else the first one's rank.

    The claim is an exclusive file creation, atomic among the processes of a
    host. An unusable directory makes every rank "first" (full reports).
    Example: ``claim_first_failure("/tmp/hpcdist-failed-x", 1) is None`` on the first call.
    """
    try:
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    except FileExistsError:
        for _ in range(20):  # the first rank writes its number right after creating the file
            try:
                with open(path) as f:
                    text = f.read().strip()
                if text:
                    return int(text)
            except (OSError, ValueError):
                pass
            time.sleep(0.005)
        return -1
    except OSError:
        return None
    try:
        os.write(fd, f"{rank}\n".encode())
    finally:
        os.close(fd)
    return None


def _remove_stale_claims(directory: str) -> None:
    cutoff = time.time() - STALE_CLAIM_S
    for path in glob.glob(os.path.join(directory, CLAIM_PREFIX + "*")):
        try:
            if os.path.getmtime(path) < cutoff:
                os.remove(path)
        except OSError:
            pass


def _one_line(value: BaseException) -> str:
    text = str(value).strip().splitlines()
    return f"{type(value).__name__}: {text[0]}" if text else type(value).__name__


def install_abort_on_error(comm: Any) -> bool:
    """Chain ``sys.excepthook`` and ``threading.excepthook`` to call ``comm.Abort``.

    Collective over ``comm`` (rank 0 names the job's claim file). Returns
    whether the hooks are installed. A rank that ends with ``sys.exit()``
    while others still run is not an exception and is not caught here; MPI
    launchers end the job when a rank exits with a non-zero status before
    ``MPI_Finalize``.

    Example: ``install_abort_on_error(MPI.COMM_WORLD)`` once, at start-up.
    """
    global _installed
    if _installed or not abort_on_error_enabled():
        return _installed
    rank = comm.Get_rank()
    directory = tempfile.gettempdir()
    token = comm.bcast(os.urandom(8).hex() if rank == 0 else None, root=0)
    claim = os.path.join(directory, f"{CLAIM_PREFIX}{token}")
    if rank == 0:
        _remove_stale_claims(directory)

    def abort(code: int) -> None:
        path = dump_now("abort")  # the flight recorder's last collectives, for the report
        if path is not None:
            sys.stderr.write(f"hpcdist: rank {rank}: flight recorder written to {path}\n")
        sys.stderr.flush()
        sys.stdout.flush()
        comm.Abort(code)

    def report(kind: type[BaseException], value: BaseException, tb: Any, where: str) -> int:
        """Print this rank's report; return the exit code for ``MPI_Abort``."""
        first = claim_first_failure(claim, rank)
        if issubclass(kind, KeyboardInterrupt):
            if first is None:
                sys.stderr.write(
                    f"hpcdist: rank {rank}: interrupted by SIGINT (KeyboardInterrupt){where}, "
                    "ending the job on every rank\n"
                )
            return INTERRUPT_EXIT_CODE

        if first is None and not issubclass(kind, RankFailedError):
            sys.stderr.write(f"hpcdist: rank {rank}: uncaught exception{where}, aborting the job\n")
            sys.stderr.write("".join(traceback.format_exception(kind, value, tb)))
            return 1
        after = "" if first is None else (
            f" (rank {first} failed first; its traceback is in its output)" if first >= 0 else ""
        )
        sys.stderr.write(f"hpcdist: rank {rank}{where}: {_one_line(value)}{after}\n")
        return 1

    def hook(kind: type[BaseException], value: BaseException, tb: Any) -> None:
        abort(report(kind, value, tb, ""))

    previous_thread = threading.excepthook

    def thread_hook(args: Any) -> None:
        if issubclass(args.exc_type, SystemExit):
            previous_thread(args)
            return
        name = getattr(args.thread, "name", "?")
        value = args.exc_value if args.exc_value is not None else args.exc_type()
        abort(report(args.exc_type, value, args.exc_traceback, f" in thread {name}"))

    sys.excepthook = hook
    threading.excepthook = thread_hook
    _installed = True
    return True
