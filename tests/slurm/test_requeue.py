"""Preemption: ``scancel --signal=USR1`` -> checkpoint, requeue, resume, same final parameters.

Two jobs of slurm/requeue.sbatch run examples/train_digits_resumable.py at the
same time: one is signalled during its third epoch, the other runs through.
The signalled one must save a checkpoint, exit with PREEMPTION_EXIT_CODE,
requeue itself, come back with SLURM_RESTART_COUNT=1, resume from the
checkpoint and end with exactly (bit for bit) the uninterrupted job's weights
and optimizer step count.
"""

from __future__ import annotations

import re

import numpy as np
import pytest

from tests.slurm.jobs import SLURM_DIR, read, run, sbatch, wait, wait_for_text

SCRIPT = SLURM_DIR / "requeue.sbatch"
EPOCHS = 8
STEPS = EPOCHS * (1437 // 64)  # the example's steps: whole global batches of 64


def submit(tmp_path, name: str, options=()) -> tuple[int, object, object]:
    out, params = tmp_path / f"{name}.out", tmp_path / f"{name}.npz"
    args = [
        "examples/train_digits_resumable.py",
        f"--epochs={EPOCHS}",
        "--sleep-per-step=0.05",  # a window of several seconds to signal in; same results
        f"--save-params={params}",
    ]
    env = {"CKPT_DIR": str(tmp_path / f"{name}-ckpt")}
    job = sbatch(SCRIPT, args, out=out, options=options, env=env)
    return job, out, params


@pytest.mark.timeout(420)
def test_signalled_job_checkpoints_requeues_resumes_and_matches(tmp_path) -> None:
    check_requeue_round_trip(tmp_path)


def check_requeue_round_trip(tmp_path, options=()) -> str:
    """Submit both jobs (``options``: extra sbatch options), signal one, check; return its log."""
    job, out, params = submit(tmp_path, "preempted", options)
    ref_job, ref_out, ref_params = submit(tmp_path, "uninterrupted", options)

    wait_for_text(out, f"epoch 2/{EPOCHS}:", job, timeout=240)
    signal = run(["scancel", "--signal=USR1", str(job)], timeout=30)
    assert signal.returncode == 0, signal.stdout

    info = wait(job, timeout=300, out=out)
    log = read(out)
    assert info["JobState"] == "COMPLETED" and info["ExitCode"] == "0:0", log[-4000:]
    assert info["Restarts"] == "1", log[-4000:]
    saved = re.search(r"^preempted: saved (\S+) at step (\d+); exiting with status 42$", log, re.M)
    assert saved, f"the job was not preempted:\n{log[-4000:]}"
    step = int(saved.group(2))
    assert 2 * STEPS // EPOCHS <= step < STEPS
    assert f"preempted: checkpoint saved; requeueing job {job}" in log
    assert re.search(rf"^job {job} restart 1 on \S+: resuming from ckpt-{step} in ", log, re.M)
    assert f"resumed from {saved.group(1)} at step {step}/{STEPS}" in log
    assert log.count(f"epoch {EPOCHS}/{EPOCHS}:") == 1

    ref_info = wait(ref_job, timeout=300, out=ref_out)
    ref_log = read(ref_out)
    assert ref_info["JobState"] == "COMPLETED" and ref_info["Restarts"] == "0", ref_log[-4000:]
    assert "preempted" not in ref_log

    got, want = np.load(params), np.load(ref_params)
    assert sorted(got.files) == sorted(want.files) and len(want.files) > 1
    for key in want.files:
        np.testing.assert_array_equal(got[key], want[key], err_msg=key)
    assert int(got["iterations"]) == STEPS
    return log
