"""Which launcher started this process (the scheduler is in :mod:`hpcdist.cluster.schedulers`).

Pure functions of the environment: every function takes an optional
``environ`` mapping (``os.environ`` by default), so the detection is tested
with captured dicts of variables and never touches MPI.

Launchers are tried in this fixed order; the first whose variables are
present answers (:data:`LAUNCHERS`):

1. ``jsrun`` (LSF/CSM): ``JSM_NAMESPACE_*``. Spectrum MPI also exports
   ``OMPI_COMM_WORLD_*`` under jsrun, so jsrun is asked before Open MPI. An
   LSF batch script itself never carries ``JSM_NAMESPACE_RANK``.
2. ``openmpi`` (``mpirun``/``mpiexec``/``prterun`` of Open MPI 4 and 5):
   ``OMPI_COMM_WORLD_*``.
3. ``mvapich`` (``mpirun_rsh``/``mpiexec`` of MVAPICH): ``MV2_COMM_WORLD_*``.
4. ``pals`` (Cray PALS ``mpiexec`` under PBS): ``PALS_RANKID``,
   ``PALS_LOCAL_RANKID``, ``PALS_NODEID``; the size from ``PMI_SIZE``. Not
   when srun set them (``srun --mpi=cray_shasta``, seen by ``SLURM_MPI_TYPE``
   in an srun step): that is an srun launch.
5. ``hydra`` (MPICH and Intel MPI ``mpiexec``): ``PMI_RANK``/``PMI_SIZE``
   together with Hydra's own ``MPI_LOCALRANKID``/``MPI_LOCALNRANKS``, which
   neither srun nor Flux sets.
6. ``flux`` (``flux run``): ``FLUX_TASK_RANK``, ``FLUX_TASK_LOCAL_ID``,
   ``FLUX_JOB_SIZE``, ``FLUX_JOB_NNODES``.
7. ``srun`` (a SLURM job step, not the batch script): ``SLURM_PROCID``,
   ``SLURM_STEP_NUM_TASKS``, ``SLURM_LOCALID``, ``SLURM_NODEID``. Its PMI
   shows in the name: ``"srun --mpi=pmix"`` when srun's PMIx server set
   ``PMIX_RANK``, ``"srun --mpi=pmi2"`` when srun set ``PMI_RANK``,
   ``"srun --mpi=cray_shasta"`` when srun set ``PALS_RANKID``, else ``"srun"``
   (no PMI: an MPI library will start as a singleton).
8. ``pmix``: ``PMIX_RANK`` alone, size from ``SLURM_STEP_NUM_TASKS`` or
   ``SLURM_NTASKS``.
9. ``pmi``: ``PMI_RANK``/``PMI_SIZE`` alone (a PMI-1 launcher other than the
   above).

Why this order: the variables of the innermost launcher must win. An MPI
launcher started inside a batch allocation (``mpirun`` in an sbatch script)
inherits the batch step's ``SLURM_*`` variables (``SLURM_PROCID=0`` on every
rank), and Open MPI and Hydra start their daemons with ``srun``, so their
ranks also see a step's ``SLURM_STEP_ID``. Launchers that set per-process
variables of their own (1-5) therefore come before the resource managers
(Flux, srun) whose variables may be inherited. ``srun --mpi=pmi2`` sets
``PMI_RANK``/``PMI_SIZE`` but no ``MPI_LOCALRANKID``, so it is not taken for
Hydra; srun's PMI variables are only credited to srun when they agree with
``SLURM_PROCID``.

Example:
    >>> env = {"OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "4",
    ...        "OMPI_COMM_WORLD_LOCAL_RANK": "1", "OMPI_COMM_WORLD_LOCAL_SIZE": "2",
    ...        "SLURM_JOB_ID": "42", "SLURM_PROCID": "0"}
    >>> detect_launcher(env)
    LaunchInfo(launcher='openmpi', rank=1, size=4, local_rank=1, local_size=2, node_index=None)
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from hpcdist.cluster.envparse import environ_or_default, parse_uint, short
from hpcdist.cluster.hostlist import expand_tasks_per_node
from hpcdist.errors import LauncherConfigError, SlurmConfigError

# SLURM's reserved step ids (slurm.h): batch 0xfffffffb, extern 0xfffffffc,
# interactive 0xfffffffa, pending 0xfffffffd; real steps count up from 0 and
# stay below 0xfffffff0. Step ids are 32-bit.
_FIRST_SPECIAL_STEP_ID = 0xFFFFFFF0
_MAX_STEP_ID = 0xFFFFFFFF
# The names scontrol and sacct give the special steps, as a SLURM_STEP_ID might carry them.
_SPECIAL_STEP_NAMES = ("batch", "extern", "interactive", "pending")
_STEP_VARS = ("SLURM_STEP_ID", "SLURM_STEPID")
_STALE_HINT = "The launcher sets this variable: unset or correct it, or launch the job again"


@dataclass(frozen=True)
class LaunchInfo:
    """Where a launcher placed this process.

    ``local_rank``/``local_size`` count the ranks of this job on this node;
    ``node_index`` is the index of this node in the launch. Each is ``None``
    when the launcher does not say.

    Example:
        >>> LaunchInfo("srun", 3, 4, 1, 2, 1).size
        4
    """

    launcher: str
    rank: int
    size: int
    local_rank: int | None
    local_size: int | None
    node_index: int | None


# -- parsing helpers -----------------------------------------------------------------


def opt_int(environ: Mapping[str, str], name: str) -> int | None:
    """The non-negative integer in ``environ[name]``, ``None`` if unset."""
    value = environ.get(name)
    if value is None:
        return None
    try:
        return parse_uint(name, value, LauncherConfigError)
    except LauncherConfigError as e:
        raise LauncherConfigError(f"{e}. {_STALE_HINT}") from None


def _req_int(environ: Mapping[str, str], name: str, launcher: str) -> int:
    value = opt_int(environ, name)
    if value is None:
        raise LauncherConfigError(
            f"{name} is not set, but other {launcher} variables are; expected {launcher} to "
            f"set it. Launch the job again with {launcher}, or unset its stale variables"
        )
    return value


def first_int(environ: Mapping[str, str], names: tuple[str, ...]) -> tuple[str, int | None]:
    """The first of ``names`` that is set, with its value (``names[0], None`` if none)."""
    for name in names:
        if name in environ:
            return name, opt_int(environ, name)
    return names[0], None


def _checked(
    launcher: str,
    rank: tuple[str, int],
    size: tuple[str, int],
    local_rank: tuple[str, int | None] = ("", None),
    local_size: tuple[str, int | None] = ("", None),
    node_index: int | None = None,
) -> LaunchInfo:
    """Build a LaunchInfo after checking the values against each other."""
    (rank_var, r), (size_var, s) = rank, size
    (lr_var, lr), (ls_var, ls) = local_rank, local_size
    if s < 1:
        raise LauncherConfigError(
            f"{size_var} is {s}; expected the number of ranks, at least 1 ({launcher})"
        )
    if r >= s:
        raise LauncherConfigError(
            f"{rank_var} is {r} but {size_var} is {s}; expected a rank below the size "
            f"({launcher}). The variables are stale or edited: launch the job again"
        )
    if ls is not None and not 1 <= ls <= s:
        raise LauncherConfigError(
            f"{ls_var} is {ls}; expected between 1 and {size_var}={s} ({launcher})"
        )
    if lr is not None and ls is not None and lr >= ls:
        raise LauncherConfigError(
            f"{lr_var} is {lr} but {ls_var} is {ls}; expected a local rank below the local "
            f"size ({launcher})"
        )
    if lr is not None and lr >= s:
        raise LauncherConfigError(
            f"{lr_var} is {lr} but {size_var} is {s}; expected a local rank below the size "
            f"({launcher})"
        )
    return LaunchInfo(launcher, r, s, lr, ls, node_index)


def slurm_step_id(environ: Mapping[str, str] | None = None) -> int | None:
    """The id of the srun step this process runs in, ``None`` outside a step.

    ``None`` outside a SLURM job (no ``SLURM_JOB_ID``/``SLURM_JOBID``), when
    ``SLURM_STEP_ID`` (``SLURM_STEPID``) is unset (a batch script or an
    ``salloc`` shell), and for SLURM's special steps (batch, extern,
    interactive: ids from ``0xfffffff0``, or their names).

    Raises:
        LauncherConfigError: ``SLURM_STEP_ID`` is neither a step id (a whole
            number below 2**32) nor a special step's name, or it disagrees
            with ``SLURM_STEPID``.

    Example:
        >>> slurm_step_id({"SLURM_JOB_ID": "7", "SLURM_STEP_ID": "0"})
        0
        >>> slurm_step_id({"SLURM_JOB_ID": "7"}) is None
        True
        >>> slurm_step_id({"SLURM_JOB_ID": "7", "SLURM_STEP_ID": "4294967291"}) is None
        True
    """
    environ = environ_or_default(environ)
    if "SLURM_JOB_ID" not in environ and "SLURM_JOBID" not in environ:
        return None
    found = [(name, environ[name]) for name in _STEP_VARS if name in environ]
    if not found:
        return None
    (name, value), *others = found
    for other, other_value in others:
        if str(other_value).strip() != str(value).strip():
            raise LauncherConfigError(
                f"{name} is {short(value)} but {other} is {short(other_value)}; expected "
                f"SLURM to set both to the same step id. {_STALE_HINT}"
            )
    if isinstance(value, str) and value.strip().lower() in _SPECIAL_STEP_NAMES:
        return None
    try:
        step_id = parse_uint(name, value, LauncherConfigError, 0, _MAX_STEP_ID)
    except LauncherConfigError as e:
        raise LauncherConfigError(
            f"{e} (a SLURM step id, or one of {', '.join(_SPECIAL_STEP_NAMES)}). {_STALE_HINT}"
        ) from None
    return step_id if step_id < _FIRST_SPECIAL_STEP_ID else None


def _tasks_on_node(environ: Mapping[str, str], name: str, node: int, node_var: str) -> int:
    """Entry ``node`` of the tasks-per-node list in ``environ[name]`` (``"2(x3),1"``)."""
    try:
        counts = expand_tasks_per_node(environ[name])
    except SlurmConfigError as e:
        raise LauncherConfigError(f"{name}: {e}. {_STALE_HINT}") from None
    if node >= len(counts):
        raise LauncherConfigError(
            f"{node_var} is {node} but {name}={short(environ[name])} lists {len(counts)} "
            f"node(s); expected a node index below {len(counts)}. {_STALE_HINT}"
        )
    return counts[node]


# -- one class per launcher ----------------------------------------------------------------


class Launcher:
    """A launcher: ``is_env_present(environ)`` and ``read(environ) -> LaunchInfo``.

    Example:
        >>> OpenMPILauncher().is_env_present({"OMPI_COMM_WORLD_RANK": "0"})
        True
    """

    name = ""

    def is_env_present(self, environ: Mapping[str, str]) -> bool:
        raise NotImplementedError

    def read(self, environ: Mapping[str, str]) -> LaunchInfo:
        raise NotImplementedError


class _PrefixLauncher(Launcher):
    """Launchers exporting ``<P>RANK``, ``<P>SIZE``, ``<P>LOCAL_RANK``, ``<P>LOCAL_SIZE``."""

    prefix = ""

    def is_env_present(self, environ: Mapping[str, str]) -> bool:
        return self.prefix + "RANK" in environ

    def read(self, environ: Mapping[str, str]) -> LaunchInfo:
        p, n = self.prefix, self.name
        return _checked(
            n,
            (p + "RANK", _req_int(environ, p + "RANK", n)),
            (p + "SIZE", _req_int(environ, p + "SIZE", n)),
            (p + "LOCAL_RANK", opt_int(environ, p + "LOCAL_RANK")),
            (p + "LOCAL_SIZE", opt_int(environ, p + "LOCAL_SIZE")),
        )


class JsrunLauncher(_PrefixLauncher):
    """IBM LSF ``jsrun``: ``JSM_NAMESPACE_RANK/SIZE/LOCAL_RANK/LOCAL_SIZE``.

    Example:
        >>> JsrunLauncher().read({"JSM_NAMESPACE_RANK": "0", "JSM_NAMESPACE_SIZE": "2"}).size
        2
    """

    name = "jsrun"
    prefix = "JSM_NAMESPACE_"


class OpenMPILauncher(_PrefixLauncher):
    """Open MPI 4 and 5 (``mpirun``, ``mpiexec``, ``prterun``): ``OMPI_COMM_WORLD_*``.

    ``OMPI_COMM_WORLD_NODE_RANK`` is a rank on the node counted over all jobs,
    not the index of the node, so ``node_index`` stays ``None``.

    Example:
        >>> OpenMPILauncher().read({"OMPI_COMM_WORLD_RANK": "1",
        ...                         "OMPI_COMM_WORLD_SIZE": "2"}).rank
        1
    """

    name = "openmpi"
    prefix = "OMPI_COMM_WORLD_"

    def read(self, environ: Mapping[str, str]) -> LaunchInfo:
        opt_int(environ, "OMPI_COMM_WORLD_NODE_RANK")  # validated, not used
        return super().read(environ)


class MVAPICHLauncher(_PrefixLauncher):
    """MVAPICH (``mpirun_rsh``, ``mpiexec``): ``MV2_COMM_WORLD_*``.

    Example:
        >>> MVAPICHLauncher().read({"MV2_COMM_WORLD_RANK": "0",
        ...                         "MV2_COMM_WORLD_SIZE": "1"}).launcher
        'mvapich'
    """

    name = "mvapich"
    prefix = "MV2_COMM_WORLD_"


class PALSLauncher(Launcher):
    """Cray PALS ``mpiexec``: ``PALS_RANKID``, ``PALS_LOCAL_RANKID``, ``PALS_NODEID``.

    The size comes from ``PMI_SIZE`` (Cray PMI), the local size from
    ``PALS_LOCAL_SIZE`` or ``PMI_LOCAL_SIZE`` when set.

    Example:
        >>> PALSLauncher().read({"PALS_RANKID": "2", "PALS_LOCAL_RANKID": "0",
        ...                      "PALS_NODEID": "1", "PMI_SIZE": "4"}).node_index
        1
    """

    name = "pals"

    def is_env_present(self, environ: Mapping[str, str]) -> bool:
        if "PALS_RANKID" not in environ:
            return False
        by_srun = environ.get("SLURM_MPI_TYPE", "").startswith("cray_shasta")
        same_rank = environ.get("SLURM_PROCID") == environ["PALS_RANKID"]
        return not (by_srun and same_rank and slurm_step_id(environ) is not None)

    def read(self, environ: Mapping[str, str]) -> LaunchInfo:
        n = self.name
        return _checked(
            n,
            ("PALS_RANKID", _req_int(environ, "PALS_RANKID", n)),
            ("PMI_SIZE", _req_int(environ, "PMI_SIZE", n)),
            ("PALS_LOCAL_RANKID", opt_int(environ, "PALS_LOCAL_RANKID")),
            first_int(environ, ("PALS_LOCAL_SIZE", "PMI_LOCAL_SIZE")),
            opt_int(environ, "PALS_NODEID"),
        )


class HydraLauncher(Launcher):
    """MPICH or Intel MPI Hydra ``mpiexec``: ``PMI_RANK``, ``PMI_SIZE``, ``MPI_LOCALRANKID``.

    Hydra's ``MPI_LOCALRANKID`` is what tells it apart from ``srun --mpi=pmi2``
    and Flux, which set ``PMI_RANK``/``PMI_SIZE`` too.

    Example:
        >>> HydraLauncher().read({"PMI_RANK": "1", "PMI_SIZE": "2", "MPI_LOCALRANKID": "1",
        ...                       "MPI_LOCALNRANKS": "2"}).local_rank
        1
    """

    name = "hydra"

    def is_env_present(self, environ: Mapping[str, str]) -> bool:
        return "MPI_LOCALRANKID" in environ and "PMI_RANK" in environ

    def read(self, environ: Mapping[str, str]) -> LaunchInfo:
        n = self.name
        return _checked(
            n,
            ("PMI_RANK", _req_int(environ, "PMI_RANK", n)),
            ("PMI_SIZE", _req_int(environ, "PMI_SIZE", n)),
            ("MPI_LOCALRANKID", opt_int(environ, "MPI_LOCALRANKID")),
            ("MPI_LOCALNRANKS", opt_int(environ, "MPI_LOCALNRANKS")),
        )


class FluxLauncher(Launcher):
    """Flux ``flux run``: ``FLUX_TASK_RANK``, ``FLUX_TASK_LOCAL_ID``, ``FLUX_JOB_SIZE``.

    Flux gives no local size; on a one-node job (``FLUX_JOB_NNODES=1``) it is
    the job size.

    Example:
        >>> FluxLauncher().read({"FLUX_TASK_RANK": "3", "FLUX_TASK_LOCAL_ID": "1",
        ...                      "FLUX_JOB_SIZE": "4", "FLUX_JOB_NNODES": "2"}).local_size is None
        True
    """

    name = "flux"

    def is_env_present(self, environ: Mapping[str, str]) -> bool:
        return "FLUX_TASK_RANK" in environ

    def read(self, environ: Mapping[str, str]) -> LaunchInfo:
        n = self.name
        size = _req_int(environ, "FLUX_JOB_SIZE", n)
        nnodes = opt_int(environ, "FLUX_JOB_NNODES")
        if nnodes == 0:
            raise LauncherConfigError("FLUX_JOB_NNODES is 0; expected at least 1 node (flux)")
        return _checked(
            n,
            ("FLUX_TASK_RANK", _req_int(environ, "FLUX_TASK_RANK", n)),
            ("FLUX_JOB_SIZE", size),
            ("FLUX_TASK_LOCAL_ID", opt_int(environ, "FLUX_TASK_LOCAL_ID")),
            ("FLUX_JOB_SIZE", size if nnodes == 1 else None),
            0 if nnodes == 1 else None,
        )


_SRUN_PMI_RANKS = ("PMIX_RANK", "PMI_RANK", "PALS_RANKID")


class SrunLauncher(Launcher):
    """SLURM ``srun`` step: ``SLURM_PROCID``, ``SLURM_STEP_NUM_TASKS``, ``SLURM_LOCALID``.

    Only inside a step (a numeric ``SLURM_STEP_ID``), never in the batch
    script. The name says which PMI srun provided: ``"srun --mpi=pmix"``
    (``PMIX_RANK``), ``"srun --mpi=pmi2"`` (``PMI_RANK``),
    ``"srun --mpi=cray_shasta"`` (``PALS_RANKID``) or ``"srun"``. A PMI
    rank that disagrees with ``SLURM_PROCID`` was not set by this srun, and the
    step is left to the ``pmix``/``pmi`` launchers.

    Example:
        >>> SrunLauncher().read({"SLURM_JOB_ID": "9", "SLURM_STEP_ID": "0",
        ...     "SLURM_PROCID": "1", "SLURM_STEP_NUM_TASKS": "2", "SLURM_LOCALID": "1",
        ...     "SLURM_NODEID": "0", "SLURM_STEP_TASKS_PER_NODE": "2",
        ...     "PMIX_RANK": "1"}).launcher
        'srun --mpi=pmix'
    """

    name = "srun"

    def is_env_present(self, environ: Mapping[str, str]) -> bool:
        if slurm_step_id(environ) is None or "SLURM_PROCID" not in environ:
            return False
        procid = environ["SLURM_PROCID"]
        return all(environ.get(v, procid) == procid for v in _SRUN_PMI_RANKS)

    def flavour(self, environ: Mapping[str, str]) -> str:
        """The name with srun's PMI: ``"srun --mpi=pmix"``, ``"srun"``, ..."""
        mpi_type = environ.get("SLURM_MPI_TYPE", "")
        if "PMIX_RANK" in environ or mpi_type.startswith("pmix"):
            return "srun --mpi=pmix"
        if "PMI_RANK" in environ or mpi_type == "pmi2":
            return "srun --mpi=pmi2"
        if "PALS_RANKID" in environ or mpi_type.startswith("cray_shasta"):
            return "srun --mpi=cray_shasta"
        return "srun"

    def read(self, environ: Mapping[str, str]) -> LaunchInfo:
        n = self.flavour(environ)
        rank = _req_int(environ, "SLURM_PROCID", n)
        size_var, size = first_int(environ, ("SLURM_STEP_NUM_TASKS", "SLURM_NTASKS"))
        if size is None:
            size = _req_int(environ, "SLURM_STEP_NUM_TASKS", n)
        node = opt_int(environ, "SLURM_NODEID")
        nnodes = opt_int(environ, "SLURM_STEP_NUM_NODES")
        _checked(n, ("SLURM_PROCID", rank), (size_var, size))  # the rank first, then the node
        local_size: int | None = None
        if nnodes == 1:
            local_size = size
        elif "SLURM_STEP_TASKS_PER_NODE" in environ and node is not None:
            local_size = _tasks_on_node(environ, "SLURM_STEP_TASKS_PER_NODE", node, "SLURM_NODEID")
        return _checked(
            n,
            ("SLURM_PROCID", rank),
            (size_var, size),
            ("SLURM_LOCALID", opt_int(environ, "SLURM_LOCALID")),
            ("SLURM_STEP_TASKS_PER_NODE", local_size),
            node,
        )


class PMIxLauncher(Launcher):
    """A PMIx server alone: ``PMIX_RANK``, size from ``SLURM_STEP_NUM_TASKS``/``SLURM_NTASKS``.

    PMIx exports no size variable, so without one of those this launcher is
    not recognised (the MPI library itself then gives the world).

    Example:
        >>> PMIxLauncher().read({"PMIX_RANK": "1", "SLURM_NTASKS": "2"}).rank
        1
    """

    name = "pmix"
    _size_vars = ("SLURM_STEP_NUM_TASKS", "SLURM_NTASKS")

    def is_env_present(self, environ: Mapping[str, str]) -> bool:
        return "PMIX_RANK" in environ and any(v in environ for v in self._size_vars)

    def read(self, environ: Mapping[str, str]) -> LaunchInfo:
        size_var, size = first_int(environ, self._size_vars)
        rank = _req_int(environ, "PMIX_RANK", self.name)
        if size is None:
            size = _req_int(environ, size_var, self.name)
        return _checked(self.name, ("PMIX_RANK", rank), (size_var, size))


class PMILauncher(Launcher):
    """A PMI-1/PMI-2 launcher not recognised above: ``PMI_RANK`` and ``PMI_SIZE``.

    Example:
        >>> PMILauncher().read({"PMI_RANK": "0", "PMI_SIZE": "3"}).size
        3
    """

    name = "pmi"

    def is_env_present(self, environ: Mapping[str, str]) -> bool:
        return "PMI_RANK" in environ

    def read(self, environ: Mapping[str, str]) -> LaunchInfo:
        n = self.name
        return _checked(
            n,
            ("PMI_RANK", _req_int(environ, "PMI_RANK", n)),
            ("PMI_SIZE", _req_int(environ, "PMI_SIZE", n)),
        )


#: The launchers, in the order they are tried (see the module docstring).
LAUNCHERS: tuple[Launcher, ...] = (
    JsrunLauncher(),
    OpenMPILauncher(),
    MVAPICHLauncher(),
    PALSLauncher(),
    HydraLauncher(),
    FluxLauncher(),
    SrunLauncher(),
    PMIxLauncher(),
    PMILauncher(),
)


def find_launcher(environ: Mapping[str, str] | None = None) -> Launcher | None:
    """The first launcher of :data:`LAUNCHERS` whose variables are present, or ``None``.

    Raises:
        LauncherConfigError: a malformed ``SLURM_STEP_ID`` (see :func:`slurm_step_id`).

    Example:
        >>> find_launcher({"PMI_RANK": "0", "PMI_SIZE": "1", "MPI_LOCALRANKID": "0"}).name
        'hydra'
    """
    environ = environ_or_default(environ)
    for launcher in LAUNCHERS:
        if launcher.is_env_present(environ):
            return launcher
    return None


def detect_launcher(environ: Mapping[str, str] | None = None) -> LaunchInfo | None:
    """This process's place in its launch, or ``None`` for a plain ``python script.py``.

    Raises:
        LauncherConfigError: a launcher variable is malformed (not an integer,
            negative, a rank not below the size, an unreadable
            ``SLURM_STEP_TASKS_PER_NODE`` or ``SLURM_STEP_ID``); the message names it.

    Example:
        >>> detect_launcher({"FLUX_TASK_RANK": "0", "FLUX_JOB_SIZE": "1"}).launcher
        'flux'
        >>> detect_launcher({}) is None
        True
    """
    environ = environ_or_default(environ)
    launcher = find_launcher(environ)
    return None if launcher is None else launcher.read(environ)


__all__ = [
    "LaunchInfo",
    "Launcher",
    "JsrunLauncher",
    "OpenMPILauncher",
    "MVAPICHLauncher",
    "PALSLauncher",
    "HydraLauncher",
    "FluxLauncher",
    "SrunLauncher",
    "PMIxLauncher",
    "PMILauncher",
    "LAUNCHERS",
    "find_launcher",
    "detect_launcher",
    "slurm_step_id",
]
