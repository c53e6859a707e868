"""Shared test doubles for the cluster tests: a fake MPI world for the resolvers' MPI paths."""

from __future__ import annotations

import importlib

import pytest


class FakeComm:
    """Stands in for an mpi4py communicator: allgather returns the given hosts."""

    def __init__(self, hosts: list[str]) -> None:
        self.hosts = hosts
        self.calls = 0

    def allgather(self, value: str) -> list[str]:
        self.calls += 1
        return list(self.hosts)


class FakeNode:
    def __init__(self, rank: int, size: int) -> None:
        self.rank, self.size, self.freed = rank, size, False

    def Get_rank(self) -> int:  # noqa: N802 - mpi4py's name
        return self.rank

    def Get_size(self) -> int:  # noqa: N802
        return self.size

    def Free(self) -> None:  # noqa: N802
        self.freed = True


class FakeWorld(FakeComm):
    """COMM_WORLD of an MPI job of ``len(hosts)`` ranks, seen from ``rank``."""

    def __init__(self, rank: int, hosts: list[str]) -> None:
        super().__init__(hosts)
        self.rank = rank

    def Get_rank(self) -> int:  # noqa: N802
        return self.rank

    def Get_size(self) -> int:  # noqa: N802
        return len(self.hosts)

    def Split_type(self, kind: int) -> FakeNode:  # noqa: N802
        host = self.hosts[self.rank]
        return FakeNode(self.hosts[: self.rank].count(host), self.hosts.count(host))


class FakeMPI:
    COMM_TYPE_SHARED = 7

    def __init__(self, rank: int, hosts: list[str]) -> None:
        self.COMM_WORLD = FakeWorld(rank, hosts)


@pytest.fixture
def fake_mpi(monkeypatch: pytest.MonkeyPatch):
    """Make the MPI bootstrap the cluster layer calls return a fake MPI world; returns the setter.

    The cluster layer starts MPI through the provider the runtime registers
    (``hpcdist.cluster.mpi.set_mpi_provider``), so that is what is replaced.
    """

    def install(rank: int, hosts: list[str]) -> FakeMPI:
        fake = FakeMPI(rank, hosts)
        monkeypatch.setattr(
            importlib.import_module("hpcdist.cluster.mpi"), "_mpi_provider", lambda: fake
        )
        return fake

    return install
