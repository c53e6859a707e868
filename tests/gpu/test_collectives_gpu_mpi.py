"""Two-rank jobs on CuPy arrays: NCCL between two GPUs, and MPI staging with two ranks on one.

Each test starts ``mpirun -n 2`` itself (``tests/faults/launch.py``: a hard
timeout kills the whole job, so a hang fails the test) on
``scripts/mwms_allreduce.py``, which trains nothing but runs
MultiWorkerMirroredStrategy's all-reduce and all-gather on CuPy arrays and
checks them; every rank prints one ``RESULT`` JSON line.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests.faults.launch import MPIRUN, run_mpi

SCRIPT = Path(__file__).parent / "scripts" / "mwms_allreduce.py"
TIMEOUT = 240  # CuPy import, Numba compilation and NCCL set-up on two ranks


def _launchable() -> None:
    if shutil.which(MPIRUN) is None:
        pytest.skip(f"no mpirun: {MPIRUN} is not an executable")


def _results(output: str) -> list[dict]:
    return [json.loads(line[len("RESULT ") :]) for line in output.splitlines()
            if line.startswith("RESULT ")]  # fmt: skip


def _run(mode: str, env: dict[str, str]) -> list[dict]:
    _launchable()
    base = {"HPCDIST_COLLECTIVES": "", "NUMBA_ENABLE_CUDASIM": "0", "HPCDIST_TIMEOUT_SECONDS": ""}
    proc = run_mpi(SCRIPT, 2, args=[mode], env={**base, **env}, timeout=TIMEOUT)
    assert proc.returncode == 0, f"mpirun exited {proc.returncode}:\n{proc.stdout[-6000:]}"
    results = sorted(_results(proc.stdout), key=lambda r: r["rank"])
    assert [r["rank"] for r in results] == [0, 1], proc.stdout[-3000:]
    return results


@pytest.mark.timeout(TIMEOUT + 60)
def test_nccl_between_two_gpus(gpus, nccl_ok):
    if gpus < 2:
        pytest.skip(f"NCCL between ranks needs 2 GPUs (one per rank); this machine shows {gpus}")
    results = _run("nccl", {"CUDA_VISIBLE_DEVICES": "0,1"})
    assert [r["device"] for r in results] == [0, 1]  # one GPU per rank
    assert all(set(r["routes"]) == {"nccl"} for r in results)


@pytest.mark.timeout(TIMEOUT + 60)
def test_staged_mpi_with_two_ranks_on_one_gpu(gpus):
    env = {
        "CUDA_VISIBLE_DEVICES": "0",
        "HPCDIST_ALLOW_SHARED_GPUS": "1",
        "HPCDIST_CUDA_AWARE_MPI": "0",
    }
    results = _run("staged", env)
    assert [r["device"] for r in results] == [0, 0]
    assert all(set(r["routes"]) == {"staged"} for r in results)
