"""SLURM across the namespace hosts: one slurmctld here, one slurmd in each host
(tests/multihost/slurm.sh). ``srun --mpi=pmix`` spans two real hosts, the multi-node
template trains the digits job across them, and the requeue round trip runs across them."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess

import pytest

from tests.multihost.rig import HERE
from tests.slurm.jobs import SLURM_DIR, job_env, read, run, sbatch, wait
from tests.slurm.test_requeue import check_requeue_round_trip

STATE = os.environ.get("HPCDIST_MH_SLURM_DIR", "/var/spool/slurm-hpcdist-mh")
TWO_HOSTS = ["-N", "2", "--ntasks-per-node=2", "--overcommit"]


def slurm_sh(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(HERE / "slurm.sh"), *args], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        text=True, timeout=180, check=False,
    )  # fmt: skip


@pytest.fixture(scope="module", autouse=True)
def cluster():
    """The two-host cluster for this module; its clients read $SLURM_CONF."""
    old = os.environ.get("SLURM_CONF")
    up = slurm_sh("up", "2")
    assert up.returncode == 0, up.stdout
    os.environ["SLURM_CONF"] = f"{STATE}/slurm.conf"
    try:
        yield
    finally:
        slurm_sh("down")
        if old is None:
            os.environ.pop("SLURM_CONF", None)
        else:
            os.environ["SLURM_CONF"] = old


@pytest.mark.timeout(180)
def test_srun_pmix_spans_two_hosts():
    proc = run(
        ["srun", "--mpi=pmix", *TWO_HOSTS, "-n", "4", "python", "-m", "hpcdist", "info", "--json"],
        timeout=150,
    )
    assert proc.returncode == 0, proc.stdout
    info = json.loads(proc.stdout[proc.stdout.index("{") :])
    assert info["job"]["environment"]["scheduler"] == "slurm", info["job"]
    assert info["job"]["node_count"] == 2 and info["job"]["world_size"] == 4
    layout = sorted((r["rank"], r["host"], r["local_rank"]) for r in info["ranks"])
    assert layout == [(0, "hpcn1", 0), (1, "hpcn1", 1), (2, "hpcn2", 0), (3, "hpcn2", 1)]


@pytest.mark.timeout(180)
def test_start_fence_keeps_a_late_host_from_crashing_in_mpi_init(tmp_path):
    """Open MPI 5 crashes a rank inside MPI_Init when a rank of another host sends before
    it has set up MPI_COMM_WORLD (hpcdist.runtime.pmix). Host 1's rank hears 1 s late that
    MPI_Init's fences are complete (late_fence.c); host 2's rank sends at once."""
    compiler = shutil.which("cc") or shutil.which("gcc")
    assert compiler, "a C compiler builds the LD_PRELOAD library of this test"
    late = tmp_path / "late_fence.so"
    command = [compiler, "-shared", "-fPIC", "-o", str(late), str(HERE / "late_fence.c"), "-ldl"]
    build = subprocess.run([*command, "-lpthread"], capture_output=True, text=True, check=False)
    assert build.returncode == 0, build.stderr
    script = ("from hpcdist.runtime import mpi; c = mpi().COMM_WORLD; "
              "print('sum', c.allreduce(c.Get_rank() + 1), flush=True)")

    def step(fence: str) -> subprocess.CompletedProcess:
        env = job_env({"LD_PRELOAD": str(late), "LATE_FENCE_RANK": "0", "LATE_FENCE_MS": "1000",
                       "HPCDIST_START_FENCE": fence})
        return run(["srun", "--mpi=pmix", "-N", "2", "--ntasks-per-node=1", "python", "-c", script],
                   timeout=120, env=env)

    fenced = step("1")
    assert fenced.returncode == 0 and fenced.stdout.count("sum 3") == 2, fenced.stdout[-3000:]
    unfenced = step("0")
    assert unfenced.returncode != 0 and "Segmentation fault" in unfenced.stdout, (
        "without the start fence this run crashed Open MPI 5.0.11 every time; if this MPI no "
        "longer does, the fence may be unnecessary (hpcdist.runtime.pmix):\n"
        + unfenced.stdout[-3000:]
    )


@pytest.mark.timeout(330)
def test_multinode_template_trains_digits_across_two_hosts(tmp_path):
    out = tmp_path / "job.out"
    args = ["examples/train_digits.py", "--epochs=2", "--verbose=2"]
    options = [*TWO_HOSTS, "--cpus-per-task=1"]
    job = sbatch(SLURM_DIR / "train-multinode.sbatch", args, out=out, options=options)
    info = wait(job, timeout=300, out=out)
    log = read(out)
    assert info["JobState"] == "COMPLETED" and info["ExitCode"] == "0:0", log[-4000:]
    assert info["NodeList"] == "hpcn[1-2]" and info["NumNodes"] == "2"
    assert re.search(r"^world: +4 ranks on 2 node\(s\)", log, re.M), log[:2000]
    assert re.search(r"^\d +1/2 +1 +hpcn2 ", log, re.M), log[:2000]
    assert "4 replicas, global batch 64" in log
    assert re.search(r"^test accuracy: 0\.\d+$", log, re.M), log[-2000:]


@pytest.mark.timeout(480)
def test_requeue_round_trip_across_two_hosts(tmp_path):
    log = check_requeue_round_trip(tmp_path, options=["-N", "2", "--ntasks-per-node=1"])
    assert re.search(r"^job \d+ restart 1 on hpcn\[1-2\]: resuming", log, re.M), log[-3000:]


@pytest.mark.timeout(330)
def test_scaling_sweep_and_straggler_report_across_two_hosts(tmp_path):
    """slurm/scaling.sbatch at 1 and 2 hosts (srun --mpi=pmix); then the timeline names a rank
    that sleeps 20 ms before every allreduce, with the clocks of two hosts aligned."""
    out, results = tmp_path / "job.out", tmp_path / "results"
    args = ["--iters", "3", "--batches-per-iter", "3", "--warmup", "1", "--hidden", "64"]
    job = sbatch(SLURM_DIR / "scaling.sbatch", args, out=out,
                 options=["-N", "2", "--ntasks-per-node=1", "--cpus-per-task=1"],
                 env={"OUT": str(results)})
    info = wait(job, timeout=300, out=out)
    log = read(out)
    assert info["JobState"] == "COMPLETED" and info["ExitCode"] == "0:0", log[-4000:]
    rows = json.loads((results / "scaling.json").read_text())["rows"]
    assert [(r["ranks"], r["nodes"]) for r in rows] == [(1, 1), (2, 2)], rows
    proc = run(["srun", "--mpi=pmix", *TWO_HOSTS, "-n", "4", "python",
                "benchmarks/straggler.py", "--runs", "4", "--out", str(tmp_path)], timeout=150)
    assert "straggler named correctly in 4 of 4 runs" in proc.stdout, proc.stdout[-3000:]
    result = json.loads((tmp_path / "straggler.json").read_text())
    assert result["hosts"] == ["hpcn1", "hpcn2"], result
