"""The node lists and tasks-per-node strings that srun really sets, parsed by hpcdist.

Each layout runs ``env -0`` as an srun step, one output file per task
(``srun -o DIR/%t.env``), and hands every task's real environment to
hpcdist's resolver. What hpcdist makes of the ``SLURM_*`` strings must be
SLURM's own answer: ``scontrol show hostnames`` / ``show hostlist`` for the
node lists, and, for the resolver's layout, the node each task really ran on
(``SLURMD_NODENAME``) and its ``SLURM_LOCALID``. The ``vnodes`` partition
(virtual nodes vn9, vn10, vn11 of slurm/local/start.sh) gives multi-node
strings such as ``vn[9-11]`` and ``2(x2),1``.
"""

from __future__ import annotations

from collections import Counter

import pytest

from hpcdist.cluster.detect import resolve
from hpcdist.cluster.hostlist import compress_hostlist, expand_hostlist, expand_tasks_per_node
from tests.slurm.jobs import hostnames, partition_nodes, read, read_task_envs, run, sbatch, wait

LAYOUTS = {
    "one-node": ("debug", ["-n", "2"]),
    "block": ("vnodes", ["-N", "3", "-n", "5"]),
    "gap-in-range": ("vnodes", ["-w", "vn9,vn11", "-n", "3"]),
    "cyclic": ("vnodes", ["-N", "3", "-n", "5", "-m", "cyclic"]),
    "plane": ("vnodes", ["--overcommit", "-N", "2", "-n", "6", "-m", "plane=2"]),
    "uneven": ("vnodes", ["--overcommit", "-w", "vn10,vn11", "-n", "7"]),
}


def need_partition(name: str, nodes: int) -> None:
    if len(partition_nodes(name)) < nodes:
        pytest.skip(
            f"partition {name} with {nodes} usable nodes is missing (slurm/local/start.sh "
            f"makes vnodes unless HPCDIST_SLURM_VNODES=0)"
        )


def check_step(envs: list[dict[str, str]]) -> None:
    """hpcdist's view of every task of one step against SLURM's."""
    ntasks = len(envs)
    first = envs[0]
    # Node lists: hpcdist expands as scontrol does and compresses back to SLURM's string.
    for name in ("SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST"):
        value = first[name]
        assert expand_hostlist(value) == hostnames(value), name
        assert compress_hostlist(hostnames(value)) == value, name
        slurm_compressed = run(["scontrol", "show", "hostlist", ",".join(hostnames(value))])
        assert slurm_compressed.stdout.strip() == value, name
    step_nodes = hostnames(first["SLURM_STEP_NODELIST"])
    # Where each task really ran, in rank order: SLURM's truth.
    assert [int(e["SLURM_PROCID"]) for e in envs] == list(range(ntasks))
    where = [e["SLURMD_NODENAME"] for e in envs]
    per_node = Counter(where)
    counts = expand_tasks_per_node(first["SLURM_STEP_TASKS_PER_NODE"])
    assert counts == [per_node[n] for n in step_nodes]
    for procid, env in enumerate(envs):
        r = resolve(environ=dict(env), auto_set_gpu=False)
        assert type(r).__name__ == "SlurmClusterResolver"
        assert r.get_task_info() == ("worker", procid) and r.rank == procid
        assert r.num_tasks == ntasks == int(env["SLURM_STEP_NUM_TASKS"])
        assert r.hosts == step_nodes
        assert r.task_hosts == where
        assert r.local_rank == int(env["SLURM_LOCALID"])
        assert r.local_size == per_node[env["SLURMD_NODENAME"]]
        addresses = r.cluster_spec().as_dict()["worker"]
        assert [a.rsplit(":", 1)[0] for a in addresses] == where


@pytest.mark.timeout(90)
@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_srun_step_strings_are_parsed_as_slurm_does(layout: str, tmp_path) -> None:
    partition, options = LAYOUTS[layout]
    need_partition(partition, 3 if partition == "vnodes" else 1)
    ntasks = int(options[options.index("-n") + 1])
    command = ["srun", "--mpi=none", "-p", partition, *options, "-o", f"{tmp_path}/%t.env"]
    proc = run([*command, "env", "-0"], timeout=80)
    assert proc.returncode == 0, proc.stdout[-4000:]
    envs = read_task_envs(tmp_path, ntasks)
    check_step(envs)
    if layout == "block":  # the strings this test is about, as SLURM writes them
        assert envs[0]["SLURM_STEP_NODELIST"] == "vn[9-11]"
        assert envs[0]["SLURM_STEP_TASKS_PER_NODE"] == "2(x2),1"


@pytest.mark.timeout(150)
def test_step_inside_a_batch_job_uses_the_steps_nodes(tmp_path) -> None:
    """A step on 2 of the job's 3 nodes: the step's strings win over the job's."""
    need_partition("vnodes", 3)
    out = tmp_path / "job.out"
    wrap = f"srun --mpi=none -N 2 -n 3 -o {tmp_path}/%t.env env -0"
    options = ["-p", "vnodes", "-N", "3", "-n", "4", "--wrap", wrap]
    info = wait(sbatch(None, out=out, options=options), timeout=120, out=out)
    assert info["JobState"] == "COMPLETED", read(out)[-4000:]
    envs = read_task_envs(tmp_path, 3)
    check_step(envs)
    env = envs[0]
    assert env["SLURM_JOB_NODELIST"] == "vn[9-11]" and env["SLURM_STEP_NODELIST"] == "vn[9-10]"
    # Inside a step srun sets SLURM_TASKS_PER_NODE to the step's counts as well.
    assert env["SLURM_STEP_TASKS_PER_NODE"] == env["SLURM_TASKS_PER_NODE"] == "2,1"
