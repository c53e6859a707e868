"""A rank that stalls on another host: the waiting ranks' error names it within the timeout.

The arrival board (hpcdist.collectives.arrivals) is read with passive-target RMA,
which here crosses the hosts over TCP; a rank whose record could not be read would
be reported as "unknown" instead of named.
"""

from __future__ import annotations

import re
import time

import pytest

from tests.faults.launch import SCRIPTS
from tests.multihost.rig import THREE_BY_ONE, TWO_BY_TWO, mpirun

TIMEOUT = 10  # HPCDIST_TIMEOUT_SECONDS of the jobs
pytestmark = pytest.mark.timeout(300)


@pytest.mark.parametrize(
    ("layout", "sleeper"),
    [(TWO_BY_TWO, 3), (TWO_BY_TWO, 0), (THREE_BY_ONE, 1)],
    ids=["2x2-rank3", "2x2-rank0", "3x1-rank1"],
)
def test_a_stalled_rank_on_another_host_is_named(layout, sleeper):
    env = {"HPCDIST_TIMEOUT_SECONDS": str(TIMEOUT), "HPCDIST_STALL_WARNING_SECONDS": ""}
    proc = mpirun(layout, [str(SCRIPTS / "hang_sleep.py"), str(sleeper)], env=env, timeout=150)
    ended = time.time()
    out = proc.stdout
    assert "TIMEOUT" not in out and proc.returncode != 0, out[-3000:]
    found = re.search(r"HANG rank (\d+) sleeping at ([\d.]+)", out)
    assert found and int(found.group(1)) == sleeper, out[-3000:]
    assert ended - float(found.group(2)) < TIMEOUT + 15, out[-3000:]
    errors = re.findall(r"CollectiveTimeoutError: .*", out)
    assert errors, out[-3000:]
    for error in errors:
        assert f"rank {sleeper} has not arrived" in error, error
        assert "unknown" not in error, error
