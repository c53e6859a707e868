"""benchmarks/revisions.py: a revision is exported whole, both report shapes are read."""

from __future__ import annotations

import importlib
import pathlib
import subprocess
import sys

import pytest

BENCHMARKS = pathlib.Path(__file__).resolve().parents[2] / "benchmarks"


@pytest.fixture(scope="module")
def revisions():
    sys.path.insert(0, str(BENCHMARKS))
    try:
        yield importlib.import_module("revisions")
    finally:
        sys.path.remove(str(BENCHMARKS))


def test_a_revision_is_exported_whole(revisions, tmp_path):
    if not (BENCHMARKS.parent / ".git").exists():
        pytest.fail("benchmarks/revisions.py needs a git checkout")
    full = revisions.export("HEAD", tmp_path / "tree")
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=BENCHMARKS.parent,
                          capture_output=True, text=True, check=True).stdout.strip()
    assert full == head
    for path in ("hpcdist/__init__.py", "benchmarks/allreduce.py",
                 "benchmarks/strategy_collectives.py"):
        assert (tmp_path / "tree" / path).is_file()


def test_both_report_shapes_give_seconds_per_series_and_size(revisions):
    sc = {"rows": [{"bytes": 4, "seconds": {"engine": 5e-6, "mpi4py": 1e-6}}]}
    ar = {"rows": [{"bytes": 4, "series": {"hpcdist-auto": {"seconds": 7e-6}}}]}
    assert revisions.series_seconds("strategy_collectives", sc) == {
        ("engine", 4): 5e-6, ("mpi4py", 4): 1e-6}
    assert revisions.series_seconds("allreduce", ar) == {("hpcdist-auto", 4): 7e-6}
