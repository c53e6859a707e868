"""hpcdist.horovod in one process, and real runs: ``python -m hpcdist.horovod`` resolving
``import horovod.torch``, the ``hpcdist run`` launcher (its command line for each case,
and the Horovod example on 2 ranks through it), start-up and the refused names."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import hpcdist.horovod.torch as hvd
from hpcdist.errors import (
    ElasticUnsupportedError,
    HorovodInternalError,
    HorovodNotInitializedError,
    LaunchError,
)
from hpcdist.launch import build_command, parse_hosts, slurm_tasks

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = """
import sys
import horovod
import horovod.torch as hvd
from horovod.common.exceptions import HorovodInternalError
import torch
assert __name__ == "__main__", __name__
assert horovod.__name__ == "hpcdist.horovod" and hvd.__name__ == "hpcdist.horovod.torch"
hvd.init()
total = hvd.allreduce(torch.tensor([1.0]), op=hvd.Sum).item()
print(f"rank {hvd.rank()} of {hvd.size()} sum {total} argv {sys.argv[1:]}", flush=True)
"""


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("OMPI_", "PMIX_", "PRTE_"))}  # the launcher sets what it needs
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    return env


def test_python_m_hpcdist_horovod_runs_an_unchanged_script(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    done = subprocess.run([sys.executable, "-m", "hpcdist.horovod", str(script), "--lr", "1"],
                          env=_env(), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "rank 0 of 1 sum 1.0 argv ['--lr', '1']" in done.stdout
    module = tmp_path / "trainmod.py"
    module.write_text(SCRIPT)
    env = _env()
    env["PYTHONPATH"] = str(tmp_path) + os.pathsep + env["PYTHONPATH"]
    done = subprocess.run([sys.executable, "-m", "hpcdist.horovod", "-m", "trainmod", "x"],
                          env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "argv ['x']" in done.stdout


def test_without_the_runner_horovod_is_not_importable() -> None:
    code = "import importlib.util, sys; print(importlib.util.find_spec('horovod'))"
    done = subprocess.run([sys.executable, "-c", code], env=_env(), capture_output=True,
                          text=True, timeout=120)
    assert done.stdout.strip() == "None"  # no Horovod installed: the alias is what resolves it


@pytest.mark.timeout(600)
def test_hpcdist_run_starts_the_horovod_example_on_2_ranks() -> None:
    cmd = [sys.executable, "-m", "hpcdist", "run", "-np", "2", "python", "-m", "hpcdist.horovod",
           "examples/horovod/pytorch_synthetic_benchmark.py", "--fp16-allreduce",
           "--num-iters", "2", "--num-batches-per-iter", "1", "--width", "8"]
    done = subprocess.run(cmd, env=_env(), cwd=ROOT, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    printed = done.stderr.split("hpcdist run: ", 1)[1].splitlines()[0]
    assert "mpirun -n 2" in printed and "--oversubscribe" in printed
    assert "OMPI_MCA_osc='^ucx'" in printed and sys.executable in printed
    assert "Number of CPUs: 2" in done.stdout
    assert re.search(r"Total img/sec on 2 CPU\(s\): [0-9.]+", done.stdout)
    assert "Weights equal on every rank: True" in done.stdout
    assert done.stdout.count("Model: CNN") == 1  # rank 0 prints


def _build(command=("python", "t.py"), np=None, hosts=None, environ=None, flavour="openmpi",
           root=False, cores=4):
    return build_command(list(command), np, hosts, environ or {}, "/v/bin/mpirun", flavour,
                         root, "/v/bin/python", cores)


def test_launcher_command_lines() -> None:
    c = _build(np=4)
    assert c.argv == ["/v/bin/mpirun", "-n", "4", "--oversubscribe", "-x", "OMP_NUM_THREADS",
                      "-x", "OMPI_MCA_osc", "/v/bin/python", "t.py"]
    assert c.env == {"OMP_NUM_THREADS": "1", "OMPI_MCA_osc": "^ucx"}
    c = _build(hosts="node1:2,node2:2")  # -np from the slots
    assert c.argv[:5] == ["/v/bin/mpirun", "-n", "4", "--host", "node1:2,node2:2"]
    assert c.env["OMP_NUM_THREADS"] == "2"  # 4 cores, 2 ranks per host
    c = _build(environ={"SLURM_NTASKS": "6", "OMP_NUM_THREADS": "3", "OMPI_MCA_osc": "sm"})
    assert c.argv[1:3] == ["-n", "6"] and c.env == {}  # the user's settings stay
    c = _build(environ={"SLURM_JOB_NUM_NODES": "2", "SLURM_NTASKS_PER_NODE": "3(x2)"})
    assert c.argv[1:3] == ["-n", "6"]
    c = _build(np=2, root=True)
    assert "--allow-run-as-root" in c.argv
    assert c.env["OMPI_ALLOW_RUN_AS_ROOT"] == c.env["OMPI_ALLOW_RUN_AS_ROOT_CONFIRM"] == "1"
    c = _build(command=("./train.sh", "--x"), np=2, hosts="a:1,b:1", flavour="mpich")
    assert c.argv == ["/v/bin/mpirun", "-n", "2", "-hosts", "a:1,b:1", "-genvlist",
                      "OMP_NUM_THREADS", "./train.sh", "--x"]
    assert "OMP_NUM_THREADS=4 /v/bin/mpirun -n 2" in c.text()
    assert parse_hosts("h1:4,h2") == [("h1", 4), ("h2", 1)]
    assert slurm_tasks({}) is None


@pytest.mark.parametrize("kw, match", [
    ({}, "how many ranks"), ({"np": 0}, ">= 1"), ({"hosts": "a:x"}, "not an int"),
    ({"hosts": ":2"}, "empty host"), ({"hosts": "a:0"}, ">= 1"), ({"command": ()}, "no command"),
])
def test_launcher_refuses_what_it_cannot_run(kw, match) -> None:
    with pytest.raises(LaunchError, match=match):
        _build(**kw)


def test_init_shutdown_and_names_before_init() -> None:
    hvd.shutdown()
    assert not hvd.is_initialized()
    with pytest.raises(HorovodNotInitializedError, match="hvd.init"):
        hvd.rank()
    with pytest.raises(HorovodNotInitializedError):
        hvd.allreduce(torch.ones(1))
    hvd.init()
    hvd.init()  # idempotent
    assert hvd.is_initialized() and (hvd.rank(), hvd.size()) == (0, 1)
    assert hvd.cross_size() == 1 and hvd.local_size() == 1 and hvd.is_homogeneous()


def test_timeline_writes_one_merged_trace(tmp_path: Path) -> None:
    hvd.init()
    path = tmp_path / "timeline.json"
    hvd.start_timeline(str(path))
    hvd.allreduce(torch.ones(4), name="x")
    hvd.stop_timeline()
    trace = json.loads(path.read_text())
    assert trace["otherData"]["hpcdist"]["ranks"] == [0]
    assert any(e.get("name") == "process_name" for e in trace["traceEvents"])


def test_refused_names_say_what_to_use() -> None:
    hvd.init()
    with pytest.raises(ElasticUnsupportedError, match="checkpoint") as info:
        hvd.elastic.run  # noqa: B018
    assert isinstance(info.value, HorovodInternalError)
    with pytest.raises(TypeError, match="to_dense"):
        hvd.sparse_allreduce_async(torch.ones(1).to_sparse())


def test_compression_follows_horovod() -> None:
    t = torch.tensor([1.0, 2.5], dtype=torch.float64)
    for comp, wire in ((hvd.Compression.fp16, torch.float16),
                       (hvd.Compression.bf16, torch.bfloat16)):
        sent, ctx = comp.compress(t)
        assert sent.dtype == wire and comp.decompress(sent, ctx).dtype == torch.float64
        ints, ctx = comp.compress(torch.ones(2, dtype=torch.int32))
        assert ints.dtype == torch.int32 and ctx is None
    assert hvd.Compression.none.compress(t)[0] is t
    hvd.init()
    got = hvd.allreduce(t, compression=hvd.Compression.fp16)
    assert got.dtype == torch.float64 and got.tolist() == [1.0, 2.5]


def test_docs_table_lists_every_name() -> None:
    page = (ROOT / "docs" / "horovod.md").read_text()
    missing = [n for n in hvd.__all__ if f"`{n}`" not in page]
    assert not missing, missing
