"""Fixtures shared by the tests of hpcdist.nn."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

import hpcdist as hd
from hpcdist.distribute import context


@pytest.fixture(autouse=True)
def _clean_context() -> Iterator[None]:
    yield
    leaked = context._stack()
    context.set_thread_stack([])
    assert not leaked, "a test left a strategy scope open"


@pytest.fixture(scope="module")
def strategy() -> hd.MirroredStrategy:
    return hd.MirroredStrategy(["/cpu:0", "/cpu:1"])
