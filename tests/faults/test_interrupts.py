"""An interrupted or killed rank ends the whole job within seconds, with one line naming it.

Each test starts its own ``mpirun`` of ``scripts/interrupt.py``: the signalled
ranks send themselves a real ``SIGINT`` (or ``SIGKILL``) while the others wait
for them in a collective, during ``fit``, a custom loop, or a checkpoint write.
Before the fix the interrupted rank printed a traceback and stayed alive in
``MPI_Finalize`` while its peers spun in a shared-memory barrier for ever.
"""

from __future__ import annotations

import re
import time

import numpy as np
import pytest

from tests.faults.launch import SCRIPTS, run_mpi

JOB_LIMIT = 90  # a job that hangs anyway is killed after this long (the bug)
ENDS_WITHIN = 10.0  # seconds from the signal to the end of the job (a loaded machine)

pytestmark = pytest.mark.timeout(JOB_LIMIT + 30)


def _run(
    where: str, ranks: str, n: int, tmp_path, signal: str = "INT", mpirun_args=(), env=None
):
    args = [where, ranks, "--signal", signal, "--workdir", str(tmp_path)]
    proc = run_mpi(
        SCRIPTS / "interrupt.py", n, args=args, timeout=JOB_LIMIT, mpirun_args=mpirun_args,
        env=env,
    )  # fmt: skip
    ended = time.time()
    out = proc.stdout
    assert "TIMEOUT" not in out, out[-3000:]
    assert "finished (unexpected)" not in out, out[-3000:]
    # (mpirun --with-ft ulfm reports 0 even after MPI_Abort; the abort itself is checked)
    assert proc.returncode != 0 or "--with-ft" in mpirun_args, out[-3000:]
    assert "MPI_ABORT was invoked" in out, out[-3000:]
    signalled = [(int(r), float(t)) for r, t in re.findall(r"SIGNAL rank (\d+) at ([\d.]+)", out)]
    assert signalled, out[-3000:]
    first = min(t for _, t in signalled)
    assert ended - first < ENDS_WITHIN, (ended - first, out[-3000:])
    return out, {r for r, _ in signalled}


def _expected_ranks(ranks: str, n: int) -> set[int]:
    return {"0": {0}, "1": {1}, "last": {n - 1}, "all": set(range(n))}[ranks]


VNODES = {"HPCDIST_VIRTUAL_NODES": "2"}  # two nodes of 2 ranks: MPI between the node leaders


@pytest.mark.parametrize(
    ("where", "ranks", "n", "env"),
    [
        ("fit", "1", 2, None),
        ("fit", "0", 2, None),
        ("fit", "all", 2, None),
        ("fit", "0", 4, None),
        ("fit", "last", 4, None),
        ("fit", "all", 4, None),
        ("fit", "1", 4, VNODES),
        ("loop", "0", 2, None),
        ("loop", "1", 2, None),
        ("loop", "all", 4, None),
        ("loop", "last", 4, None),
        ("loop", "0", 4, VNODES),
    ],
)
def test_sigint_ends_the_job_with_one_line_naming_the_rank(where, ranks, n, env, tmp_path):
    out, signalled = _run(where, ranks, n, tmp_path, env=env)
    assert signalled == _expected_ranks(ranks, n), out[-3000:]
    lines = re.findall(r"hpcdist: rank (\d+): interrupted by SIGINT", out)
    # One line for the whole job (ranks interrupted at once stay quiet after the first).
    assert len(lines) == 1 and int(lines[0]) in signalled, out[-3000:]
    assert "Traceback" not in out and "KeyboardInterrupt\n" not in out, out[-3000:]
    assert "Errorcode: 130" in out, out[-3000:]  # what MPI_Abort was called with


@pytest.mark.parametrize(("ranks", "n"), [("0", 2), ("1", 2), ("all", 4)])
def test_sigint_during_a_checkpoint_write_keeps_the_previous_checkpoint(ranks, n, tmp_path):
    from hpcdist.checkpoint import format as fmt
    from hpcdist.checkpoint.manager import latest_checkpoint

    out, signalled = _run("checkpoint", ranks, n, tmp_path)
    assert signalled == _expected_ranks(ranks, n), out[-3000:]
    assert len(re.findall(r"interrupted by SIGINT", out)) == 1, out[-3000:]
    latest = latest_checkpoint(tmp_path / "ckpt")
    assert latest is not None, out[-3000:]
    number = int(latest.rsplit("-", 1)[1])
    if 0 in signalled:  # the chief was interrupted half way through writing save 2
        assert number == 1, latest
        assert not (tmp_path / "ckpt" / "run-2.index.json").exists()
    assert number in (1, 2), latest
    manifest = fmt.read_manifest(latest)
    fmt.verify_files(latest, manifest)  # complete, hashes match
    arrays = fmt.load_arrays(latest, manifest, ["model"])["model"]
    weights = np.concatenate([arrays[str(k)].ravel() for k in range(len(arrays))])
    np.testing.assert_array_equal(weights, np.load(tmp_path / f"saved-{number}.npy"))
    leftovers = [p.name for p in (tmp_path / "ckpt").iterdir() if ".tmp" in p.name]
    assert not leftovers, leftovers  # the half-written file was removed


@pytest.mark.parametrize(("where", "ranks"), [("fit", "1"), ("loop", "0")])
def test_a_killed_peer_is_noticed_by_the_ranks_waiting_for_it(where, ranks, tmp_path):
    # Under --with-ft ulfm the launcher lets the job go on after a rank dies (as srun without
    # --kill-on-bad-exit does): only the waiting ranks themselves can notice.
    out, signalled = _run(where, ranks, 2, tmp_path, "KILL", ("--with-ft", "ulfm"))
    (dead,) = signalled
    found = re.search(r"hpcdist: rank (\d+): RankFailedError: rank (\d+) \(process", out)
    assert found and int(found.group(2)) == dead and int(found.group(1)) != dead, out[-3000:]
    assert "Traceback" not in out, out[-3000:]
