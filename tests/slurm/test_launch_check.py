"""``srun -n 2 python ...`` without a PMI plugin: a clear LaunchError, not two separate models.

Without ``--mpi=pmix``/``pmi2`` each task initialises MPI as a singleton, a
world of 1: the digits job would train two unrelated models and report success.
hpcdist's launch check sees that SLURM started 2 tasks while MPI has a world
of 1 and stops every task before training.
"""

from __future__ import annotations

import time

import pytest

from tests.slurm.jobs import VENV, run


@pytest.mark.timeout(150)
def test_srun_without_pmi_fails_fast_with_launch_error() -> None:
    python = str(VENV / "bin" / "python")
    start = time.monotonic()
    # The local cluster has MpiDefault=none; --mpi=none says so explicitly.
    proc = run(["srun", "--mpi=none", "-n", "2", python, "examples/train_digits.py"], timeout=140)
    seconds = time.monotonic() - start
    out = proc.stdout
    assert proc.returncode != 0, out[-4000:]
    for task in (0, 1):
        assert f"srun started 2 tasks (this is task {task}) but MPI sees a world of 1" in out
    assert out.count("hpcdist.errors.LaunchError") == 2, out[-4000:]
    assert "srun --mpi=pmix" in out  # the error says how to launch instead
    assert "Epoch" not in out and "test accuracy" not in out  # nothing was trained
    print(f"srun without PMI failed after {seconds:.1f} s")
