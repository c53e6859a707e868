"""A pytest plugin that appends one JSON line of counts per pytest run (and per rank).

Loaded by the repository's root ``conftest.py``; active only where
``HPCDIST_TEST_SUMMARY`` names a file (``make test`` sets it). Each line holds
the run's ``passed``, ``failed`` (errors included) and ``skipped`` counts, its
rank and the MPI job it belongs to, so that ``tools/test_summary.py`` can add
up every step of ``make test`` into one ``N passed, N failed, N skipped`` line,
counting a test that ran on every rank of a job once. A pytest started by a
test (a nested run) writes nothing: its parent's test already counts.
"""

from __future__ import annotations

import json
import os

import pytest

_INNER = "_HPCDIST_TEST_SUMMARY_INNER"
_key = pytest.StashKey["str | None"]()


def _rank_and_job() -> tuple[int, str]:
    for name in ("OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK", "SLURM_PROCID"):
        if name in os.environ:
            job = os.environ.get("PMIX_NAMESPACE") or os.environ.get("SLURM_JOB_ID", "")
            return int(os.environ[name]), job or f"ppid{os.getppid()}"
    return 0, f"pid{os.getpid()}"


def pytest_configure(config: pytest.Config) -> None:
    path = os.environ.get("HPCDIST_TEST_SUMMARY")
    active = bool(path) and not os.environ.get(_INNER)
    config.stash[_key] = path if active else None
    if active:
        os.environ[_INNER] = "1"  # children (a nested pytest) inherit it



def pytest_terminal_summary(terminalreporter, exitstatus: int, config: pytest.Config) -> None:
    path = config.stash.get(_key, None)
    if not path:
        return
    stats = terminalreporter.stats
    rank, job = _rank_and_job()
    line = {
        "args": " ".join(str(a) for a in config.args),
        "job": job,
        "rank": rank,
        "passed": len(stats.get("passed", [])) + len(stats.get("xpassed", [])),
        "failed": len(stats.get("failed", [])) + len(stats.get("error", [])),
        "skipped": len(stats.get("skipped", [])) + len(stats.get("xfailed", [])),
        "exitstatus": int(exitstatus),
    }
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "a", encoding="utf-8") as f:  # one short write: lines stay whole
        f.write(json.dumps(line) + "\n")
