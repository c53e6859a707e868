"""The examples run as their docs say (real mpirun, 2 ranks)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MPIRUN = Path(sys.executable).parent / "mpirun"


def _mpirun(*args: str, n: int = 2, timeout: float = 120) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OMPI_COMM", "PMIX_"))}
    env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    return subprocess.run(
        [str(MPIRUN), "--oversubscribe", "-n", str(n), sys.executable, *args],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_strategies_tour_under_mpirun_2():
    done = _mpirun("examples/strategies_tour.py")
    assert done.returncode == 0, done.stderr
    lines = {line[:48].strip(): line[49:] for line in done.stdout.splitlines() if line[:1] != " "}
    assert lines["num_replicas_in_sync"] == "4"
    # Batches of 4, 2, 4, 2 elements: the mean divides by 12, not by 4 replicas.
    assert lines["reduce(MEAN, batch, axis=0) exact mean"] == "np.float64(14.5)"
    assert lines["reduce(SUM, batch, axis=0)"] == "np.float64(174.0)"
    assert lines["merge_call(reduce SUM of 1.0)"] == "np.float64(4.0)"
    assert (
        "ValueError: You must specify an aggregation"
        in lines["replica-context assign with aggregation NONE"]
    )
    assert done.stdout.count("num_replicas_in_sync") == 1  # only the chief prints


def test_train_digits_reaches_95_percent_on_2_ranks():
    done = _mpirun(
        "examples/train_digits.py", "--verbose", "2", "--min-accuracy", "0.95", timeout=300
    )
    assert done.returncode == 0, done.stdout + done.stderr
    out = done.stdout
    assert out.count("test accuracy:") == 1  # the chief prints, once
    accuracy = float(out.split("test accuracy:")[1].split()[0])
    assert accuracy >= 0.95
    assert "Epoch 20/20" in out and "val_accuracy" in out and "wall time:" in out


def test_seed_example_and_custom_loop_run_on_2_ranks():
    done = _mpirun("examples/seed_keras_fit.py", timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert float(done.stdout.split("final accuracy:")[1].split()[0]) > 0.9
    done = _mpirun("examples/custom_loop.py", timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    last = [line for line in done.stdout.splitlines() if line.startswith("epoch 10:")]
    assert len(last) == 1 and float(last[0].rsplit("accuracy", 1)[1]) > 0.9


def test_ps_train_digits_reaches_93_percent_with_1_ps_and_3_workers():
    done = _mpirun("examples/ps_train_digits.py", "--min-accuracy", "0.93", n=4, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr  # every rank, the ps too, exits 0
    out = done.stdout
    assert out.count("test accuracy:") == 1  # worker 0 prints, once
    assert float(out.split("test accuracy:")[1].split()[0]) >= 0.93
    # 3 workers x 15 steps (479 examples, batch 32) x 20 epochs, every update counted once
    assert "global step: 900" in out
    assert "staleness: mean" in out
