"""The framework examples train to >= 95% test accuracy under mpirun -n 2 (real mpirun)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
MPIRUN = Path(sys.executable).parent / "mpirun"


def _mpirun(*args: str, n: int = 2, timeout: float = 600) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OMPI_COMM", "PMIX_"))}
    env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", OMP_NUM_THREADS="1")
    return subprocess.run(
        [str(MPIRUN), "--oversubscribe", "-n", str(n), sys.executable, *args],
        env=env, cwd=ROOT, capture_output=True, text=True, timeout=timeout,
    )


@pytest.mark.timeout(600)
def test_torch_cnn_reaches_95_percent_on_2_ranks() -> None:
    done = _mpirun("examples/torch_cnn.py", "--min-accuracy", "0.95")
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.count("test accuracy:") == 1  # rank 0 prints, once
    assert float(done.stdout.split("test accuracy:")[1].split()[0]) >= 0.95


@pytest.mark.timeout(600)
def test_jax_mlp_reaches_95_percent_on_2_ranks() -> None:
    done = _mpirun("examples/jax_mlp.py", "--min-accuracy", "0.95")
    assert done.returncode == 0, done.stdout + done.stderr
    assert float(done.stdout.split("test accuracy:")[1].split()[0]) >= 0.95


@pytest.mark.timeout(600)
def test_tf_custom_loop_reaches_95_percent_on_2_ranks() -> None:
    done = _mpirun("examples/tf_custom_loop.py", "--min-accuracy", "0.95")
    assert done.returncode == 0, done.stdout + done.stderr
    assert float(done.stdout.split("test accuracy:")[1].split()[0]) >= 0.95
