"""The tools behind ``make test``'s last line and its no-silent-skip rule."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def row(job, rank, passed, failed=0, skipped=0, args="tests/mpi"):
    return json.dumps(
        {"args": args, "job": job, "rank": rank, "passed": passed, "failed": failed,
         "skipped": skipped, "exitstatus": int(failed > 0)}
    )  # fmt: skip


def summary(tmp_path, lines):
    path = tmp_path / "s.jsonl"
    path.write_text("".join(line + "\n" for line in lines))
    return subprocess.run(
        [sys.executable, str(REPO / "tools/test_summary.py"), str(path)],
        capture_output=True, text=True, check=False,
    )  # fmt: skip


def test_a_job_counts_once_over_its_ranks_and_steps_add_up(tmp_path):
    proc = summary(
        tmp_path,
        [
            row("pid1", 0, 100, skipped=2, args="hpcdist tests/unit"),
            row("ns-a", 0, 50, skipped=1), row("ns-a", 1, 50, skipped=1),  # -n 2: once
            row("ns-b", 0, 40), row("ns-b", 1, 39, failed=1),  # a failure on rank 1 counts
        ],
    )  # fmt: skip
    assert proc.stdout.strip() == "190 passed, 1 failed, 3 skipped"
    assert proc.returncode == 0


def test_no_test_at_all_is_a_failure(tmp_path):
    proc = summary(tmp_path, [])
    assert proc.stdout.strip() == "0 passed, 0 failed" and proc.returncode == 1


def test_the_plugin_records_a_pytest_run(tmp_path):
    (tmp_path / "test_x.py").write_text(
        "import pytest\ndef test_a(): pass\ndef test_b(): pass\n"
        "def test_c(): pytest.skip('why')\n"
    )
    out = tmp_path / "summary.jsonl"
    env = {"HPCDIST_TEST_SUMMARY": str(out), "PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO)}
    subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p",
         "tests.support.summary", str(tmp_path / "test_x.py")],
        env=env, cwd=tmp_path, capture_output=True, check=False,
    )  # fmt: skip
    (line,) = out.read_text().splitlines()
    got = json.loads(line)
    assert (got["passed"], got["failed"], got["skipped"]) == (2, 0, 1)


def skip(name, able, allow):
    script = f'source {REPO}/tools/suite-skip.sh; suite_skip {name} {able} "the reason"'
    env = {"PATH": "/usr/bin:/bin", "HPCDIST_ALLOW_SKIP": allow}
    return subprocess.run(["bash", "-c", script], env=env, capture_output=True, text=True)


def test_a_skip_fails_where_the_machine_can_run_the_suite_unless_allowed():
    failed = skip("slurm", 1, "")
    assert failed.returncode == 1
    assert "slurm tests SKIPPED: the reason" in failed.stdout
    assert "HPCDIST_ALLOW_SKIP=slurm" in failed.stderr
    assert skip("slurm", 1, "multihost,slurm").returncode == 0
    assert skip("multihost", 1, "all").returncode == 0
    assert skip("multihost", 1, "slurm").returncode == 1
    assert skip("slurm", 0, "").returncode == 0  # cannot run here at all: a plain skip
