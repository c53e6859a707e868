"""A parameter server outlives a client that dies (``mpirun --with-ft ulfm -n 3``, real processes).

Rank 0 serves, rank 1 (the initializer) and rank 2 are clients. Rank 2 sends
updates, then the header of a request whose payloads never come, and kills
itself with SIGKILL. The server must count it as done, finish rank 1's
requests and return; rank 1 must end normally.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
MPIRUN = Path(sys.executable).parent / "mpirun"

SCRIPT = r"""
import os, signal, sys, time
import numpy as np
from hpcdist.runtime import mpi, world
from hpcdist.distribute.ps import protocol as P
from hpcdist.distribute.ps.client import PSClient
from hpcdist.distribute.ps.server import serve

MPI = mpi()
world()  # as a strategy does: registers the exit guard that skips MPI_Finalize after a failure
comm = MPI.COMM_WORLD.Dup()
rank = comm.Get_rank()
if rank == 0:
    stats = serve(comm, [1, 2])
    print(f"SERVER_RETURNED failed={stats['failed_clients']} updates={stats['updates']}",
          flush=True)
else:
    client = PSClient(comm, [0], initializer=rank == 1)
    client.create(0, 0, np.zeros((), np.int64), "count")
    one = np.ones((), np.int64)
    if rank == 2:
        for _ in range(200):
            client.update(0, 0, "add", one)
        client.stats(0)  # the 200 updates are in
        # The header of an apply with one gradient; the id table and gradient never come.
        h = P.encode_header(P.OP_APPLY, 0, count=1)
        comm.Send([h, MPI.INT64_T], 0, P.TAG_HEADER)
        time.sleep(0.2)
        os.kill(os.getpid(), signal.SIGKILL)
    start = time.time()
    n = 0
    while time.time() - start < 2.0:  # rank 2 dies in the meantime
        client.update(0, 0, "add", one)
        n += 1
        if n % 100 == 0:
            client.stats(0)
    out = np.empty((), np.int64)
    client.pull(0, [0], [out])
    assert int(out) == n + 200, (int(out), n)
    client.close()
    print(f"CLIENT_OK n={n} value={int(out)}", flush=True)
comm.Free()
print(f"RANK_{rank}_EXIT", flush=True)
sys.exit(0)
"""


@pytest.mark.timeout(180)
def test_server_returns_when_a_client_is_killed(tmp_path):
    if not MPIRUN.exists():
        pytest.skip(f"no mpirun next to {sys.executable}")
    script = tmp_path / "ps_kill.py"
    script.write_text(SCRIPT)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OMPI_COMM", "PMIX_"))}
    env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", OMP_NUM_THREADS="1")
    done = subprocess.run(
        [str(MPIRUN), "--with-ft", "ulfm", "--oversubscribe", "-n", "3", sys.executable,
         str(script)],
        env=env, cwd=ROOT, capture_output=True, text=True, timeout=150,
    )  # fmt: skip
    out = done.stdout
    if "SERVER_RETURNED" not in out and "ulfm" in done.stderr.lower():
        pytest.skip(f"this MPI cannot run with --with-ft ulfm: {done.stderr[-500:]}")
    assert "SERVER_RETURNED failed=[2]" in out, out + done.stderr
    assert "CLIENT_OK" in out and "RANK_1_EXIT" in out and "RANK_0_EXIT" in out, out + done.stderr
    assert "RANK_2_EXIT" not in out and done.returncode == 0, out + done.stderr
    n = int(out.split("CLIENT_OK n=")[1].split()[0])
    updates = int(out.split("updates=")[1].split()[0])
    assert updates == n + 200
