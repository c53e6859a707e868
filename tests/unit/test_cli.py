"""`hpcdist info` in a fresh process (a world of one, and the singleton trap)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from tests.unit.test_checks import SRUN_NO_PMI

LAUNCHER_PREFIXES = (
    "OMPI_",
    "PMIX_",
    "PMI_",
    "PRTE_",
    "SLURM_",
    "MPI_LOCAL",
    "HYDRA_",
    "TF_CONFIG",
)


def _info(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(LAUNCHER_PREFIXES)}
    clean.update(env or {})
    return subprocess.run(
        [sys.executable, "-m", "hpcdist", "info", *args],
        env=clean,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_info_json_in_a_world_of_one():
    done = _info("--json")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert [row["rank"] for row in report["ranks"]] == [0]
    job = report["job"]
    assert job["world_size"] == 1 and job["node_count"] == 1
    assert job["environment"]["launcher"] is None
    assert job["mpi_thread_level"] in ("single", "funneled", "serialized", "multiple")
    assert job["cuda_aware_mpi"] in ("yes", "no", "unknown")
    from hpcdist.collectives.nccl import nccl_available

    assert job["nccl"] == nccl_available()[1] and job["nccl"]
    assert set(job["versions"]) >= {"cupy", "nccl", "numba", "mpi4py", "numpy"}


def test_info_table():
    done = _info()
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith("rank"))
    assert lines[header].split() == ["rank", "local", "node", "host", "gpus"]
    assert lines[header + 2].split()[:3] == ["0", "0/1", "0"]
    for key in ("launcher:", "scheduler:", "MPI library:", "thread level:", "CUDA-aware MPI:"):
        assert any(line.startswith(key) for line in lines), key


def test_info_refuses_srun_singletons():
    done = _info(env=SRUN_NO_PMI)
    assert done.returncode == 2
    assert "world of 1" in done.stderr and "--mpi=pmix" in done.stderr
    assert done.stdout == ""
