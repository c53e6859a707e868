"""Tests across separate hosts: network namespaces on one machine (``hosts.sh``).

``make multihost-test`` (``tests/multihost/run-tests.sh``) runs them as root. The
session fixture brings up three hosts (the two-host tests use the first two)
and takes them down at the end, failed tests included. Where the hosts cannot
start (not root, no network namespaces) every test is skipped with the reason,
or fails with ``HPCDIST_REQUIRE_MULTIHOST=1`` (set by run-tests.sh where the
machine can run them).
"""

from __future__ import annotations

import os

import pytest

from tests.multihost.rig import hosts_sh


@pytest.fixture(scope="session", autouse=True)
def hosts():
    check = hosts_sh("check")
    if check.returncode != 0:
        message = f"no namespace hosts: {check.stdout.strip()}"
        if os.environ.get("HPCDIST_REQUIRE_MULTIHOST") == "1":
            pytest.fail(message + " (HPCDIST_REQUIRE_MULTIHOST=1)")
        pytest.skip(message)
    up = hosts_sh("up", "3")
    assert up.returncode == 0, up.stdout
    try:
        yield
    finally:
        if os.environ.get("HPCDIST_MH_KEEP") != "1":
            hosts_sh("down")
