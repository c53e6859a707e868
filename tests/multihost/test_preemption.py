"""SIGTERM to one rank on the second host: every rank on both hosts saves the same step,
the job exits with PREEMPTION_EXIT_CODE, and the rerun resumes bit for bit."""

from __future__ import annotations

import re

import numpy as np
import pytest

from hpcdist.checkpoint.preemption import PREEMPTION_EXIT_CODE
from tests.faults.launch import SCRIPTS
from tests.multihost.rig import TWO_BY_TWO, mpirun

pytestmark = pytest.mark.timeout(600)

N = sum(slots for _, slots in TWO_BY_TWO)
SCRIPT = str(SCRIPTS / "preempt_loop.py")


def finals(workdir):
    return [np.load(workdir / f"final-rank{r}.npy") for r in range(N)]


def test_sigterm_on_the_other_host_saves_everywhere_and_resumes_bitwise(tmp_path):
    ref_dir, run_dir = tmp_path / "ref", tmp_path / "run"
    ref_dir.mkdir()
    run_dir.mkdir()
    ref = mpirun(TWO_BY_TWO, [SCRIPT, str(ref_dir)], timeout=240)
    assert ref.returncode == 0, ref.stdout
    reference = finals(ref_dir)
    for other in reference[1:]:
        np.testing.assert_array_equal(other, reference[0])  # the replicas agree

    # Rank 2 is local rank 0 of hpcn2: it signals itself during step 6.
    args = ["--signal", "SIGTERM", "--signal-at", "6", "--signal-rank", "2"]
    proc = mpirun(TWO_BY_TWO, [SCRIPT, str(run_dir), *args], timeout=240)
    assert proc.returncode == PREEMPTION_EXIT_CODE, proc.stdout
    saved = sorted(re.findall(r"rank (\d) saved at step (\d+)", proc.stdout))
    assert saved == [(str(r), "7") for r in range(N)], proc.stdout
    assert (run_dir / "ckpt" / "ckpt-7.index.json").exists()
    assert not (run_dir / "final-rank0.npy").exists()

    again = mpirun(TWO_BY_TWO, [SCRIPT, str(run_dir)], timeout=240)
    assert again.returncode == 0, again.stdout
    starts = sorted(re.findall(r"rank (\d) starts at step (\d+)", again.stdout))
    assert starts == [(str(r), "7") for r in range(N)], again.stdout
    for got, want in zip(finals(run_dir), reference, strict=True):
        np.testing.assert_array_equal(got, want)
