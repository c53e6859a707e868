"""The steering variables: environment changes counted by an audit hook, and engines'
remembered picks checked again only after a change of a variable the pick read."""

from __future__ import annotations

import os

import numpy as np

from hpcdist.collectives import Collectives, CommunicationOptions, choice, registry
from hpcdist.collectives.options import CommunicationImplementation as CI
from hpcdist.runtime import mpi

UNRELATED = "HPCDIST_TEST_UNRELATED_VARIABLE"


def test_every_way_of_changing_the_environment_is_counted(monkeypatch):
    assert choice.watch_environment()
    assert choice.watch_environment()  # (once per process: a second call adds no hook)
    seen = [choice.ENV_CHANGES[0]]

    def changed() -> bool:
        seen.append(choice.ENV_CHANGES[0])
        return seen[-1] > seen[-2]

    monkeypatch.setenv(UNRELATED, "1")  # os.environ[...] = ...
    assert changed()
    monkeypatch.setenv(UNRELATED, "1")  # the same value again still counts (harmless)
    assert changed()
    monkeypatch.delenv(UNRELATED)  # del os.environ[...]
    assert changed()
    os.putenv(UNRELATED, "2")
    assert changed()
    os.unsetenv(UNRELATED)
    assert changed()
    os.environ.get(UNRELATED)  # reading is no change
    assert not changed()
    assert choice.env_version() == choice.ENV_CHANGES[0]


def _counting_where(asked: list[int], size: int = 2, largest_node: int = 1):
    def where() -> registry.Where:
        asked.append(1)
        return registry.Where(
            None, CommunicationOptions(), choice.env_implementation(), size, nodes=1,
            largest_node=largest_node,
        )

    return where


def test_a_remembered_pick_is_made_again_only_when_a_variable_it_read_changed(monkeypatch):
    monkeypatch.delenv(choice.ENV_VAR, raising=False)
    monkeypatch.delenv(choice.BAND_VAR, raising=False)
    choice.watch_environment()
    asked: list[int] = []
    memo: dict[int, tuple] = {}
    where = _counting_where(asked)
    known = registry.remembered_pick(memo, 7, None, True, where)
    assert memo[7] is known and known[0].name == "mpi" and asked == [1]
    assert known[1] == registry.generation() and known[2] == choice.ENV_CHANGES[0]

    monkeypatch.setenv(UNRELATED, "1")  # a change, but not of what the pick read
    assert memo[7][2] != choice.ENV_CHANGES[0]  # (so the engine asks again)
    again = registry.remembered_pick(memo, 7, memo[7], True, where)
    assert again[0] is known[0] and asked == [1]  # checked, not picked again
    assert again[2] == choice.ENV_CHANGES[0]  # and current: the next call only compares

    monkeypatch.setenv(choice.ENV_VAR, "shm")  # AUTO read it: picked again
    registry.remembered_pick(memo, 7, memo[7], True, where)
    assert asked == [1, 1]

    explicit: dict[int, tuple] = {}  # a call that did not ask for AUTO never read it
    registry.remembered_pick(explicit, 8, None, False, where)
    monkeypatch.setenv(choice.ENV_VAR, "mpi")
    registry.remembered_pick(explicit, 8, explicit[8], False, where)
    assert len(asked) == 3


def test_a_pick_that_read_the_mpi_band_is_made_again_when_the_band_changes(monkeypatch):
    monkeypatch.delenv(choice.ENV_VAR, raising=False)
    monkeypatch.delenv(choice.BAND_VAR, raising=False)
    choice.watch_environment()
    asked: list[int] = []
    memo: dict[int, tuple] = {}
    one_node = _counting_where(asked, largest_node=2)  # AUTO on one 2-rank node: mpi-direct asks
    registry.remembered_pick(memo, 9, None, True, one_node)
    monkeypatch.setenv(choice.BAND_VAR, "0:0")
    registry.remembered_pick(memo, 9, memo[9], True, one_node)
    assert asked == [1, 1]

    several: dict[int, tuple] = {}  # one rank per node: no algorithm reads the band
    registry.remembered_pick(several, 10, None, True, _counting_where(asked))
    monkeypatch.setenv(choice.BAND_VAR, "0:1")
    registry.remembered_pick(several, 10, several[10], True, _counting_where(asked))
    assert asked == [1, 1, 1]


def test_without_the_hook_every_call_checks_the_variables(monkeypatch):
    """Where another audit hook refused this one, the remembered version never matches."""
    monkeypatch.setitem(choice._watch, "seen", False)
    assert choice.env_version() == -1
    memo: dict[int, tuple] = {}
    known = registry.remembered_pick(memo, 11, None, True, _counting_where([]))
    assert known[2] == -1 != choice.ENV_CHANGES[0]


class _WhenMpiAsked:
    """Runs one-rank calls that asked for MPI (as ``copy`` would)."""

    name = "when-mpi-asked"

    def applies(self, where):
        return not where.device and where.size == 1 and where.implementation is CI.MPI

    def allreduce(self, session, items, layout, opts):
        return [np.array(items[0], copy=True)]


def test_an_engine_follows_a_change_of_the_variable_at_its_next_call(monkeypatch):
    monkeypatch.delenv(choice.ENV_VAR, raising=False)
    registry.register(_WhenMpiAsked())
    try:
        engine = Collectives(mpi().COMM_SELF)
        x = [np.arange(3.0)]
        for value, expected in ((None, "copy"), ("mpi", "when-mpi-asked"), ("mpi", None),
                                (None, "copy"), ("shm", "copy"), ("mpi", "when-mpi-asked")):
            if value is None:
                monkeypatch.delenv(choice.ENV_VAR, raising=False)
            else:
                monkeypatch.setenv(choice.ENV_VAR, value)
            expected = expected or engine.last_algorithm
            for _ in range(2):  # picked, then remembered
                (out,) = engine.allreduce(x, "SUM")
                assert engine.last_algorithm == expected, value
                np.testing.assert_array_equal(out, np.arange(3.0))
    finally:
        registry.unregister("when-mpi-asked")
