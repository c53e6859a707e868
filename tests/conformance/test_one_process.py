"""The conformance checks in one process: 2 logical CPU devices, and the 1-replica strategies."""

from __future__ import annotations

import pytest

import hpcdist as hd
from tests.conformance.checks import CHECKS

STRATEGIES = {
    "mirrored-2cpu": lambda: hd.MirroredStrategy(["/cpu:0", "/cpu:1"]),
    "mirrored-3cpu": lambda: hd.MirroredStrategy(["/cpu:0", "/cpu:1", "/cpu:2"]),
    "multiworker-1x2cpu": lambda: hd.MultiWorkerMirroredStrategy(devices=["/cpu:0", "/cpu:1"]),
    "mirrored-1cpu": lambda: hd.MirroredStrategy(["/cpu:0"]),
}


@pytest.mark.timeout(60)
@pytest.mark.parametrize("check", CHECKS, ids=lambda c: c.__name__.removeprefix("check_"))
@pytest.mark.parametrize("name", sorted(STRATEGIES))
def test_conformance(name, check):
    check(STRATEGIES[name]())
