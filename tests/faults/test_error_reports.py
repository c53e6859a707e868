"""One error raised on every rank gives one full traceback (the first failing rank's) and at
most one line from each other rank, then the job ends (each test starts its own mpirun)."""

from __future__ import annotations

import re

import pytest

from tests.faults.launch import SCRIPTS, run_mpi

pytestmark = pytest.mark.timeout(150)


@pytest.mark.parametrize("n", [2, 4])
def test_the_same_error_on_every_rank_gives_one_traceback(n):
    proc = run_mpi(SCRIPTS / "fail_all.py", n, timeout=120)
    out = proc.stdout
    assert "TIMEOUT" not in out and proc.returncode != 0, out[-3000:]
    assert "finished (unexpected)" not in out
    assert len(re.findall(r"^FAIL rank \d", out, re.M)) >= 1
    assert out.count("Traceback (most recent call last)") == 1, out[-4000:]
    first = re.findall(r"hpcdist: rank (\d+): uncaught exception, aborting the job", out)
    assert len(first) == 1, out[-4000:]
    others = re.findall(r"hpcdist: rank (\d+): ValueError: bad value at step 5 \(rank (\d+)", out)
    assert all(r != first[0] and f == first[0] for r, f in others), others
    assert len(others) <= n - 1
