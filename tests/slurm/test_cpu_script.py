"""slurm/train-cpu.sbatch runs the digits job on 2 tasks through srun --mpi=pmix and mpirun.

Both jobs are submitted at once (they share the node) and each test waits for
its own. The job prints ``hpcdist info`` before training; its layout must be
SLURM's: as many ranks as tasks, on the job's nodes, as many on each node as
SLURM's tasks per node, local ranks 0..n-1.
"""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

import pytest

from tests.slurm.jobs import SLURM_DIR, hostnames, read, sbatch, wait

SCRIPT = SLURM_DIR / "train-cpu.sbatch"
LAUNCHERS = {
    # launcher: (hpcdist info's launcher line, the resolver it must pick)
    "srun": ("srun --mpi=pmix", "SlurmClusterResolver"),
    "mpirun": ("openmpi", "MPIClusterResolver"),
}


@pytest.fixture(scope="module")
def submitted(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[int, Path]]:
    """Both jobs, submitted before either test waits."""
    out_dir = tmp_path_factory.mktemp("cpu")
    jobs = {}
    for launcher in LAUNCHERS:
        out = out_dir / f"{launcher}.out"
        jobs[launcher] = (sbatch(SCRIPT, out=out, env={"LAUNCHER": launcher}), out)
    return jobs


_finished: dict[str, tuple[dict[str, str], str]] = {}


def finished(submitted: dict[str, tuple[int, Path]], launcher: str) -> tuple[dict, str]:
    """(``scontrol show job`` fields, log) of the launcher's job, once it ended."""
    if launcher not in _finished:
        job, out = submitted[launcher]
        _finished[launcher] = (wait(job, timeout=300, out=out), read(out))
    return _finished[launcher]


def expand_counts(text: str) -> list[int]:
    """SLURM's tasks-per-node syntax (``2(x3),1``), expanded here independently of hpcdist."""
    counts = []
    for item in text.split(","):
        m = re.fullmatch(r"(\d+)(?:\(x(\d+)\))?", item.strip())
        assert m, f"unexpected SLURM_TASKS_PER_NODE item {item!r}"
        counts += [int(m.group(1))] * int(m.group(2) or 1)
    return counts


@pytest.mark.timeout(330)
@pytest.mark.parametrize("launcher", list(LAUNCHERS))
def test_cpu_script_trains_digits(submitted, launcher: str) -> None:
    info, log = finished(submitted, launcher)
    assert info["JobState"] == "COMPLETED" and info["ExitCode"] == "0:0", log[-4000:]
    assert "2 replicas, global batch 64" in log, log[-4000:]
    assert log.count("Epoch 20/20") == 1, "exactly one model is trained (the chief prints)"
    accuracy = float(re.search(r"^test accuracy: ([0-9.]+)$", log, re.M).group(1))
    assert accuracy >= 0.9


@pytest.mark.timeout(330)
@pytest.mark.parametrize("launcher", list(LAUNCHERS))
def test_detected_layout_is_slurms(submitted, launcher: str) -> None:
    info, log = finished(submitted, launcher)
    assert info["JobState"] == "COMPLETED", log[-4000:]
    launcher_line, resolver = LAUNCHERS[launcher]
    assert re.search(rf"^launcher: +{re.escape(launcher_line)}$", log, re.M), log[:2000]
    assert re.search(rf"^resolver: +{resolver} ", log, re.M), log[:2000]
    assert re.search(rf"^scheduler: +slurm \(job {info['JobId']}\)$", log, re.M), log[:2000]

    # SLURM's view: the job's tasks, nodes (scontrol show hostnames) and tasks per node.
    tasks, nodes = int(info["NumTasks"]), hostnames(info["NodeList"])
    per_node = expand_counts(re.search(r"\(tasks per node: ([^)]+)\)", log).group(1))
    assert tasks == 2 and len(per_node) == len(nodes) == int(info["NumNodes"])

    # hpcdist's view: the world line and the rank table of `hpcdist info`.
    world = re.search(r"^world: +(\d+) ranks on (\d+) node\(s\)", log, re.M)
    assert world and (int(world.group(1)), int(world.group(2))) == (tasks, len(nodes)), log[:2000]
    table = log[log.index("rank  local") :].splitlines()[2 : 2 + tasks]
    rows = [line.split() for line in table]
    assert [int(r[0]) for r in rows] == list(range(tasks))
    hosts = [r[3] for r in rows]
    assert set(hosts) <= set(nodes)
    assert [Counter(hosts)[n] for n in nodes] == per_node
    for host in set(hosts):
        mine = [r for r in rows if r[3] == host]
        assert [r[1] for r in mine] == [f"{i}/{len(mine)}" for i in range(len(mine))]
        assert len({r[2] for r in mine}) == 1  # one node index per host
