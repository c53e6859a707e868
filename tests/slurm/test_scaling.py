"""slurm/scaling.sbatch: `hpcdist bench train` on 1 and 2 (virtual) nodes, then the report.

As in test_multinode.py, ``LAUNCHER=mpirun`` (srun --mpi=pmix cannot span two
virtual nodes of one host).
"""

from __future__ import annotations

import json
import re

import pytest

from tests.slurm.jobs import SLURM_DIR, partition_nodes, read, sbatch, wait


@pytest.mark.timeout(330)
def test_scaling_sweep_runs_on_one_and_two_nodes_and_writes_the_report(tmp_path) -> None:
    if len(partition_nodes("vnodes")) < 2:
        pytest.skip("partition vnodes (slurm/local/start.sh, HPCDIST_SLURM_VNODES>=2) is missing")
    out = tmp_path / "job.out"
    results = tmp_path / "results"
    options = ["-p", "vnodes", "--nodes=2", "--ntasks-per-node=1", "--cpus-per-task=1"]
    args = ["--iters", "3", "--batches-per-iter", "3", "--warmup", "1", "--hidden", "64"]
    job = sbatch(SLURM_DIR / "scaling.sbatch", args, out=out, options=options,
                 env={"LAUNCHER": "mpirun", "OUT": str(results)})
    info = wait(job, timeout=300, out=out)
    log = read(out)
    assert info["JobState"] == "COMPLETED" and info["ExitCode"] == "0:0", log[-4000:]
    assert "== 1 node(s), 1 ranks" in log and "== 2 node(s), 2 ranks" in log, log[-4000:]
    report = json.loads((results / "scaling.json").read_text())
    rows = [(r["ranks"], r["nodes"]) for r in report["rows"]]
    assert rows == [(1, 1), (2, 2)], report
    assert report["rows"][0]["efficiency"] == 1.0 and report["rows"][1]["efficiency"] > 0
    assert re.search(r"^mlp +weak +2 +2 ", log, re.M), log[-3000:]
    assert (results / "scaling.png").stat().st_size > 1000
