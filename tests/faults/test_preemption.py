"""Preemption under ``mpirun -n 2``: a signal on ONE rank makes every rank save the same step and
exit with PREEMPTION_EXIT_CODE; the rerun resumes and ends bit for bit where an uninterrupted
run ends (weights and optimizer slots, compared as saved ``.npy`` files)."""

from __future__ import annotations

import re

import numpy as np
import pytest

from hpcdist.checkpoint.preemption import PREEMPTION_EXIT_CODE
from tests.faults.launch import SCRIPTS, run_mpi

pytestmark = pytest.mark.timeout(300)

N = 2


def finals(workdir) -> list[np.ndarray]:
    return [np.load(workdir / f"final-rank{r}.npy") for r in range(N)]


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """The uninterrupted runs of both scripts, once for the module."""
    out = {}
    for script in ("preempt_loop.py", "preempt_fit.py"):
        workdir = tmp_path_factory.mktemp(script.split(".")[0] + "_ref")
        proc = run_mpi(SCRIPTS / script, N, [str(workdir)], timeout=120)
        assert proc.returncode == 0, proc.stdout
        ref = finals(workdir)
        np.testing.assert_array_equal(ref[0], ref[1])  # the replicas agree
        out[script] = ref
    return out


def assert_resumes_bitwise(proc, workdir, reference, script, args):
    assert proc.returncode == PREEMPTION_EXIT_CODE, proc.stdout
    assert not (workdir / "final-rank0.npy").exists()
    again = run_mpi(SCRIPTS / script, N, [str(workdir), *args], timeout=120)
    assert again.returncode == 0, again.stdout
    for got, want in zip(finals(workdir), reference[script], strict=True):
        np.testing.assert_array_equal(got, want)
    return again


@pytest.mark.parametrize("sig, rank, default_exit", [("SIGTERM", 1, False), ("SIGUSR1", 0, True)])
def test_custom_loop_with_preemption_checkpoint_handler(
    tmp_path, reference, sig, rank, default_exit
):
    args = ["--signal", sig, "--signal-at", "6", "--signal-rank", str(rank)]
    proc = run_mpi(
        SCRIPTS / "preempt_loop.py",
        N,
        [str(tmp_path), *args, *(["--default-exit"] if default_exit else [])],
        timeout=120,
    )
    # The signal came during step 6: every rank saves 7 steps at the next run call.
    assert (tmp_path / "ckpt" / "ckpt-7.index.json").exists(), proc.stdout
    if not default_exit:
        saved = sorted(re.findall(r"rank (\d) saved at step (\d+)", proc.stdout))
        assert saved == [("0", "7"), ("1", "7")], proc.stdout
    again = assert_resumes_bitwise(proc, tmp_path, reference, "preempt_loop.py", [])
    starts = sorted(re.findall(r"rank (\d) starts at step (\d+)", again.stdout))
    assert starts == [("0", "7"), ("1", "7")], again.stdout


@pytest.mark.parametrize("sig, save_freq", [("SIGTERM", "epoch"), ("SIGUSR1", "4")])
def test_fit_with_backup_and_restore(tmp_path, reference, sig, save_freq):
    args = ["--signal", sig, "--signal-after", "8", "--save-freq", save_freq]
    proc = run_mpi(SCRIPTS / "preempt_fit.py", N, [str(tmp_path), *args], timeout=120)
    # The resumed run draws another shuffle seed: the backup's must win.
    again = assert_resumes_bitwise(
        proc, tmp_path, reference, "preempt_fit.py", ["--save-freq", save_freq, "--seed", "99"]
    )
    # 8 batches done (6 in epoch 0): every rank resumes at epoch 1, batch 2.
    firsts = sorted(re.findall(r"rank (\d) first batch (\d) (\d)", again.stdout))
    assert firsts == [("0", "1", "2"), ("1", "1", "2")], again.stdout
    assert not (tmp_path / "backup").exists()  # deleted once fit completed
