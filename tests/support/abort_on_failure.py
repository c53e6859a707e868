"""A pytest hook for multi-rank test runs: a failure on any rank aborts the whole run.

Imported by the conftest.py of tests/mpi and tests/interop_mpi.

A rank whose test failed would otherwise run on into the next test's
collectives while the others wait in this one's: the run would hang until the
timeout. Here the failing rank prints its report and calls ``MPI_Abort``, so
``mpirun`` ends every rank at once with a non-zero status.
"""

from __future__ import annotations

import sys

import pytest


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if report.failed:
        from hpcdist.runtime import mpi

        MPI = mpi()
        if MPI.COMM_WORLD.Get_size() > 1:
            rank = MPI.COMM_WORLD.Get_rank()
            sys.stderr.write(f"\n[rank {rank}] FAILED {item.nodeid} ({report.when})\n")
            sys.stderr.write(f"{report.longreprtext}\n")
            sys.stderr.flush()
            MPI.COMM_WORLD.Abort(1)
