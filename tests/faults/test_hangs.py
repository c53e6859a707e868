"""No silent hangs: jobs where a rank sleeps, skips an allreduce or passes other shapes end
with a clear error naming the rank, instead of hanging (each test starts its own ``mpirun``).

The scripts are in ``tests/faults/scripts/``; ``HPCDIST_TIMEOUT_SECONDS`` turns on checked
collectives (see ``hpcdist.collectives.arrivals``).
"""

from __future__ import annotations

import re
import time

import pytest

from hpcdist.observe import analysis
from tests.faults.launch import SCRIPTS, run_mpi

TIMEOUT = 5  # HPCDIST_TIMEOUT_SECONDS of the jobs
JOB_LIMIT = 150  # kill a job that hangs anyway after this long

pytestmark = pytest.mark.timeout(JOB_LIMIT + 30)


def _checked_env(timeout: float | str = TIMEOUT, flight=None) -> dict[str, str]:
    env = {"HPCDIST_TIMEOUT_SECONDS": str(timeout), "HPCDIST_STALL_WARNING_SECONDS": ""}
    if flight is not None:
        env["HPCDIST_FLIGHT_DIR"] = str(flight)
    return env


def _flight_report(flight, n: int, out: str, dumped: list[int] | None = None) -> dict:
    """The flight-recorder dumps: one per rank of ``dumped`` (default all), each named in the
    output; their divergence (as ``hpcdist timeline report`` shows it)."""
    dumps = analysis.read_dumps(str(flight))
    assert [d["rank"] for d in dumps] == (dumped if dumped is not None else list(range(n))), out
    assert all(d["path"] in out for d in dumps if d["reason"] != "SIGTERM"), out[-3000:]
    found = analysis.divergence(dumps)
    assert found is not None, dumps
    text = analysis.format_divergence(dumps, found)
    assert f"first divergence: collective #{found['seq']} " in text, text
    return found


def _timed_out_seq(out: str) -> int:
    found = re.search(r"collective #(\d+) on this communicator\) did not complete", out)
    assert found, out[-3000:]
    return int(found.group(1))


@pytest.mark.parametrize(("n", "sleeper"), [(2, 1), (3, 1)])
def test_a_rank_sleeping_in_fit_ends_the_job_naming_it(n, sleeper, tmp_path):
    proc = run_mpi(
        SCRIPTS / "hang_sleep.py", n, args=[str(sleeper)], env=_checked_env(flight=tmp_path),
        timeout=JOB_LIMIT,
    )
    ended = time.time()
    out = proc.stdout
    assert "TIMEOUT" not in out and proc.returncode != 0, out[-3000:]
    found = re.search(r"HANG rank (\d+) sleeping at ([\d.]+)", out)
    assert found and int(found.group(1)) == sleeper, out[-3000:]
    # The job ends within the timeout and 10 s of the rank falling asleep.
    assert ended - float(found.group(2)) < TIMEOUT + 10, (ended - float(found.group(2)), out)
    assert "CollectiveTimeoutError" in out and "fit finished" not in out, out[-3000:]
    assert f"rank {sleeper} has not arrived" in out, out[-3000:]
    # The stall warning (at half the timeout) came first, naming the same rank.
    warned = out.find("CollectiveStallWarning")
    assert 0 <= warned < out.find("CollectiveTimeoutError"), out[-3000:]
    assert f"waited {TIMEOUT / 2:.1f} s" in out, out[-3000:]
    survivors = [r for r in range(n) if r != sleeper]
    for rank in survivors:
        assert re.search(rf"did not complete within {TIMEOUT}\.0 s on rank {rank}\b", out) or (
            f"rank {rank}: uncaught exception" in out
        ), out[-3000:]
    # Every rank wrote its flight record (the sleeper on the launcher's SIGTERM); they show
    # the collective that timed out and the sleeper as the rank that did not arrive.
    found = _flight_report(tmp_path, n, out)
    assert found["kind"] == "not arrived" and found["missing"] == [sleeper], found
    assert found["seq"] == _timed_out_seq(out), found


def test_skipping_an_allreduce_then_ending_gives_a_timeout_naming_the_rank(tmp_path):
    proc = run_mpi(
        SCRIPTS / "skip_allreduce.py", 2, args=["finish"], env=_checked_env(flight=tmp_path),
        timeout=JOB_LIMIT,
    )
    out = proc.stdout
    assert "TIMEOUT" not in out and proc.returncode != 0, out[-3000:]
    assert "SKIP rank 1 skips step 3" in out
    assert "CollectiveTimeoutError" in out and "rank 1 has not arrived" in out, out[-3000:]
    assert "rank 0: done" not in out
    # Rank 1 ended normally (it is in MPI_Finalize when the job aborts): only rank 0 dumps,
    # and its record shows the call it never completed; the report names rank 1 as silent.
    found = _flight_report(tmp_path, 2, out, dumped=[0])
    assert found["kind"] == "not completed" and found["seq"] == _timed_out_seq(out), found
    assert found["ranks_without_dump"] == [1], found


def test_skipping_an_allreduce_then_reducing_another_shape_gives_a_mismatch(tmp_path):
    proc = run_mpi(
        SCRIPTS / "skip_allreduce.py", 2, args=["summary"], env=_checked_env(flight=tmp_path),
        timeout=JOB_LIMIT,
    )
    out = proc.stdout
    assert "TIMEOUT" not in out and proc.returncode != 0, out[-3000:]
    assert "CollectiveMismatchError" in out, out[-3000:]
    assert re.search(r"rank 0 passed allreduce\(op=SUM, \[float32\(10,\)\]", out), out[-3000:]
    assert re.search(r"rank 1 passed allreduce\(op=MAX, \[float64\(2,\)\]", out), out[-3000:]
    assert "unexpected" not in out
    found = _flight_report(tmp_path, 2, out)  # the skipped step shifted rank 1's calls by one
    assert found["kind"] == "mismatch" and found["seq"] == 8, found
    assert "op=MAX" in found["calls"][1] and "op=SUM" in found["calls"][0], found


@pytest.mark.parametrize("mode", ["checked", "blocking"])
def test_different_shapes_give_a_mismatch_error_not_a_hang(mode, tmp_path):
    env = _checked_env(flight=tmp_path) if mode == "checked" else _checked_env("", tmp_path)
    proc = run_mpi(SCRIPTS / "shape_mismatch.py", 2, env=env, timeout=JOB_LIMIT)
    out = proc.stdout
    assert "TIMEOUT" not in out and proc.returncode != 0, out[-3000:]
    assert "CollectiveMismatchError" in out, out[-3000:]
    assert re.search(r"rank 0 passed allreduce\(op=SUM, \[float32\(6,\)\]", out), out[-3000:]
    assert re.search(r"rank 1 passed allreduce\(op=SUM, \[float32\(7,\)\]", out), out[-3000:]
    assert ("timeout set, bytes_per_pack" in out) == (mode == "checked"), out[-3000:]
    assert "unexpected" not in out
    found = _flight_report(tmp_path, 2, out)
    assert found["kind"] == "mismatch", found
    assert "float32(6,)" in found["calls"][0] and "float32(7,)" in found["calls"][1], found
