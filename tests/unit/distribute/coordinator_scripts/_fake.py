"""A stand-in for ParameterServerStrategy in the coordinator scripts: roles and a comm only.

Rank 0 is the chief, ranks 1.. are workers 0..; there is no ps (the coordinator never
talks to one). ``run(fn, args)`` just calls ``fn``.

Example: ``strategy = make_strategy()``; ``ClusterCoordinator(strategy)``.
"""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Any

from mpi4py import MPI

import hpcdist.runtime
from hpcdist.distribute.ps.roles import PSRoles


class FakeStrategy:
    """What ClusterCoordinator reads: ``extended._roles``, ``extended._coordination_comm``."""

    def __init__(self, chief: bool = True) -> None:
        # As the real strategies do: building the world first registers hpcdist's exit guard
        # (skip MPI_Finalize after a failed rank) before any other exit handler.
        hpcdist.runtime.world()
        world = MPI.COMM_WORLD
        rank, size = world.Get_rank(), world.Get_size()
        first = 1 if chief else 0
        workers = tuple(range(first, size))
        job, task = ("chief", 0) if chief and rank == 0 else ("worker", rank - first)
        roles = PSRoles(
            comm=world,
            rank=rank,
            ps_ranks=(),
            worker_ranks=workers,
            chief_rank=0 if chief else None,
            task_type=job,
            task_id=task,
        )
        self.extended = SimpleNamespace(_roles=roles, _coordination_comm=world.Dup())

    def run(self, fn: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        return fn(*args, **(kwargs or {}))


def report(tag: str, payload: Any) -> None:
    """One line the test parses: ``TAG <rank> <json>``."""
    print(f"{tag} {MPI.COMM_WORLD.Get_rank()} {json.dumps(payload)}", flush=True)
