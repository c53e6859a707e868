"""The rig itself: idempotent hosts with their own names and addresses, shaping, isolation."""

from __future__ import annotations

import subprocess

from tests.multihost.rig import AGENT, NET, hosts_sh


def sh(*command: str) -> str:
    return subprocess.run(command, capture_output=True, text=True, timeout=30, check=True).stdout


def test_up_is_idempotent_and_each_host_has_its_name_and_address():
    before = hosts_sh("status").stdout
    assert hosts_sh("up", "3").returncode == 0
    assert hosts_sh("status").stdout == before
    assert before.split() == [
        "hpcn1", f"{NET}.11/24", "hpcn2", f"{NET}.12/24", "hpcn3", f"{NET}.13/24"
    ]
    hosts = open("/etc/hosts").read()
    for i in (1, 2, 3):
        assert f"{NET}.{10 + i} hpcn{i} # hpcdist-multihost" in hosts
        assert sh(str(AGENT), f"hpcn{i}", "hostname").strip() == f"hpcn{i}"


def test_hosts_reach_only_the_bridge_network():
    routes = sh("ip", "-n", "hpcn1", "route")
    assert "default" not in routes and f"{NET}.0/24" in routes


def test_shape_limits_both_directions_and_off_removes_it():
    try:
        assert hosts_sh("shape", "1gbit").returncode == 0
        inside = sh("ip", "netns", "exec", "hpcn2", "tc", "qdisc", "show", "dev", "eth0")
        outside = sh("tc", "qdisc", "show", "dev", "hpcv2")
        assert "tbf" in inside and "rate 1Gbit" in inside
        assert "tbf" in outside and "rate 1Gbit" in outside
    finally:
        assert hosts_sh("shape", "off").returncode == 0
    assert "tbf" not in sh("tc", "qdisc", "show", "dev", "hpcv2")


def test_hosts_up_shapes_for_the_block_and_leaves_up_hosts_up():
    from tests.multihost.rig import hosts_up

    before = hosts_sh("status").stdout  # the session's three hosts
    try:
        with hosts_up(3, "1gbit"):
            assert "rate 1Gbit" in sh("tc", "qdisc", "show", "dev", "hpcv2")
            raise KeyError("inside the block")
    except KeyError:
        pass
    assert "tbf" not in sh("tc", "qdisc", "show", "dev", "hpcv2")  # shaping off, even so
    assert hosts_sh("status").stdout == before  # they were up: still up
