"""Shared fixtures of the distribute tests: strategies on logical CPUs, a clean context."""

from __future__ import annotations

import pytest

import hpcdist as hd
from hpcdist.distribute import context


def rid() -> int:
    """The replica id inside ``strategy.run``."""
    return hd.get_replica_context().replica_id_in_sync_group


@pytest.fixture(autouse=True)
def _clean_context():
    """Each test starts and ends outside any scope, with no global strategy."""
    yield
    leaked = context._stack()
    context.set_thread_stack([])
    hd.experimental_set_strategy(None)
    assert not leaked, "a test left a strategy scope open"


@pytest.fixture(scope="module")
def s():
    return hd.MirroredStrategy(["/cpu:0", "/cpu:1"])


@pytest.fixture(scope="module")
def s2():
    return hd.MirroredStrategy(["/cpu:0", "/cpu:1"])


@pytest.fixture(scope="module")
def s3():
    return hd.MirroredStrategy(["/cpu:0", "/cpu:1", "/cpu:2"])
