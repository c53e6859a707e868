"""ClusterCoordinator over real MPI processes (mpirun in a subprocess), failover under ULFM.

The scripts in ``coordinator_scripts/`` use a stand-in strategy (roles and a
communicator, no ps). Each rank prints ``TAG <rank> <json>`` lines; every run must
end with exit status 0.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from hpcdist.distribute.coordinator import ClusterCoordinator
from hpcdist.distribute.ps.roles import PSRoles

SCRIPTS = Path(__file__).resolve().parent / "coordinator_scripts"
MPIRUN = Path(sys.executable).parent / "mpirun"
needs_mpirun = pytest.mark.skipif(not MPIRUN.exists(), reason="mpirun is not installed")


def _mpirun(
    script: str, n: int, *, ulfm: bool = False, **extra: str
) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OMPI_COMM", "PMIX_"))}
    env.update(extra)
    env.update(
        OMPI_ALLOW_RUN_AS_ROOT="1",
        OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
        OMPI_MCA_rmaps_base_oversubscribe="1",
        PRTE_MCA_rmaps_default_mapping_policy=":oversubscribe",
        OMP_NUM_THREADS="1",
        OMPI_MCA_osc="^ucx",
    )
    ft = ["--with-ft", "ulfm"] if ulfm else []
    return subprocess.run(
        [str(MPIRUN), *ft, "-n", str(n), sys.executable, str(SCRIPTS / script)],
        env=env,
        cwd=SCRIPTS,
        capture_output=True,
        text=True,
        timeout=60,
    )


def _reports(out: str, tag: str) -> dict[int, object]:
    found = {}
    for line in out.splitlines():
        if line.startswith(tag + " "):
            _, rank, payload = line.split(" ", 2)
            found[int(rank)] = json.loads(payload)
    return found


@needs_mpirun
@pytest.mark.timeout(90)
def test_schedule_join_fetch_errors_and_datasets_agree_on_every_rank(tmp_path):
    done = _mpirun("basic.py", 3, COORDINATOR_TEST_RELEASE=str(tmp_path / "release"))
    assert done.returncode == 0, done.stdout + done.stderr
    logs = _reports(done.stdout, "LOG")
    assert sorted(logs) == [0, 1, 2]
    assert logs[1] == logs[0] and logs[2] == logs[0]  # the workers returned/raised the same
    got = {entry[0]: entry[1:] for entry in logs[0]}
    assert got["squares"] == [[x * x for x in range(20)]]
    assert got["workers used"] == [[0, 1]]
    assert got["rv.fetch"] == [49, 49]
    assert got["done with nothing scheduled"] == [True]
    assert got["done while running"] == [False]
    assert got["done after join"] == [True, 1]
    assert got["structure"] == [
        "float32", [2, 3], [[0.0, 1.0, 2.0], [3.0, 4.0, 5.0]], "text", None,
        "PerReplica", [1.5, 2.5], 5, [None, "s"],
    ]  # fmt: skip
    # The error surfaces once (the second join is clean), the functions queued are cancelled.
    assert got["join after error"] == ["ValueError", ["boom", 7], True]
    assert got["join again"] == [["ok", None]]
    assert got["first"] == [["ok", "slow ok"]]
    assert got["failing"] == [["raised", "ValueError"]]
    assert got["rest"] == [["CancelledError"] * 6]
    assert got["after the error"] == [9] and got["done"] == [True]
    assert got["bad result"] == [["raised", "MessageEncodeError"], True]
    assert got["bad result is a TypeError"] == ["MessageEncodeError"]
    assert got["per-worker shards in order"] == [True, 6]
    assert got["exhausted"] == [["raised", "OutOfRangeError"], "OutOfRangeError"]
    assert got["new iterator restarts"] == [True]
    assert got["many"] == [True]
    assert got["worker index outside"] == [["raised", "ValueError"]]
    assert got["schedule(3)"] == [["raised", "TypeError"]]
    assert got["RemoteValue argument"] == [["raised", "TypeError"]]
    assert got["same coordinator"] == [True]
    chief = _reports(done.stdout, "CHIEF")[0]
    assert chief == {"dataset_fn calls on the chief": 0, "largest queue": 256}


@needs_mpirun
@pytest.mark.timeout(90)
def test_diverged_programs_raise_instead_of_hanging():
    done = _mpirun("diverged.py", 3)
    assert done.returncode == 0, done.stdout + done.stderr
    logs = _reports(done.stdout, "LOG")
    assert sorted(logs) == [0, 1, 2]
    first = [log[0] for log in logs.values()]
    assert all(f == first[0] for f in first)  # the same error on every rank
    kind, text = first[0][1], first[0][2]
    assert kind == "ProgramsDivergedError"
    assert "closure 0 is 'on_workers'" in text and "the chief's closure 0 is 'on_chief'" in text
    assert logs[0][1] == ["different call", "no error"]  # the chief's join completes
    for rank in (1, 2):
        assert logs[rank][1][1] == "ProgramsDivergedError"
        assert "(done()) but the chief sent sync point 2 (join())" in logs[rank][1][2]


@needs_mpirun
@pytest.mark.timeout(90)
def test_a_killed_worker_s_closure_runs_elsewhere_under_ulfm():
    done = _mpirun("failover.py", 4, ulfm=True)
    assert done.returncode == 0, done.stdout + done.stderr
    results = _reports(done.stdout, "RESULTS")
    assert results == {0: [x * x for x in range(30)]}
    assert _reports(done.stdout, "ALIVE") == {0: [True, True, False]}
    assert _reports(done.stdout, "MORE") == {r: [x * x for x in range(6)] for r in (0, 1, 2)}
    assert _reports(done.stdout, "EXITED") == {0: "chief", 1: "worker", 2: "worker"}
    assert "worker 2 (rank 3) failed; its closure" in done.stderr


@needs_mpirun
@pytest.mark.timeout(90)
def test_with_the_parameter_server_strategy_and_its_datasets():
    done = _mpirun("with_ps.py", 4)
    assert done.returncode == 0, done.stdout + done.stderr
    want = {"workers": [0, 1], "counter": [20.0, 40.0], "shards_ok": True, "reads": 4}
    assert _reports(done.stdout, "PS") == {0: want, 2: want, 3: want}  # rank 1 is the ps


def _strategy(roles: PSRoles) -> SimpleNamespace:
    return SimpleNamespace(extended=SimpleNamespace(_roles=roles, _coordination_comm=object()))


def test_no_chief_is_a_value_error_that_says_how_to_add_one():
    roles = PSRoles(None, 1, (0,), (1, 2), None, "worker", 0)
    with pytest.raises(ValueError, match="needs a chief task") as info:
        ClusterCoordinator(_strategy(roles))
    assert "jobs={'chief': 1, 'ps': 1, 'worker': 2}" in str(info.value)


def test_other_strategies_and_ps_ranks_are_refused():
    with pytest.raises(ValueError, match="needs a ParameterServerStrategy"):
        ClusterCoordinator(SimpleNamespace(extended=SimpleNamespace()))
    roles = PSRoles(None, 1, (1,), (2,), 0, "ps", 0)
    with pytest.raises(ValueError, match="not on a ps"):
        ClusterCoordinator(_strategy(roles))


@needs_mpirun
@pytest.mark.timeout(90)
def test_a_killed_worker_under_the_real_parameter_server_strategy():
    done = _mpirun("failover_ps.py", 5, ulfm=True)
    assert done.returncode == 0, done.stdout + done.stderr
    assert _reports(done.stdout, "RESULTS") == {0: [x * x for x in range(24)]}
    assert _reports(done.stdout, "COUNTER") == {0: 24}  # the dead worker's add never happened
    assert _reports(done.stdout, "ALIVE") == {0: [True, False, True]}
