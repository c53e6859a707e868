"""``hpcdist info``, the runtime's world and the resolvers across real (namespace) hosts."""

from __future__ import annotations

import json

import pytest

from tests.multihost.rig import THREE_BY_ONE, TWO_BY_TWO, mpirun

LAYOUTS = {"2x2": TWO_BY_TWO, "3x1": THREE_BY_ONE}


def expected(layout):
    rows, rank = [], 0
    for node, (host, slots) in enumerate(layout):
        for local in range(slots):
            rows.append({"rank": rank, "host": host, "node": node, "local": local, "of": slots})
            rank += 1
    return rows


@pytest.mark.parametrize("name", LAYOUTS)
def test_hpcdist_info_lists_each_host_with_its_local_ranks(name):
    layout = LAYOUTS[name]
    proc = mpirun(layout, ["-m", "hpcdist", "info", "--json"], timeout=120)
    assert proc.returncode == 0, proc.stdout
    info = json.loads(proc.stdout[proc.stdout.index("{") :])
    assert info["job"]["node_count"] == len(layout)
    assert info["job"]["world_size"] == sum(s for _, s in layout)
    got = [
        {"rank": r["rank"], "host": r["host"], "node": r["node"], "local": r["local_rank"],
         "of": r["local_size"]}
        for r in sorted(info["ranks"], key=lambda r: r["rank"])
    ]  # fmt: skip
    assert got == expected(layout)


@pytest.mark.parametrize("name", LAYOUTS)
def test_world_and_resolver_see_nodes_local_ranks_and_leaders(name):
    layout = LAYOUTS[name]
    proc = mpirun(layout, ["tests/multihost/scripts/topology.py"], timeout=120)
    assert proc.returncode == 0, proc.stdout
    rows = sorted(
        (json.loads(line.split(" ", 1)[1]) for line in proc.stdout.splitlines()
         if line.startswith("TOPOLOGY ")),
        key=lambda r: r["rank"],
    )  # fmt: skip
    want = expected(layout)
    assert len(rows) == len(want), proc.stdout
    for row, exp in zip(rows, want, strict=True):
        assert row["hostname"] == row["gethostname"] == exp["host"]
        assert (row["node_index"], row["node_count"]) == (exp["node"], len(layout))
        assert (row["local_rank"], row["local_size"]) == (exp["local"], exp["of"])
        # One leader per host: local rank 0, in a leaders communicator of one rank per host.
        assert row["leader"] == (exp["local"] == 0)
        assert row["leaders_size"] == (len(layout) if exp["local"] == 0 else None)
        assert row["leader_host"] == exp["host"]
        assert (row["resolver_rank"], row["resolver_task_id"]) == (exp["rank"], exp["rank"])
        assert (row["resolver_local_rank"], row["resolver_local_size"]) == (exp["local"], exp["of"])
        # The resolver's cluster spec names each worker's host, in rank order.
        assert row["resolver_spec"] == rows[0]["resolver_spec"]
    workers = rows[0]["resolver_spec"]["worker"]
    assert [w.split(":")[0] for w in workers] == [e["host"] for e in want]
