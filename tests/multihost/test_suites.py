"""The multi-rank suites of tests/mpi, run as one job across real (namespace) hosts.

Each test starts ``mpirun`` over the hosts with pytest-mpi inside; ranks on different
hosts talk over TCP, ranks of one host through shared memory, and the node-aware
algorithms (hierarchical, node leaders) see real nodes. A failing test on any rank
aborts the job (tests/mpi/conftest.py), so a non-zero status is a failure.
"""

from __future__ import annotations

import re

import pytest

from tests.multihost.rig import THREE_BY_ONE, TWO_BY_TWO, pytest_across

pytestmark = pytest.mark.timeout(900)

LAYOUTS = {"2x2": TWO_BY_TWO, "3x1": THREE_BY_ONE}
SUITES = {
    # The engine's property tests: every backend (hierarchical included) against NumPy.
    "engine": [
        "tests/mpi/test_engine_properties.py",
        "tests/mpi/test_collectives.py",
        "tests/mpi/test_registry_mpi.py",
    ],
    # The tf.distribute conformance checks (tests/conformance) on several workers.
    "conformance": ["tests/mpi/test_conformance.py"],
    # fit and custom loops on N ranks equal one process on the global batch.
    "training": ["tests/mpi/test_training_equivalence.py"],
    # ParameterServerStrategy: ps and chief on the first host, workers on every host.
    "ps": ["tests/mpi/test_ps_strategy.py"],
}


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("suite", SUITES)
def test_suite_passes_across_hosts(suite, layout):
    proc = pytest_across(LAYOUTS[layout], SUITES[suite], timeout=600)
    assert proc.returncode == 0, proc.stdout[-6000:]
    # Every rank ran the tests and none failed: one "N passed ... in S s" line per rank.
    summaries = re.findall(r"^=*\s*(\d+ passed.* in [\d.]+s.*)$", proc.stdout, re.M)
    assert len(summaries) == sum(s for _, s in LAYOUTS[layout]), proc.stdout[-3000:]
    assert not [line for line in summaries if "failed" in line or "error" in line], summaries
