"""Multi-rank test runs: a failure on any rank aborts the whole run (see the hook's module)."""

from tests.support.abort_on_failure import pytest_runtest_makereport  # noqa: F401
