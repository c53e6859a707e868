"""The conformance checks over MPI: one replica per rank, and 2 logical CPU devices per rank.

Run under ``mpirun -n 2`` and ``-n 4`` (``make mpi-test``); with 2 ranks and
``devices`` of 2 logical CPUs that is 2 x 2 = 4 replicas in sync.
"""

from __future__ import annotations

import pytest

import hpcdist as hd
from tests.conformance.checks import CHECKS

_STRATEGIES: dict[str, hd.MultiWorkerMirroredStrategy] = {}


def strategy_named(name: str) -> hd.MultiWorkerMirroredStrategy:
    """One strategy per kind for the whole run (constructing one is collective)."""
    if name not in _STRATEGIES:
        devices = ["/cpu:0", "/cpu:1"] if name == "2cpu-per-rank" else None
        _STRATEGIES[name] = hd.MultiWorkerMirroredStrategy(devices=devices)
    return _STRATEGIES[name]


@pytest.mark.mpi(min_size=2)
@pytest.mark.timeout(60)
@pytest.mark.parametrize("check", CHECKS, ids=lambda c: c.__name__.removeprefix("check_"))
@pytest.mark.parametrize("name", ["1-per-rank", "2cpu-per-rank"])
def test_conformance(name, check):
    strategy = strategy_named(name)
    from hpcdist.runtime import world

    k = 2 if name == "2cpu-per-rank" else 1
    assert strategy.num_replicas_in_sync == k * world().size
    check(strategy)
