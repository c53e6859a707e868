"""The runtime's world, node and node-leader communicators on real ranks.

Run under `mpirun -n 2` and `-n 4` (and with HPCDIST_VIRTUAL_NODES=2) by `make test`.
"""

from __future__ import annotations

import json
import os
import socket
import time

import pytest

from hpcdist.cluster import MPIClusterResolver, detect_launcher
from hpcdist.errors import LaunchError
from hpcdist.runtime import build_world, check_launch, mpi, world
from hpcdist.runtime.mpi import library_version
from hpcdist.runtime.pmix import pmix_client, start_fence
from hpcdist.runtime.topology import virtual_nodes_from_env

pytestmark = pytest.mark.mpi(min_size=2)


def _all(value):
    return mpi().COMM_WORLD.allgather(value)


def test_world_agrees_with_comm_world():
    MPI = mpi()
    w = world()
    assert (w.rank, w.size) == (MPI.COMM_WORLD.Get_rank(), MPI.COMM_WORLD.Get_size())
    assert w.hostname == socket.gethostname()
    rows = _all((w.rank, w.local_rank, w.local_size, w.node_index, w.node_count))
    assert [r[0] for r in rows] == list(range(w.size))
    assert {r[4] for r in rows} == {w.node_count}
    nodes = {}
    for rank, local_rank, local_size, node, _ in rows:
        nodes.setdefault(node, []).append((rank, local_rank, local_size))
    assert sorted(nodes) == list(range(w.node_count))
    for members in nodes.values():
        assert [m[1] for m in members] == list(range(len(members)))
        assert {m[2] for m in members} == {len(members)}


def test_node_and_leader_communicators_are_consistent():
    MPI = mpi()
    w = world()
    assert w.node_comm.Get_size() == w.local_size
    assert w.node_comm.Get_rank() == w.local_rank
    # A sum over the node communicator counts exactly the ranks of this node.
    assert w.node_comm.allreduce(1, op=MPI.SUM) == w.local_size
    assert (w.leaders_comm is not None) == w.is_node_leader
    if w.is_node_leader:
        assert w.leaders_comm.Get_size() == w.node_count
        assert w.leaders_comm.Get_rank() == w.node_index
        assert w.leaders_comm.allreduce(w.local_size, op=MPI.SUM) == w.size


def test_virtual_nodes_from_environment():
    w = world()
    expected = virtual_nodes_from_env()
    assert w.virtual_nodes == expected
    hosts = len(set(_all(w.hostname)))
    # On one host every virtual node holds at least one rank.
    if hosts == 1:
        assert w.node_count == min(expected, w.size)


@pytest.mark.parametrize("virtual", [1, 2, 3, 8])
def test_virtual_node_split(virtual):
    MPI = mpi()
    size = MPI.COMM_WORLD.Get_size()
    if len(set(_all(socket.gethostname()))) != 1:
        pytest.skip("the exact split is asserted on a single host")
    w = build_world(virtual_nodes=virtual)
    try:
        assert w.node_count == min(virtual, size)
        # Contiguous blocks: node index never decreases with rank, sizes differ by at most 1.
        rows = _all((w.node_index, w.local_rank, w.local_size))
        assert [r[0] for r in rows] == sorted(r[0] for r in rows)
        sizes = {r[0]: r[2] for r in rows}
        assert sum(sizes.values()) == size
        assert max(sizes.values()) - min(sizes.values()) <= 1
        assert w.node_comm.allreduce(1, op=MPI.SUM) == w.local_size
        if w.is_node_leader:
            assert w.leaders_comm.allreduce(1, op=MPI.SUM) == w.node_count
    finally:
        w.node_comm.Free()
        if w.leaders_comm is not None:
            w.leaders_comm.Free()


def test_launcher_and_resolver_agree_with_mpi():
    w = world()
    launch = detect_launcher()
    assert launch is not None, "under mpirun the launcher's variables must be detected"
    assert (launch.rank, launch.size) == (w.rank, w.size)
    resolver = MPIClusterResolver()
    assert resolver.task_type == "worker" and resolver.task_id == w.rank
    spec = resolver.cluster_spec()
    assert spec.num_tasks("worker") == w.size
    addresses = _all(spec.task_address("worker", w.rank))
    assert len(set(addresses)) == w.size, "every rank needs its own address"
    check_launch(w.size)  # the real launch is a good one


def test_disagreeing_sizes_are_reported():
    w = world()
    with pytest.raises(LaunchError, match="disagree"):
        check_launch(w.size + 1)


def test_info_json_lists_every_rank(capsys):
    from hpcdist.cli import info

    w = world()
    assert info(as_json=True) == 0
    out = capsys.readouterr().out
    if w.rank == 0:
        report = json.loads(out)
        assert [r["rank"] for r in report["ranks"]] == list(range(w.size))
        assert report["job"]["world_size"] == w.size
        assert report["job"]["environment"]["launcher"]
        assert report["job"]["mpi_library"].startswith(("Open MPI", "MPICH", "Intel"))
    else:
        assert out == ""


def test_pid_distinct_per_rank():
    assert len(set(_all(os.getpid()))) == world().size


def _binding_with(visible_for_rank, gpus_per_task=None):
    """Build a fresh world where each rank sees ``visible_for_rank(rank)``, and bind."""
    rank = mpi().COMM_WORLD.Get_rank()
    value = visible_for_rank(rank)
    before = os.environ.pop("CUDA_VISIBLE_DEVICES", None)
    if value is not None:
        os.environ["CUDA_VISIBLE_DEVICES"] = value
    try:
        w = build_world(virtual_nodes=1)
    finally:
        os.environ.pop("CUDA_VISIBLE_DEVICES", None)
        if before is not None:
            os.environ["CUDA_VISIBLE_DEVICES"] = before
    try:
        return w, w.gpu_binding(gpus_per_task)
    finally:
        w.node_comm.Free()
        if w.leaders_comm is not None:
            w.leaders_comm.Free()


def test_gpu_binding_splits_a_shared_list_by_host_rank():
    size = mpi().COMM_WORLD.Get_size()
    gpus = [f"GPU-{i:04d}" for i in range(size)]
    w, binding = _binding_with(lambda rank: ",".join(gpus))
    share = size // w.host_size
    assert binding.visible == tuple(gpus[w.host_rank * share : (w.host_rank + 1) * share])
    assert binding.ordinals == tuple(range(share))
    mine = [(host, gpu) for host, got in _all((w.hostname, binding.visible)) for gpu in got]
    assert len(set(mine)) == len(mine), "no GPU given to two ranks of one host"


def test_gpu_binding_keeps_a_list_the_scheduler_narrowed():
    w, binding = _binding_with(lambda rank: str(rank))
    assert binding.visible == (str(w.rank),)
    assert binding.ordinals == (0,)


def test_gpu_binding_splits_within_groups_that_share_a_list():
    # Like --gpu-bind=closest: ranks 0,1 see GPUs 0,1, ranks 2,3 see GPUs 2,3, and so on.
    w, binding = _binding_with(lambda rank: f"{rank - rank % 2},{rank - rank % 2 + 1}")
    assert binding.visible == (str(w.rank),)


def test_gpu_binding_without_gpus_is_the_cpu():
    w, binding = _binding_with(lambda rank: "")
    assert binding.visible == ()


def test_start_fence_holds_every_rank_until_the_last_enters():
    """The start-up fence is a barrier through the launcher (PMIx), not an MPI message."""
    comm = mpi().COMM_WORLD
    if pmix_client() is None:
        assert not library_version().startswith("Open MPI v5"), "Open MPI 5 is a PMIx client"
        pytest.skip(f"{library_version()}: no PMIx client in this process, no fence to test")
    late = comm.Get_size() - 1
    comm.Barrier()
    if comm.Get_rank() == late:
        time.sleep(0.6)
    started = time.perf_counter()
    assert start_fence(comm.Get_size()) is True
    waited = time.perf_counter() - started
    waits = comm.allgather(waited)
    assert min(w for r, w in enumerate(waits) if r != late) >= 0.3, waits
