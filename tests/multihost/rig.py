"""Launch jobs across the namespace hosts of ``hosts.sh`` from a test.

The hosts are network namespaces ``hpcn1..hpcnN`` on one bridge (``hosts.sh``);
``mpirun`` reaches them through ``agent.sh`` (in place of ssh), and ranks on
different hosts talk over TCP on the bridge's /24 only.

Example: ``proc = mpirun([("hpcn1", 2), ("hpcn2", 2)], ["-m", "hpcdist", "info"])``
then ``proc.returncode == 0``.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

from tests.faults.launch import MPI_ENV, MPIRUN, Finished

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
HOSTS_SH = HERE / "hosts.sh"
AGENT = HERE / "agent.sh"
NET = os.environ.get("HPCDIST_MH_NET", "10.231.77")
SUBNET = f"{NET}.0/24"

TWO_BY_TWO = (("hpcn1", 2), ("hpcn2", 2))
THREE_BY_ONE = (("hpcn1", 1), ("hpcn2", 1), ("hpcn3", 1))


def hosts_sh(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    """Run ``hosts.sh ARGS`` (stdout and stderr together)."""
    return subprocess.run(
        [str(HOSTS_SH), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=timeout,
        check=False,
    )


class RigError(RuntimeError):
    """The hosts could not be started or shaped; ``code``: the exit status to return."""

    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.code = code


@contextlib.contextmanager
def hosts_up(count: int = 2, rate: str | None = None) -> Iterator[None]:
    """Hosts ``hpcn1..hpcn<count>`` up for the block, their links shaped to ``rate`` if
    given; afterwards shaping off, and the hosts down again if they were down before.
    Raises :class:`RigError` (code 2: the rig cannot start here; 1: it failed)."""
    check = hosts_sh("check")
    if check.returncode != 0:
        raise RigError(f"cannot start the hosts: {check.stdout.strip()}", 2)
    were_up = f"hpcn{count}" in hosts_sh("status").stdout
    up = hosts_sh("up", str(count))
    if up.returncode != 0:
        raise RigError(f"hosts.sh up failed: {up.stdout.strip()}", 1)
    try:
        if rate is not None:
            shaped = hosts_sh("shape", rate)
            if shaped.returncode != 0:
                raise RigError(f"tc failed for {rate}: {shaped.stdout.strip()}", 1)
        yield
    finally:
        hosts_sh("shape", "off")
        if not were_up:
            hosts_sh("down")


def mpirun_args(layout: Sequence[tuple[str, int]]) -> list[str]:
    """The ``mpirun`` options that place ``slots`` ranks on each named host, in order."""
    hosts = ",".join(f"{name}:{slots}" for name, slots in layout)
    return [
        "--host", hosts,
        "--map-by", "slot:oversubscribe",
        "--mca", "plm_ssh_agent", str(AGENT),
        "--mca", "plm_ssh_no_tree_spawn", "1",
        "--prtemca", "prte_if_include", SUBNET,
        "--mca", "btl_tcp_if_include", SUBNET,
    ]  # fmt: skip


def job_env(env: Mapping[str, str] | None = None) -> dict[str, str]:
    full = {**os.environ, **MPI_ENV, **(env or {})}
    # This default overrides --map-by and would put every rank on the first host.
    full.pop("PRTE_MCA_rmaps_default_mapping_policy", None)
    for name in [n for n in full if n.startswith(("PMIX_", "OMPI_COMM_WORLD", "SLURM_"))]:
        del full[name]  # never inherit a surrounding job's identity
    full["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), full.get("PYTHONPATH")]))
    return full


def mpirun(
    layout: Sequence[tuple[str, int]],
    argv: Sequence[str],
    env: Mapping[str, str] | None = None,
    timeout: float = 300,
    cwd: str | os.PathLike = REPO,
) -> Finished:
    """Run ``python ARGV`` with ``layout``'s ranks; kill the job after ``timeout`` seconds.

    Returns a :class:`~tests.faults.launch.Finished` (``returncode``, ``stdout`` with
    stderr, ``seconds``); a job killed at the timeout has ``returncode == -9``.
    """
    n = sum(slots for _, slots in layout)
    command = [MPIRUN, "-n", str(n), *mpirun_args(layout), sys.executable, *argv]
    start = time.monotonic()
    proc = subprocess.Popen(
        command,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=job_env(env),
        cwd=cwd,
        start_new_session=True,
    )
    try:
        out, _ = proc.communicate(timeout=timeout)
        code = proc.returncode
    except subprocess.TimeoutExpired:
        out = stop_job(proc) + "\nTIMEOUT"
        code = -9
    done = Finished(command, code, out, None)
    done.seconds = time.monotonic() - start
    return done


def stop_job(proc: subprocess.Popen) -> str:
    """End a job whose ``mpirun`` is ``proc``, on every host; return what it printed.

    The launch daemons on the other hosts run detached (``prted --daemonize``), outside
    mpirun's process group: SIGTERM to mpirun lets it take them and their ranks down;
    whatever is left after 20 s (found by the job's name in the command line or the
    environment) is killed.
    """
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        out, _ = proc.communicate(timeout=20)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
    job = f"prterun-{socket.gethostname()}-{proc.pid}@"
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmdline = f.read()
            with open(f"/proc/{pid}/environ", "rb") as f:
                environ = f.read()
        except OSError:
            continue
        if job.encode() in cmdline or f"PMIX_NAMESPACE={job}".encode() in environ:
            with contextlib.suppress(OSError):
                os.kill(int(pid), signal.SIGKILL)
    return out or ""


def pytest_across(
    layout: Sequence[tuple[str, int]], paths: Sequence[str], timeout: float = 600
) -> Finished:
    """Run the pytest-mpi tests ``paths`` as one job across ``layout``'s hosts."""
    argv = ["-m", "pytest", "-q", "--no-header", "--color=no", "-p", "no:cacheprovider",
            "--with-mpi", *paths]  # fmt: skip
    return mpirun(layout, argv, timeout=timeout)
