"""Launch mistakes caught at start-up, before any training happens.

* ``srun`` without a PMI plugin starts N independent MPI singletons, each of
  which would train its own model. The scheduler says N tasks, MPI says 1.
* The launcher's world size and MPI's ``COMM_WORLD`` size disagree (mpi4py
  built against another MPI than the ``mpirun`` that started the job).

``HPCDIST_SKIP_LAUNCH_CHECK=1`` turns the checks off (for the rare launcher
that sets misleading variables); the errors say so.

Example:
    >>> check_launch(1, environ={})  # plain `python script.py`: nothing to report
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

from hpcdist.cluster.envparse import env_flag, environ_or_default
from hpcdist.cluster.launchers import LaunchInfo, detect_launcher
from hpcdist.cluster.schedulers import detect_scheduler
from hpcdist.errors import HpcdistError, LaunchError
from hpcdist.runtime.mpi import library_version

log = logging.getLogger("hpcdist")

SKIP_VAR = "HPCDIST_SKIP_LAUNCH_CHECK"


def _pmi_advice(library: str) -> str:
    if "MPICH" in library or "Intel" in library or "MVAPICH" in library:
        first, second = "srun --mpi=pmi2", "srun --mpi=pmix"
    else:
        first, second = "srun --mpi=pmix", "srun --mpi=pmi2"
    return (
        f"Launch with `{first} ...` (or `{second}`, whichever your MPI supports; "
        f"`srun --mpi=list` shows them), or run `mpirun` inside the allocation"
    )


def _library() -> str:
    try:
        return library_version()
    except Exception:  # the check must still explain itself when MPI is odd
        return "unknown MPI library"


def check_launch(world_size: int, environ: Mapping[str, str] | None = None) -> None:
    """Raise :class:`LaunchError` when the launch cannot give one synchronous job.

    ``world_size`` is the size of MPI's ``COMM_WORLD`` in this process.

    Example: ``check_launch(2, {"OMPI_COMM_WORLD_SIZE": "2", ...})`` passes.
    """
    env = environ_or_default(environ)
    if env_flag(env, SKIP_VAR):
        return
    launch = detect_launcher(env)
    scheduler = detect_scheduler(env)
    skip = f"(Set {SKIP_VAR}=1 to skip this check if you are sure the launch is right.)"

    if launch is not None and launch.size != world_size:
        raise LaunchError(_size_mismatch(launch, world_size, skip))

    if (
        launch is None
        and scheduler is not None
        and not scheduler.in_step
        and (scheduler.num_tasks or 1) > 1
        and world_size == 1
    ):
        log.warning(
            "%s allocated %s tasks but this program runs as one process (no srun or mpirun): "
            "only one task is used. Start it with srun or mpirun to use all of them.",
            scheduler.scheduler,
            scheduler.num_tasks,
        )


def _size_mismatch(launch: LaunchInfo, world_size: int, skip: str) -> str:
    library = _library()
    if world_size == 1 and launch.launcher == "srun":
        return (
            f"srun started {launch.size} tasks (this is task {launch.rank}) but MPI sees a "
            f"world of 1: srun ran without a PMI plugin, so each task is its own MPI "
            f"singleton and the job would train {launch.size} separate models. "
            f"{_pmi_advice(library)}. {skip}"
        )
    if world_size == 1 and launch.launcher.startswith("srun"):
        plugin = launch.launcher.split("=", 1)[-1]
        return (
            f"{launch.launcher} started {launch.size} tasks (this is task {launch.rank}) but "
            f"MPI sees a world of 1: the MPI library ({library}) did not join srun's {plugin} "
            f"PMI, so each task is its own singleton and the job would train {launch.size} "
            f"separate models. {_pmi_advice(library)}. {skip}"
        )
    if world_size == 1:
        return (
            f"the launcher ({launch.launcher}) started {launch.size} processes but MPI sees a "
            f"world of 1 in each: mpi4py is linked to a different MPI ({library}) than the "
            f"launcher that started the job. Use the launcher of that MPI (for the PyPI "
            f"wheels, the `mpirun` in the same virtual environment), or rebuild mpi4py "
            f"against your site MPI. {skip}"
        )
    return (
        f"world sizes disagree: the launcher ({launch.launcher}) says {launch.size} processes "
        f"but MPI's COMM_WORLD has {world_size} ({library}). Check that the launcher and "
        f"mpi4py use the same MPI and that no wrapper script starts extra processes. {skip}"
    )


SHARED_GPUS_VAR = "HPCDIST_ALLOW_SHARED_GPUS"


def shared_gpu_problems(
    views: Sequence[tuple[str, Sequence[str]]], environ: Mapping[str, str] | None = None
) -> list[str]:
    """Messages naming the ranks of one host that use the same GPU (``[]``: none share).

    ``views[rank]`` is ``(host, physical GPU ids)``: ``CUDA_VISIBLE_DEVICES``
    entries (ordinals or UUIDs) as the host numbers them. Synchronous training
    with two ranks on one GPU runs at half speed at best, and NCCL refuses such
    a communicator, so this is a launch mistake unless
    ``HPCDIST_ALLOW_SHARED_GPUS=1`` says it is meant.

    Example:
        >>> shared_gpu_problems([("n1", ["0"]), ("n1", ["0"]), ("n2", ["0"])], environ={})
        ['ranks 0, 1 on host n1 all use GPU 0']
    """
    if env_flag(environ_or_default(environ), SHARED_GPUS_VAR):
        return []
    users: dict[tuple[str, str], list[int]] = {}
    for rank, (host, gpus) in enumerate(views):
        for gpu in dict.fromkeys(gpus):
            users.setdefault((host, gpu), []).append(rank)
    return [
        f"ranks {', '.join(map(str, ranks))} on host {host} all use GPU {gpu}"
        for (host, gpu), ranks in users.items()
        if len(ranks) > 1
    ]


def shared_gpu_advice() -> str:
    """How to fix ranks sharing a GPU (for :func:`shared_gpu_problems`'s error)."""
    return (
        "start one rank per GPU (srun --gpus-per-task=1, or mpirun with as many ranks per "
        "node as GPUs and no CUDA_VISIBLE_DEVICES forced to the same value on every rank), "
        f"or set {SHARED_GPUS_VAR}=1 if sharing is intended"
    )


def check_launch_everywhere(comm: Any) -> None:
    """:func:`check_launch` on every rank of ``comm``; all raise if any rank fails.

    Collective over ``comm``: a rank that finds a mistake (say, a malformed
    launcher variable in its own environment) must not leave the others
    waiting in the next collective. The others raise :class:`LaunchError`
    naming the failing ranks and quoting the first message.

    Example: ``check_launch_everywhere(MPI.COMM_WORLD)`` at start-up.
    """
    size = comm.Get_size()
    problem: HpcdistError | None = None
    try:
        check_launch(size)
    except HpcdistError as exc:
        problem = exc
    if size > 1:
        messages = comm.allgather(None if problem is None else str(problem))
        failed = [rank for rank, message in enumerate(messages) if message]
        if problem is None and failed:
            raise LaunchError(
                f"the launch check failed on rank(s) {failed}; rank {failed[0]} says: "
                f"{messages[failed[0]]}"
            )
    if problem is not None:
        raise problem
