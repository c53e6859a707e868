"""Every batch script of slurm/ is valid bash, and SLURM accepts its #SBATCH directives.

``sbatch --test-only`` parses the directives and asks the scheduler whether
the job could run, without submitting it. The GPU script can only fail on
its GPU request here (this cluster has no GPUs); the multi-node template is
submitted for real by test_multinode.py.
"""

from __future__ import annotations

import pytest

from tests.slurm.jobs import SLURM_DIR, run

SCRIPTS = sorted(p.name for p in SLURM_DIR.glob("*.sbatch"))


def test_the_five_scripts_exist() -> None:
    assert SCRIPTS == [
        "requeue.sbatch",
        "scaling.sbatch",
        "train-cpu.sbatch",
        "train-gpu.sbatch",
        "train-multinode.sbatch",
    ]


@pytest.mark.parametrize("name", SCRIPTS)
def test_script_is_valid_bash(name: str) -> None:
    proc = run(["bash", "-n", str(SLURM_DIR / name)], timeout=30)
    assert proc.returncode == 0, proc.stdout


@pytest.mark.parametrize("name", ["train-cpu.sbatch", "requeue.sbatch"])
def test_sbatch_accepts_the_directives(name: str) -> None:
    proc = run(["sbatch", "--test-only", str(SLURM_DIR / name)], timeout=30)
    assert proc.returncode == 0 and "to start at" in proc.stdout, proc.stdout


def test_gpu_script_only_lacks_gpus_here() -> None:
    proc = run(["sbatch", "--test-only", str(SLURM_DIR / "train-gpu.sbatch")], timeout=30)
    if "gpu" in run(["sinfo", "-h", "-o", "%G"], timeout=30).stdout:  # a cluster with GPUs
        assert proc.returncode == 0, proc.stdout
        return
    assert proc.returncode != 0
    assert "Invalid generic resource (gres) specification" in proc.stdout, proc.stdout
