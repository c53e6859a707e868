"""slurm/train-multinode.sbatch with its mpirun alternative, on two (virtual) nodes.

``srun --mpi=pmix`` cannot span two virtual nodes of one host (both step
daemons want the same PMIx directory, see slurm/local/README.md), so the
template's ``LAUNCHER=mpirun`` path is what runs here: Open MPI's mpirun inside
the allocation starts its daemons on the other node with srun.
"""

from __future__ import annotations

import re

import pytest

from tests.slurm.jobs import SLURM_DIR, partition_nodes, read, sbatch, wait


@pytest.mark.timeout(330)
def test_multinode_template_with_mpirun_on_two_nodes(tmp_path) -> None:
    if len(partition_nodes("vnodes")) < 2:
        pytest.skip("partition vnodes (slurm/local/start.sh, HPCDIST_SLURM_VNODES>=2) is missing")
    out = tmp_path / "job.out"
    options = ["-p", "vnodes", "--nodes=2", "--ntasks-per-node=1", "--cpus-per-task=1"]
    args = ["examples/train_digits.py", "--epochs=2", "--verbose=2"]
    job = sbatch(
        SLURM_DIR / "train-multinode.sbatch",
        args,
        out=out,
        options=options,
        env={"LAUNCHER": "mpirun"},
    )
    info = wait(job, timeout=300, out=out)
    log = read(out)
    assert info["JobState"] == "COMPLETED" and info["ExitCode"] == "0:0", log[-4000:]
    assert info["NodeList"] == "vn[9-10]" and info["NumNodes"] == "2"
    assert "(tasks per node: 1(x2))" in log
    assert re.search(r"^launcher: +openmpi$", log, re.M), log[:2000]
    assert re.search(r"^world: +2 ranks on 2 node\(s\)", log, re.M), log[:2000]
    assert "2 replicas, global batch 64" in log
    assert re.search(r"^test accuracy: 0\.\d+$", log, re.M), log[-2000:]
