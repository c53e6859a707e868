"""Start a script under ``mpirun`` from a test, with a hard timeout, and collect its output.

Fault-injection tests kill, stop and signal ranks on purpose, so they never run
inside the test process's own MPI world: each one launches a fresh job.

Example: ``proc = run_mpi(SCRIPTS / "hang.py", 2, timeout=60); assert proc.returncode != 0``.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

SCRIPTS = Path(__file__).parent / "scripts"
BIN = Path(sys.executable).parent
MPIRUN = str(BIN / "mpirun") if (BIN / "mpirun").exists() else "mpirun"

#: What Open MPI needs on this machine and in CI (root, more ranks than cores, no UCX).
MPI_ENV = {
    "OMPI_ALLOW_RUN_AS_ROOT": "1",
    "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
    "OMPI_MCA_rmaps_base_oversubscribe": "1",
    "PRTE_MCA_rmaps_default_mapping_policy": ":oversubscribe",
    "OMPI_MCA_osc": "^ucx",
    "OMP_NUM_THREADS": "1",
    "PYTHONUNBUFFERED": "1",
}


class Finished(subprocess.CompletedProcess):
    """A finished job: ``returncode``, ``stdout`` (stdout and stderr together) and ``seconds``."""

    seconds: float = 0.0


def run_mpi(
    script: str | os.PathLike,
    n: int,
    args: Sequence[str] = (),
    env: Mapping[str, str] | None = None,
    timeout: float = 120,
    mpirun_args: Sequence[str] = (),
) -> Finished:
    """Run ``python script *args`` on ``n`` ranks; kill the whole job after ``timeout`` s.

    A job still running at the timeout is killed and reported with
    ``returncode == -9`` and ``"TIMEOUT"`` appended to its output, so a hang
    fails the test instead of blocking the suite.

    Example: ``run_mpi(SCRIPTS / "ok.py", 2).returncode == 0``.
    """
    import time

    full_env = {**os.environ, **MPI_ENV, **(env or {})}
    full_env.pop("PMIX_RANK", None)  # never inherit a surrounding job's identity
    command = [MPIRUN, "-n", str(n), *mpirun_args, sys.executable, str(script), *args]
    start = time.monotonic()
    proc = subprocess.Popen(
        command,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=full_env,
        start_new_session=True,
    )
    try:
        out, _ = proc.communicate(timeout=timeout)
        code = proc.returncode
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, 9)
        out, _ = proc.communicate()
        out += "\nTIMEOUT"
        code = -9
    done = Finished(command, code, out, None)
    done.seconds = time.monotonic() - start
    return done
