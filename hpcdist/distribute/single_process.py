"""Checks shared by the single-process strategies (OneDevice, Mirrored).

The classic silent failure of data-parallel training under MPI: a script
written for one machine (``MirroredStrategy``) launched with ``mpirun -n 8``
runs eight unrelated copies that each train their own model. hpcdist refuses
to start that way unless told that independent copies are what is wanted.

Example:
    >>> check_single_process("MirroredStrategy", environ={})  # a plain python run
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from hpcdist.cluster.envparse import env_flag
from hpcdist.cluster.launchers import detect_launcher
from hpcdist.errors import LaunchError
from hpcdist.runtime.mpi import is_initialized, mpi

INDEPENDENT_VAR = "HPCDIST_INDEPENDENT_WORKERS"


def launched_ranks(environ: Mapping[str, str] | None = None) -> tuple[int, int]:
    """``(rank, size)`` of this process's MPI job, without starting MPI if it is not running."""

    if is_initialized():
        comm = mpi().COMM_WORLD
        return comm.Get_rank(), comm.Get_size()

    info = detect_launcher(os.environ if environ is None else environ)
    return (0, 1) if info is None else (info.rank, info.size)


def check_single_process(name: str, environ: Mapping[str, str] | None = None) -> None:
    """Raise :class:`LaunchError` when a single-process strategy starts in a multi-rank job.

    ``HPCDIST_INDEPENDENT_WORKERS=1`` allows it (each rank then trains on its own).
    """
    env = os.environ if environ is None else environ
    rank, size = launched_ranks(env)
    if size <= 1 or env_flag(env, INDEPENDENT_VAR):
        return
    raise LaunchError(
        f"{name} runs in one process, but this is rank {rank} of {size} MPI ranks: every "
        f"rank would train its own separate model. Use hpcdist.MultiWorkerMirroredStrategy "
        f"to train one model over all ranks, or set {INDEPENDENT_VAR}=1 if independent "
        "copies are what you want."
    )
