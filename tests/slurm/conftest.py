"""Tests against a real SLURM: skipped, with the reason, when no local cluster is up.

``make slurm-test`` (slurm/local/run-tests.sh) installs and starts the cluster
of slurm/local/ first; by hand: ``sudo slurm/local/start.sh`` then
``.venv/bin/python -m pytest -q tests/slurm``.
"""

from __future__ import annotations

import os

import pytest

from tests.slurm.jobs import cluster_problem


@pytest.fixture(scope="session", autouse=True)
def slurm_cluster() -> None:
    """Skip every test of this directory when SLURM cannot take jobs.

    With ``HPCDIST_REQUIRE_SLURM=1`` (set by slurm/local/run-tests.sh after it
    started the cluster) the tests fail instead.
    """
    problem = cluster_problem()
    if problem is None:
        return
    message = f"no local SLURM cluster: {problem}; start one with slurm/local/start.sh"
    if os.environ.get("HPCDIST_REQUIRE_SLURM") == "1":
        pytest.fail(message + " (HPCDIST_REQUIRE_SLURM=1: the cluster should be up)")
    pytest.skip(message)
