"""resolve(): which resolver for which environment, and describe_environment()."""

from __future__ import annotations

import importlib
import inspect
import json
import socket
from typing import Any

import pytest

from hpcdist.cluster.base import ClusterResolver, SimpleClusterResolver, detectable_resolvers
from hpcdist.cluster.detect import describe_environment, resolve
from hpcdist.cluster.mpi import MPIClusterResolver
from hpcdist.cluster.slurm import SlurmClusterResolver
from hpcdist.cluster.spec import ClusterSpec
from hpcdist.cluster.tfconfig import TFConfigClusterResolver
from hpcdist.errors import LauncherConfigError
from tests.unit.cluster.captured import fixture_ranks

BATCH = {"SLURM_JOB_ID": "101", "SLURM_NTASKS": "2", "SLURM_PROCID": "0", "SLURM_NODEID": "0"}
OMPI = {
    "OMPI_COMM_WORLD_RANK": "1",
    "OMPI_COMM_WORLD_SIZE": "2",
    "OMPI_COMM_WORLD_LOCAL_RANK": "1",
    "OMPI_COMM_WORLD_LOCAL_SIZE": "2",
    "PMIX_RANK": "1",
}
SRUN = {
    **BATCH,
    "SLURM_STEP_ID": "0",
    "SLURM_PROCID": "1",
    "SLURM_STEP_NUM_TASKS": "2",
    "SLURM_LOCALID": "1",
    "SLURM_STEP_NUM_NODES": "1",
    "SLURM_STEP_NODELIST": "n1",
    "SLURM_NODELIST": "n1",
    "SLURM_JOB_NODELIST": "n1",
    "SLURM_STEP_TASKS_PER_NODE": "2",
    "SLURM_TASKS_PER_NODE": "2",
    "SLURM_NNODES": "1",
    "SLURM_JOB_NUM_NODES": "1",
    "SLURMD_NODENAME": "n1",
}
TF_CONFIG = json.dumps(
    {"cluster": {"worker": ["a:1", "b:1"]}, "task": {"type": "worker", "index": 1}}
)


def test_plain_python_is_a_world_of_one() -> None:
    r = resolve({}, port_base=2222, rpc_layer="grpc")
    assert type(r) is MPIClusterResolver and r.launcher == "mpi"
    host = socket.gethostname().lower()
    assert r.cluster_spec().as_dict() == {"worker": [f"{host}:2222"]}
    assert (r.task_type, r.task_id, r.master()) == ("worker", 0, f"grpc://{host}:2222")
    assert r.master("worker", 0) == f"grpc://{host}:2222"


@pytest.mark.parametrize("rank", range(4))
def test_unknown_launcher_gives_every_rank_its_own_task(fake_mpi, rank: int) -> None:
    # No variables that hpcdist recognises, yet MPI's world has 4 ranks: each rank
    # must be its own task, not four copies of worker 0 that all think they are chief.
    fake_mpi(rank, ["a", "a", "b", "b"])
    r = resolve({}, jobs={"chief": 1, "worker": 3})
    assert type(r) is MPIClusterResolver
    assert (r.rank, r.size) == (rank, 4)
    assert (r.task_type, r.task_id) == (("chief", 0) if rank == 0 else ("worker", rank - 1))
    assert r.cluster_spec().num_tasks("worker") == 3


def test_describe_environment_never_starts_mpi(monkeypatch: pytest.MonkeyPatch) -> None:
    def _no_mpi() -> None:
        raise AssertionError("describe_environment started MPI")

    monkeypatch.setattr(importlib.import_module("hpcdist.runtime.mpi"), "mpi", _no_mpi)
    monkeypatch.setattr(importlib.import_module("hpcdist.cluster.mpi"), "_mpi_provider", _no_mpi)
    d = describe_environment({})
    assert d["resolver"] == "MPIClusterResolver" and d["error"] is None
    assert (d["launcher"], d["rank"], d["size"]) == (None, None, None)
    assert "from MPI itself" in d["reason"]


def test_sbatch_script_without_srun_is_a_world_of_one() -> None:
    r = resolve(BATCH)
    assert type(r) is MPIClusterResolver and (r.size, r.task_id) == (1, 0)
    d = describe_environment(BATCH)
    assert (d["launcher"], d["scheduler"], d["job_id"], d["in_step"]) == (
        None,
        "slurm",
        "101",
        False,
    )
    assert d["resolver"] == "MPIClusterResolver"


def test_tf_config_wins_over_everything() -> None:
    env = {**SRUN, **OMPI, "TF_CONFIG": TF_CONFIG}
    r = resolve(env, rpc_layer="grpc", jobs={"worker": 5})  # jobs is not TF_CONFIG's: dropped
    assert type(r) is TFConfigClusterResolver
    assert (r.task_type, r.task_id, r.master()) == ("worker", 1, "grpc://b:1")
    assert describe_environment(env)["reason"] == "TF_CONFIG is set"


def test_tf_config_wins_over_malformed_launcher_variables() -> None:
    env = {"TF_CONFIG": TF_CONFIG, "OMPI_COMM_WORLD_RANK": "bad"}
    assert type(resolve(env)) is TFConfigClusterResolver
    assert describe_environment(env)["resolver"] == "TFConfigClusterResolver"


def test_blank_tf_config_is_ignored() -> None:
    assert type(resolve({"TF_CONFIG": "  "})) is MPIClusterResolver


@pytest.mark.parametrize("extra", [{}, BATCH, SRUN], ids=["bare", "in-sbatch", "srun-daemons"])
def test_mpi_launcher_gives_mpi_resolver(extra: dict) -> None:
    env = {**extra, **OMPI}
    r = resolve(env, hosts=["n1", "n1"], jobs={"chief": 1, "worker": 1})
    assert type(r) is MPIClusterResolver
    assert (r.launcher, r.task_type, r.task_id, r.master()) == ("openmpi", "worker", 0, "n1:8889")
    d = describe_environment(env)
    assert (d["launcher"], d["rank"], d["size"], d["resolver"]) == (
        "openmpi",
        1,
        2,
        "MPIClusterResolver",
    )


def test_srun_step_gives_slurm_resolver() -> None:
    r = resolve(SRUN)
    assert isinstance(r, SlurmClusterResolver)
    assert (r.task_type, r.task_id) == ("worker", 1)


@pytest.mark.parametrize(
    ("extra", "launcher"),
    [
        ({}, "srun"),
        ({"PMIX_RANK": "1"}, "srun --mpi=pmix"),
        ({"PMI_RANK": "1", "PMI_SIZE": "2"}, "srun --mpi=pmi2"),
    ],
)
def test_srun_step_is_described_as_slurm(extra: dict, launcher: str) -> None:
    d = describe_environment({**SRUN, **extra})
    assert (d["launcher"], d["scheduler"], d["in_step"]) == (launcher, "slurm", True)
    assert d["resolver"] == "SlurmClusterResolver"
    assert "srun step 0" in d["reason"]


def test_unknown_keyword_is_a_type_error() -> None:
    with pytest.raises(TypeError, match="portbase"):
        resolve({}, portbase=1)


def test_every_resolver_takes_the_keywords_listed() -> None:
    classes = (TFConfigClusterResolver, MPIClusterResolver, SlurmClusterResolver)
    assert detectable_resolvers() == classes  # registered by class, in the order tried
    for cls in classes:
        params = set(inspect.signature(cls).parameters)
        assert cls.resolve_kwargs and cls.resolve_kwargs <= params, cls.__name__


def test_a_resolver_registers_by_class_and_is_tried_in_its_place() -> None:
    class SiteResolver(SimpleClusterResolver):
        detect_order = -1  # before TF_CONFIG
        resolve_kwargs = frozenset({"site"})

        def __init__(self, environ: Any = None, site: str = "") -> None:
            super().__init__(ClusterSpec({"worker": [f"{site}:1"]}), task_type="worker", task_id=0)

        @classmethod
        def detected(cls, environ: Any, launch: Any) -> str | None:
            return "SITE is set" if "SITE" in environ else None

    try:
        assert detectable_resolvers()[0] is SiteResolver
        r = resolve({"SITE": "1"}, site="n7", hosts=["n1"])  # hosts: MPI's, dropped here
        assert type(r) is SiteResolver and r.cluster_spec().as_dict() == {"worker": ["n7:1"]}
        assert describe_environment({"SITE": "1"})["reason"] == "SITE is set"
        assert type(resolve({})) is MPIClusterResolver  # does not fit: the next one is tried
    finally:
        ClusterResolver._registered.remove(SiteResolver)
    assert detectable_resolvers() == (
        TFConfigClusterResolver, MPIClusterResolver, SlurmClusterResolver
    )


def test_malformed_launcher_variables() -> None:
    env = {**OMPI, "OMPI_COMM_WORLD_SIZE": "1"}
    with pytest.raises(LauncherConfigError, match="OMPI_COMM_WORLD_RANK"):
        resolve(env)
    d = describe_environment(env)
    assert d["resolver"] is None and "OMPI_COMM_WORLD_RANK" in d["error"]


def test_describe_reports_malformed_scheduler_variables() -> None:
    d = describe_environment({**BATCH, "SLURM_NTASKS": "two"})
    assert "SLURM_NTASKS" in d["error"]
    assert d["resolver"] == "MPIClusterResolver"


def test_describe_reads_os_environ_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TF_CONFIG", TF_CONFIG)
    assert describe_environment()["resolver"] == "TFConfigClusterResolver"
    assert type(resolve()) is TFConfigClusterResolver


# -- captured and synthesised environments -------------------------------------------


@pytest.mark.parametrize(("fixture", "rank"), fixture_ranks())
def test_fixture_choice(fixture: dict, rank: dict) -> None:
    env = {k: v for k, v in rank["environ"].items() if k != "TF_CONFIG"}
    d = describe_environment(env)
    launcher = fixture["launcher"]
    assert d["launcher"] == launcher
    if launcher is not None and launcher.startswith("srun"):
        expected = "SlurmClusterResolver"
    else:  # a launcher's variables, or none: MPI itself gives this process's rank
        expected = "MPIClusterResolver"
    assert d["resolver"] == expected, d["reason"]
    assert d["error"] is None
    # the host names of the launch's ranks (MPI would gather them; this process is alone)
    hosts = None if d["size"] is None else ["h"] * d["size"]
    r = resolve(env, hosts=hosts)
    assert type(r).__name__ == expected
    assert (r.task_type, r.task_id) == ("worker", 0 if d["rank"] is None else d["rank"])
    if fixture["scheduler"] not in (None, "", "none"):
        assert d["scheduler"] == fixture["scheduler"]
