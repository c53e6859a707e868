"""Print this rank's place as the runtime and the resolvers see it, one JSON line per rank.

Usage (under mpirun across the namespace hosts): ``python topology.py``. Each rank
prints ``TOPOLOGY {json}`` with its world fields, whether it is in the leaders
communicator (and that communicator's size), the host name the leader of its
node reports, and what ``MPIClusterResolver`` and ``hd.cluster_resolver.detect``
say (task id, cluster spec).
"""

from __future__ import annotations

import json
import socket

import hpcdist as hd
from hpcdist.runtime import world

w = world()
leader_host = w.node_comm.bcast(socket.gethostname() if w.local_rank == 0 else None, root=0)
resolver = hd.cluster_resolver.MPIClusterResolver()
row = {
    **{k: v for k, v in w.as_dict().items() if k in (
        "rank", "size", "local_rank", "local_size", "node_index", "node_count", "hostname")},
    "gethostname": socket.gethostname(),
    "leader": w.leaders_comm is not None,
    "leaders_size": None if w.leaders_comm is None else w.leaders_comm.Get_size(),
    "leader_host": leader_host,
    "resolver_task_id": resolver.task_id,
    "resolver_rank": resolver.rank,
    "resolver_local_rank": resolver.local_rank,
    "resolver_local_size": resolver.local_size,
    "resolver_spec": resolver.cluster_spec().as_dict(),
}  # fmt: skip
print("TOPOLOGY " + json.dumps(row), flush=True)
