"""The exit guard that skips ``MPI_Finalize`` after a failed rank, and who registers it.

Under ``mpirun --with-ft ulfm`` Open MPI's ``MPI_Finalize`` can wait for a dead rank
for ever; a CI run hung that way when a coordinator script built no world (so no
guard was registered). These tests pin the guard's behaviour and that both
coordinators register it before their own exit handler (handlers run last-registered
first, so the guard runs after the coordinator has sent EXIT).
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from hpcdist.distribute.coordinator import cluster_coordinator as cc
from hpcdist.distribute.coordinator import follower
from hpcdist.distribute.ps.roles import PSRoles
from hpcdist.runtime import failures


@pytest.fixture
def exits(monkeypatch):
    calls: list[int] = []
    monkeypatch.setattr(failures.os, "_exit", calls.append)
    monkeypatch.setattr(failures, "_seen", False)
    return calls


def test_the_guard_ends_the_process_with_status_0_once_a_failure_was_noted(exits):
    failures._exit_without_finalize()
    assert exits == []  # no failure: MPI_Finalize runs as usual
    assert not failures.failure_seen()
    failures.note_process_failure()
    assert failures.failure_seen()
    failures._exit_without_finalize()
    assert exits == [0]


def test_a_failed_rank_known_to_mpi_also_triggers_the_guard(exits, monkeypatch):
    monkeypatch.setattr(failures, "_world_has_failed_ranks", lambda: True)
    failures._exit_without_finalize()
    assert exits == [0]


@pytest.mark.parametrize(
    ("roles", "kind"),
    [
        (PSRoles(None, 0, (), (1, 2), 0, "chief", 0), cc.ClusterCoordinator),
        (PSRoles(None, 1, (), (1, 2), 0, "worker", 0), follower.WorkerCoordinator),
    ],
)
def test_coordinators_register_the_guard_before_their_exit_handler(monkeypatch, roles, kind):
    order: list[str] = []
    monkeypatch.setattr(cc.atexit, "register", lambda fn: order.append(fn.__name__))
    for module in (cc, follower):
        monkeypatch.setattr(module, "register_exit_guard", lambda: order.append("guard"))
    comm = SimpleNamespace(Set_errhandler=lambda handler: None)
    strategy = SimpleNamespace(extended=SimpleNamespace(_roles=roles, _coordination_comm=comm))
    coordinator = cc.ClusterCoordinator(strategy)
    assert type(coordinator) is kind
    assert order == ["guard", "_shutdown"]
