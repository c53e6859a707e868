"""Fuzzing the cluster resolvers: any environment gives a working resolver or a typed error.

Every resolver is built from an ``environ`` dict. Whatever the variables hold
(``TF_CONFIG`` text, ``SLURM_*`` hostlists and task counts, the variables of
the MPI launchers, GPU lists), building a resolver and asking it everything it
answers must either work or raise a :class:`~hpcdist.errors.ClusterConfigError`
subclass with a readable message: never a ``KeyError``, ``IndexError``,
``TypeError``, ``AttributeError``, ``RecursionError``, ``OverflowError``,
``MemoryError`` or a JSON error. A resolver that does come up is checked
against an independent rebuild of the layout from the same variables.

No MPI is started here: environments without launcher variables (where the
MPI resolver would ask MPI itself) are resolved only through
:func:`~hpcdist.cluster.detect.describe_environment`, and the launch check's
MPI library name is patched.
"""

from __future__ import annotations

import json
import string
from collections import Counter
from collections.abc import Callable, Mapping
from typing import Any
from unittest import mock

import pytest
from hypothesis import HealthCheck, assume, event, given, settings
from hypothesis import strategies as st

from hpcdist.cluster import (
    MPIClusterResolver,
    SlurmClusterResolver,
    TFConfigClusterResolver,
    compress_hostlist,
    describe_environment,
    detect_launcher,
    detect_scheduler,
    expand_hostlist,
    expand_tasks_per_node,
    resolve,
    roles,
)
from hpcdist.cluster.launchers import find_launcher, slurm_step_id
from hpcdist.errors import ClusterConfigError, LaunchError

pytestmark = pytest.mark.timeout(180)  # a regression that hangs fails instead

FUZZ = settings(
    deadline=None,
    max_examples=300,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
#: A message longer than this quotes a whole variable instead of a short piece of it.
MAX_MESSAGE = 3000


def typed(fn: Callable[[], Any], allowed: tuple[type[BaseException], ...] = ()) -> Any:
    """``fn()``, or ``None`` when it raised a typed configuration error with a good message."""
    try:
        return fn()
    except (ClusterConfigError, *allowed) as e:
        text = str(e)
        assert text.strip(), f"{type(e).__name__} without a message"
        assert len(text) < MAX_MESSAGE, f"{type(e).__name__} message of {len(text)} characters"
        return None


# -- values ----------------------------------------------------------------------------------

_NUMBERS = st.one_of(
    st.integers(0, 12),
    st.integers(-3, 2**70),
    st.sampled_from([2**31 - 1, 2**32, 2**63 - 1, 2**63, 2**64, 10**18, 10**19, 10**400]),
).map(str)
_ODD = st.sampled_from(
    [
        "", " ", "x", "-1", "1.0", "1e3", "0x10", " 3 ", "+2", "٣", "²", "1_000", "nan", "inf",
        "\x00", "\udcff", "0" * 30 + "1", "9" * 5000, "[", "]", "(x2)", "2(x0)", "2(x)",
        "1(x1000000000000)", "batch", "extern", "4294967291", "4294967296", "n[1-3]",
    ]
)
_TEXT = st.text(alphabet=string.printable + "٣²\u00a0\u2028é", max_size=30)
VALUES = st.one_of(_NUMBERS, _ODD, _TEXT)


@st.composite
def hostnames(draw: st.DrawFn) -> list[str]:
    """Distinct host names whose numbers cross a digit boundary now and then (n9, n10)."""
    prefix = draw(st.sampled_from(["n", "node", "gpu-", "r1n", "c"]))
    width = draw(st.sampled_from([0, 2, 3]))
    numbers = draw(st.lists(st.integers(0, 120), min_size=1, max_size=6, unique=True))
    suffix = draw(st.sampled_from(["", "", "-ib"]))
    return [f"{prefix}{n:0{width}d}{suffix}" for n in numbers]


def _tasks_string(counts: list[int]) -> str:
    """SLURM's ``2(x3),1`` form of a list of per-node counts."""
    runs: list[list[int]] = []
    for c in counts:
        if runs and runs[-1][0] == c:
            runs[-1][1] += 1
        else:
            runs.append([c, 1])
    return ",".join(str(c) if n == 1 else f"{c}(x{n})" for c, n in runs)


def test_tasks_string_helper() -> None:
    assert _tasks_string([2, 2, 2, 1]) == "2(x3),1"
    assert expand_tasks_per_node(_tasks_string([1, 3, 3, 0])) == [1, 3, 3, 0]


_HOSTLIST_PIECES = st.sampled_from(
    ["n", "node", "[", "]", "-", ",", "0", "1", "9", "10", "01", "99", "[1-3]", "[01-02,5]",
     "[3-1]", "[]", "[,]", "[1-999999999999]", " ", "ib", "[0-9][0-9]", "x"]
)
RAW_HOSTLISTS = st.lists(_HOSTLIST_PIECES, max_size=10).map("".join)
_TASKS_PIECES = st.sampled_from(["1", "2", "0", "(x2)", "(x0)", "(x", ")", ",", "x", " ", "12"])
RAW_TASKS = st.lists(_TASKS_PIECES, max_size=8).map("".join)


# -- hostlists and task counts -------------------------------------------------------------


@FUZZ
@given(st.one_of(RAW_HOSTLISTS, VALUES))
def test_hostlist_strings_expand_or_raise_slurm_errors(text: str) -> None:
    hosts = typed(lambda: expand_hostlist(text))
    if hosts is not None:
        assert all(isinstance(h, str) and h for h in hosts)
        if all("," not in h and "[" not in h and "]" not in h for h in hosts) and not any(
            c.isspace() for h in hosts for c in h
        ):
            assert expand_hostlist(compress_hostlist(hosts)) == hosts


@FUZZ
@given(st.one_of(RAW_TASKS, VALUES))
def test_tasks_per_node_strings_expand_or_raise_slurm_errors(text: str) -> None:
    counts = typed(lambda: expand_tasks_per_node(text))
    if counts is not None:
        assert counts and all(isinstance(c, int) and c >= 0 for c in counts)
        # independent reading: N or N(xM), comma separated
        expected: list[int] = []
        for item in text.split(","):
            item = item.strip()
            n, _, rep = item.partition("(x")
            expected += [int(n)] * (int(rep.rstrip(")")) if rep else 1)
        assert counts == expected


# -- TF_CONFIG -------------------------------------------------------------------------------

_JOB_NAMES = st.sampled_from(["chief", "worker", "ps", "evaluator", "master", "", " ", "w\x00"])
_INDICES = st.one_of(
    st.integers(-2, 4),
    st.sampled_from([2**31, 2**63, 10**30, 10**5000]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from(["0", "1", "01", " 2", "-1", "x", "1e3", "99999999999999999999", ""]),
    st.none(),
    st.booleans(),
    st.lists(st.integers(0, 2), max_size=2),
    st.dictionaries(st.text(max_size=3), st.integers(0, 2), max_size=2),
)
_ADDRESSES = st.one_of(
    st.sampled_from(["h:2222", "a:1", "b:1", "", "[::1]:80"]),
    st.integers(0, 3),
    st.none(),
    st.lists(st.just("a:1"), max_size=2),
)
_TASK_LISTS = st.one_of(
    st.lists(_ADDRESSES, max_size=4),
    st.dictionaries(st.one_of(st.sampled_from(["0", "1", "5", "x", "-1", "1e2", "9" * 25,
                                               "1000000", "2147483648", "٣"])), _ADDRESSES,
                    max_size=3),
    _ADDRESSES,
)
TF_CONFIGS = st.fixed_dictionaries(
    {},
    optional={
        "cluster": st.one_of(st.dictionaries(_JOB_NAMES, _TASK_LISTS, max_size=4), _ADDRESSES),
        "task": st.one_of(
            st.fixed_dictionaries(
                {}, optional={"type": st.one_of(_JOB_NAMES, _INDICES), "index": _INDICES}
            ),
            _INDICES,
        ),
        "rpc_layer": st.one_of(st.sampled_from(["grpc", "", "grpc+verbs"]), _INDICES),
        "session_master": st.one_of(st.sampled_from(["", "grpc://m:1"]), _INDICES),
        "environment": st.one_of(st.sampled_from(["", "cloud", "google"]), _INDICES),
    },
)


@st.composite
def valid_tf_configs(draw: st.DrawFn) -> dict[str, Any]:
    """A TF_CONFIG that TF accepts: a multi-worker cluster and one of its tasks."""
    cluster: dict[str, Any] = {}
    for job, most in (("chief", 1), ("worker", 4), ("ps", 3), ("evaluator", 1)):
        n = draw(st.integers(0, most))
        if n == 0:
            continue
        addresses = [f"{job}{i}.example:{2222 + i}" for i in range(n)]
        if job == "ps" and draw(st.booleans()):
            cluster[job] = {str(i * 3 + 1): a for i, a in enumerate(addresses)}
        else:
            cluster[job] = addresses
    config: dict[str, Any] = {"cluster": cluster}
    tasks = [(j, int(i)) for j, t in cluster.items() for i in (t if isinstance(t, dict)
                                                                else range(len(t)))]
    if tasks and draw(st.integers(0, 5)):
        job, index = draw(st.sampled_from(tasks))
        config["task"] = {"type": job, "index": draw(st.sampled_from([index, str(index)]))}
    for key in ("rpc_layer", "session_master", "environment"):
        if draw(st.integers(0, 3)) == 0:
            config[key] = draw(st.sampled_from(["grpc", "", "cloud"]))
    return config


def _json_text(value: Any) -> str:
    try:
        return json.dumps(value)
    except ValueError:  # an integer json cannot print (more than 4300 digits)
        return '{"task": {"type": "worker", "index": ' + "9" * 5000 + "}}"


TF_TEXTS = st.one_of(
    valid_tf_configs().map(_json_text),
    valid_tf_configs().map(_json_text),
    TF_CONFIGS.map(_json_text),
    st.tuples(TF_CONFIGS.map(_json_text), st.integers(1, 30)).map(lambda t: t[0][: -t[1]]),
    st.sampled_from(
        [
            "[" * 100_000 + "]" * 100_000,
            '{"cluster": ' * 5000 + "1" + "}" * 5000,
            '{"task": {"type": "worker", "index": 1e999}}',
            '{"task": {"type": "worker", "index": NaN}}',
            '{"cluster": {"worker": ["a:1"]}, "cluster": {}}',
            '{"task": {"type": "worker", "index": -0.0}, "cluster": {"worker": ["a:1"]}}',
            '{"cluster": {"ps": {"5000000": "p:1"}}, "task": {"type": "ps", "index": 5000000}}',
            '{"cluster": {"ps": {"2147483647": "p:1", "0": "q:1"}}}',
            '"\\ud800"',
            "\ufeff{}",
        ]
    ),
    VALUES,
)


def _exercise(resolver: Any) -> None:
    """Ask a resolver everything TF's resolvers answer; only typed errors may come out."""
    spec = typed(resolver.cluster_spec)
    typed(lambda: resolver.master())
    typed(lambda: resolver.master(rpc_layer="grpc"))
    typed(lambda: resolver.num_accelerators())
    assert isinstance(resolver.environment, str)
    task_type, task_id = resolver.task_type, resolver.task_id
    if spec is None:
        return
    dense = typed(spec.as_dict)
    for job in spec.jobs:
        indices = spec.task_indices(job)
        assert len(indices) == spec.num_tasks(job)
        for i in indices[:3]:
            assert isinstance(spec.task_address(job, i), str)
            typed(lambda job=job, i=i: resolver.master(job, i, rpc_layer="grpc"))
        tasks = typed(lambda job=job: spec.job_tasks(job))
        if tasks is not None:
            assert [i for i, a in enumerate(tasks) if a is not None] == indices
    if dense is not None:
        assert typed(lambda: type(spec)(dense)) == spec
    for rule in (
        roles.is_chief,
        roles.id_in_cluster,
        roles.collective_leader,
        roles.should_save_checkpoint,
    ):
        typed(lambda rule=rule: rule(spec, task_type, task_id))
    typed(lambda: roles.worker_count(spec, task_type))


@FUZZ
@given(
    TF_TEXTS,
    st.one_of(st.none(), st.none(), _JOB_NAMES, st.integers(0, 2)),
    st.one_of(st.none(), st.none(), st.integers(-1, 3), st.sampled_from([True, 2**64, 1.0, "0"])),
    st.one_of(st.none(), st.none(), st.sampled_from(["grpc", ""]), st.integers(0, 1)),
)
def test_tf_config_gives_a_resolver_or_a_tf_config_error(
    text: str, task_type: Any, task_id: Any, rpc_layer: Any
) -> None:
    env = {"TF_CONFIG": text, "CUDA_VISIBLE_DEVICES": "0,1"}
    resolver = typed(
        lambda: TFConfigClusterResolver(
            task_type=task_type, task_id=task_id, rpc_layer=rpc_layer, environ=env
        )
    )
    event(f"TF_CONFIG resolver: {'built' if resolver is not None else 'refused'}")
    if resolver is None:
        return
    _exercise(resolver)
    spec = resolver.cluster_spec()
    if resolver.task_type is not None and resolver.task_type != "evaluator" and spec:
        assert resolver.task_type in spec.jobs
        if resolver.task_id is not None:
            assert resolver.task_id in spec.task_indices(resolver.task_type)
    assert resolver.num_accelerators() == {"GPU": 2}


# -- SLURM -----------------------------------------------------------------------------------

_DISTRIBUTIONS = st.sampled_from(
    ["block", "cyclic", "cyclic:block", "block:cyclic,Pack", "plane=2", "plane=1", "plane",
     "plane=0", "plane=x", "arbitrary", "*", "", "CYCLIC", "fcyclic", "plane=99999999999999999999"]
)
SLURM_VARS = (
    "SLURM_JOB_ID", "SLURM_JOBID", "SLURM_STEP_ID", "SLURM_STEPID", "SLURM_PROCID",
    "SLURM_LOCALID", "SLURM_NODEID", "SLURM_NTASKS", "SLURM_NPROCS", "SLURM_STEP_NUM_TASKS",
    "SLURM_STEP_NUM_NODES", "SLURM_JOB_NUM_NODES", "SLURM_NNODES", "SLURM_STEP_NODELIST",
    "SLURM_JOB_NODELIST", "SLURM_NODELIST", "SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE",
    "SLURM_JOB_CPUS_PER_NODE", "SLURM_DISTRIBUTION", "SLURM_DIST_PLANESIZE", "SLURM_HET_SIZE",
    "SLURM_PACK_SIZE", "SLURM_JOB_NODELIST_HET_GROUP_0", "SLURM_JOB_NODELIST_HET_GROUP_1",
    "SLURM_GPUS_PER_TASK", "SLURM_GPUS_ON_NODE", "SLURM_STEP_GPUS", "SLURM_GPU_BIND",
    "SLURM_TRES_BIND", "SLURM_MPI_TYPE", "CUDA_VISIBLE_DEVICES",
    "HPCDIST_BOUND_CUDA_VISIBLE_DEVICES", "HPCDIST_CUDA_VISIBLE_DEVICES_BEFORE",
)
LAUNCHER_VARS = (
    "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
    "OMPI_COMM_WORLD_LOCAL_SIZE", "OMPI_COMM_WORLD_NODE_RANK", "PMI_RANK", "PMI_SIZE",
    "PMI_LOCAL_SIZE", "PMIX_RANK", "MPI_LOCALRANKID", "MPI_LOCALNRANKS", "PALS_RANKID",
    "PALS_LOCAL_RANKID", "PALS_NODEID", "PALS_LOCAL_SIZE", "MV2_COMM_WORLD_RANK",
    "MV2_COMM_WORLD_SIZE", "MV2_COMM_WORLD_LOCAL_RANK", "MV2_COMM_WORLD_LOCAL_SIZE",
    "JSM_NAMESPACE_RANK", "JSM_NAMESPACE_SIZE", "JSM_NAMESPACE_LOCAL_RANK",
    "JSM_NAMESPACE_LOCAL_SIZE", "FLUX_JOB_ID", "FLUX_TASK_RANK", "FLUX_TASK_LOCAL_ID",
    "FLUX_JOB_SIZE", "FLUX_JOB_NNODES", "PBS_JOBID", "PBS_NP", "PBS_NUM_NODES", "LSB_JOBID",
    "LSB_DJOB_NUMPROC", "HPCDIST_SKIP_LAUNCH_CHECK",
)
_GPU_VALUES = st.sampled_from(
    ["0", "0,1", "0,1,2,3", "", "-1", "NoDevFiles", "GPU-8932f937-d72c", "0,0", "x,1", "3,2",
     "2", "a100:2", "volta:3,kepler:1", "a100:", "map_gpu:0,1", "per_task:1", "closest",
     "gres/gpu:per_task:1", "99999999999999999999"]
)


@st.composite
def slurm_steps(draw: st.DrawFn) -> tuple[dict[str, str], list[str], list[int], bool]:
    """A consistent srun step (hosts, counts, this task's rank), then maybe broken a little."""
    hosts = draw(hostnames())
    counts = draw(st.lists(st.integers(1, 4) | st.integers(0, 4), min_size=len(hosts),
                           max_size=len(hosts)))
    total = sum(counts)
    env = {
        "SLURM_JOB_ID": "77",
        "SLURM_STEP_ID": draw(st.sampled_from(["0"] * 6 + ["3", "batch", "4294967291"])),
        "SLURM_PROCID": str(draw(st.integers(0, max(total - 1, 0)) | st.integers(0, total + 1))),
        "SLURM_STEP_NUM_TASKS": str(total),
        "SLURM_NTASKS": str(total),
        "SLURM_STEP_NUM_NODES": str(len(hosts)),
        draw(st.sampled_from(["SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST"])): (
            compress_hostlist(hosts) if draw(st.booleans()) else ",".join(hosts)
        ),
        draw(st.sampled_from(["SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE"])): (
            _tasks_string(counts) if draw(st.booleans()) else ",".join(map(str, counts))
        ),
    }
    if draw(st.booleans()):
        env["SLURM_DISTRIBUTION"] = draw(st.sampled_from(["block", "cyclic", "plane=2"])
                                         | _DISTRIBUTIONS)
        if draw(st.booleans()):
            env["SLURM_DIST_PLANESIZE"] = draw(st.one_of(st.sampled_from(["1", "2", "3"]), VALUES))
    if draw(st.integers(0, 4)) == 0 and len(hosts) > 1:
        cut = draw(st.integers(1, len(hosts) - 1))
        env["SLURM_HET_SIZE"] = "2"
        env["SLURM_JOB_NODELIST_HET_GROUP_0"] = compress_hostlist(hosts[:cut])
        env["SLURM_JOB_NODELIST_HET_GROUP_1"] = compress_hostlist(hosts[cut:])
    for name in draw(st.lists(st.sampled_from(["CUDA_VISIBLE_DEVICES", "SLURM_GPUS_PER_TASK",
                                               "SLURM_STEP_GPUS", "SLURM_GPU_BIND"]),
                              max_size=3, unique=True)):
        env[name] = draw(st.sampled_from(["0", "0,1", "0,1,2,3", "1"]) | _GPU_VALUES)
    intact = "SLURM_HET_SIZE" not in env
    if draw(st.integers(0, 2)) == 0:  # break it: overwrite some variables, delete others
        intact = False
        env.update(draw(st.dictionaries(st.sampled_from(SLURM_VARS), st.one_of(
            VALUES, RAW_HOSTLISTS, RAW_TASKS, _GPU_VALUES, _DISTRIBUTIONS), max_size=3)))
        for name in draw(st.lists(st.sampled_from(sorted(env)), max_size=2, unique=True)):
            del env[name]
    if draw(st.integers(0, 5)) == 0:
        env.update(draw(st.dictionaries(st.sampled_from(LAUNCHER_VARS), VALUES, max_size=3)))
    return env, hosts, counts, intact


_JOBS = st.one_of(
    st.none(),
    st.dictionaries(st.sampled_from(["worker", "ps", "chief", "", "evaluator"]),
                    st.one_of(st.integers(-1, 6), st.sampled_from([True, 2.0, "1", None, 2**64])),
                    max_size=3),
    st.sampled_from([[], "worker", {1: 2}]),
)
_PORTS = st.one_of(st.sampled_from([8888, 1, 65535, 65530]),
                   st.sampled_from([0, -1, 2**64, True, "8888", 8888.0, None]))
_GPU_ARGS = st.one_of(st.none(), st.integers(0, 8), st.sampled_from([-1, True, 2**40, 1.5, "2"]))
_TPN = st.one_of(
    st.none(), st.integers(0, 3), st.sampled_from([True, "2", 2.0, 2**64]),
    st.dictionaries(st.sampled_from(["n1", "n10", "node01", "c5"]),
                    st.one_of(st.integers(-1, 3), st.just("1")), max_size=3),
)


def _slurm_order(hosts: list[str], counts: list[int], kind: str, plane: int) -> list[str]:
    """The host of each rank: block fills node after node; cyclic/plane deal chunks in turn."""
    if kind == "block":
        out: list[str] = []
        for host, count in zip(hosts, counts, strict=True):
            out += [host] * count
        return out
    left = list(counts)
    out = []
    chunk = 1 if kind == "cyclic" else plane
    while sum(left):
        for i, host in enumerate(hosts):
            take = min(chunk, left[i])
            out += [host] * take
            left[i] -= take
    return out


def _mostly_none(strategy: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return st.one_of(st.none(), st.none(), st.none(), strategy)


@FUZZ
@given(
    slurm_steps(),
    _mostly_none(_JOBS),
    st.just(8888) | _PORTS,
    _mostly_none(_GPU_ARGS),
    _mostly_none(_GPU_ARGS),
    _mostly_none(_TPN),
    st.booleans(),
)
def test_slurm_step_gives_a_resolver_or_a_config_error(
    case: tuple[dict[str, str], list[str], list[int], bool],
    jobs: Any,
    port_base: Any,
    gpus_per_node: Any,
    gpus_per_task: Any,
    tasks_per_node: Any,
    auto_set_gpu: bool,
) -> None:
    env, hosts, counts, intact = case
    before = dict(env)
    resolver = typed(
        lambda: SlurmClusterResolver(
            jobs=jobs,
            port_base=port_base,
            gpus_per_node=gpus_per_node,
            gpus_per_task=gpus_per_task,
            tasks_per_node=tasks_per_node,
            auto_set_gpu=auto_set_gpu,
            environ=env,
        )
    )
    event(f"slurm resolver: {'built' if resolver is not None else 'refused'}")
    if resolver is None:
        return
    _exercise(resolver)
    rank = int(before["SLURM_PROCID"])
    assert resolver.rank == rank < resolver.num_tasks == len(resolver.task_hosts)
    host = resolver.task_hosts[rank]
    assert resolver.local_size == resolver.task_hosts.count(host)
    assert resolver.local_rank == resolver.task_hosts[:rank].count(host)
    spec = resolver.cluster_spec()
    assert sum(spec.num_tasks(j) for j in spec.jobs) == resolver.num_tasks
    assert resolver.master(rpc_layer="grpc").startswith(f"grpc://{host}:")
    # every (host, port) pair is given to one task only
    addresses = [a for j in spec.jobs for a in spec.as_dict()[j]]
    assert len(set(addresses)) == len(addresses)
    assert Counter(a.rsplit(":", 1)[0] for a in addresses) == Counter(resolver.task_hosts)
    if intact and tasks_per_node is None:
        assert resolver.hosts == hosts
        dist = before.get("SLURM_DISTRIBUTION", "block").split(":")[0].split(",")[0].lower()
        kind = {"": "block", "*": "block"}.get(dist, dist)
        plane = 0
        if kind.startswith("plane"):
            plane = int(kind.split("=")[1]) if "=" in kind else int(before["SLURM_DIST_PLANESIZE"])
            kind = "plane"
        assert resolver.task_hosts == _slurm_order(hosts, counts, kind, plane)


# -- launchers, detection and resolve ----------------------------------------------------------


@st.composite
def launcher_environments(draw: st.DrawFn) -> dict[str, str]:
    """Launcher, scheduler and SLURM variables, mostly consistent and sometimes not."""
    size = draw(st.integers(1, 6))
    rank = draw(st.integers(0, size))
    local = draw(st.integers(0, size))
    kind = draw(st.sampled_from(["ompi", "hydra", "pals", "flux", "jsrun", "mv2", "pmix", "pmi",
                                 "none"]))
    env: dict[str, str] = {}
    if kind == "ompi":
        env.update(OMPI_COMM_WORLD_RANK=str(rank), OMPI_COMM_WORLD_SIZE=str(size),
                   OMPI_COMM_WORLD_LOCAL_RANK=str(local), OMPI_COMM_WORLD_LOCAL_SIZE=str(size))
    elif kind == "hydra":
        env.update(PMI_RANK=str(rank), PMI_SIZE=str(size), MPI_LOCALRANKID=str(local),
                   MPI_LOCALNRANKS=str(size))
    elif kind == "pals":
        env.update(PALS_RANKID=str(rank), PMI_SIZE=str(size), PALS_LOCAL_RANKID=str(local),
                   PALS_NODEID="0", PBS_JOBID="9.pbs")
    elif kind == "flux":
        env.update(FLUX_JOB_ID="f1", FLUX_TASK_RANK=str(rank), FLUX_JOB_SIZE=str(size),
                   FLUX_TASK_LOCAL_ID=str(local), FLUX_JOB_NNODES=draw(st.sampled_from("012")))
    elif kind == "jsrun":
        env.update(JSM_NAMESPACE_RANK=str(rank), JSM_NAMESPACE_SIZE=str(size), LSB_JOBID="5")
    elif kind == "mv2":
        env.update(MV2_COMM_WORLD_RANK=str(rank), MV2_COMM_WORLD_SIZE=str(size))
    elif kind == "pmix":
        env.update(PMIX_RANK=str(rank), SLURM_NTASKS=str(size))
    elif kind == "pmi":
        env.update(PMI_RANK=str(rank), PMI_SIZE=str(size))
    if draw(st.booleans()):  # inside a SLURM allocation
        env.update(SLURM_JOB_ID="12", SLURM_PROCID=str(draw(st.integers(0, size))),
                   SLURM_NTASKS=str(size), SLURM_JOB_NODELIST="n[1-2]",
                   SLURM_TASKS_PER_NODE=draw(st.sampled_from(["1", "2(x2)", str(size)])))
        if draw(st.booleans()):
            env["SLURM_STEP_ID"] = draw(st.sampled_from(["0", "batch", "x", "4294967295"]))
    env.update(draw(st.dictionaries(st.sampled_from(LAUNCHER_VARS + SLURM_VARS), VALUES,
                                    max_size=4)))
    if draw(st.integers(0, 3)) == 0:
        env["TF_CONFIG"] = draw(TF_TEXTS)
    return env


@FUZZ
@given(launcher_environments(), st.integers(1, 6))
def test_launch_detection_gives_answers_or_config_errors(env: dict[str, str], world: int) -> None:
    info = typed(lambda: detect_launcher(env))
    if info is not None:
        assert 0 <= info.rank < info.size
        if info.local_rank is not None and info.local_size is not None:
            assert 0 <= info.local_rank < info.local_size <= info.size
        assert find_launcher(env) is not None
    typed(lambda: slurm_step_id(env))
    scheduler = typed(lambda: detect_scheduler(env))
    if scheduler is not None:
        assert scheduler.num_tasks is None or scheduler.num_tasks >= 0
    described = describe_environment(env)  # documented never to raise
    if described["resolver"] is None:
        assert described["error"]
    from hpcdist.runtime import checks

    with mock.patch.object(checks, "_library", return_value="Open MPI v5 (fuzz)"):
        typed(lambda: checks.check_launch(world, environ=env), allowed=(LaunchError,))


@FUZZ
@given(launcher_environments(), _JOBS, _PORTS, st.sampled_from([None, "grpc"]), st.data())
def test_resolve_gives_a_resolver_or_a_config_error(
    env: dict[str, str], jobs: Any, port_base: Any, rpc_layer: Any, data: st.DataObject
) -> None:
    info = typed(lambda: detect_launcher(env))
    tf_config = env.get("TF_CONFIG", "").strip()
    assume(tf_config or info is not None)  # otherwise MPI itself would be asked
    size = info.size if info is not None else 1
    size = size if size <= 8 else 1  # a huge world gets a host list that does not fit
    hosts = data.draw(
        st.one_of(
            st.lists(st.sampled_from(["a", "b", "n10"]), min_size=size, max_size=size),
            st.lists(st.sampled_from(["a", "", 3]), max_size=size + 1),
        )
    )
    kwargs: dict[str, Any] = {"hosts": hosts, "rpc_layer": rpc_layer, "port_base": port_base}
    if jobs is not None:
        kwargs["jobs"] = jobs
    resolver = typed(lambda: resolve(dict(env), **kwargs))
    event(f"resolve: {type(resolver).__name__}")
    if resolver is None:
        return
    _exercise(resolver)
    if isinstance(resolver, MPIClusterResolver):
        assert info is not None and (resolver.rank, resolver.size) == (info.rank, info.size)
        spec = resolver.cluster_spec()
        assert sum(spec.num_tasks(j) for j in spec.jobs) == size
        own = spec.task_address(resolver.task_type, resolver.task_id)
        assert own.rsplit(":", 1)[0] == hosts[info.rank]


def test_resolve_without_tf_config_or_launcher_is_not_fuzzed_into_mpi() -> None:
    """The guard above: with neither, resolve() would start MPI, which this file never does."""
    assert detect_launcher({"SLURM_JOB_ID": "1"}) is None
    assert describe_environment({})["resolver"] == "MPIClusterResolver"


@pytest.mark.parametrize(
    "env",
    [
        {"TF_CONFIG": "[" * 200_000},
        {"TF_CONFIG": '{"task": {"type": "worker", "index": ' + "9" * 5000 + "}}"},
        {"SLURM_JOB_ID": "1", "SLURM_STEP_ID": "0", "SLURM_PROCID": "0",
         "SLURM_STEP_NODELIST": "n[0-999999]", "SLURM_STEP_TASKS_PER_NODE": "1(x1000000)",
         "SLURM_STEP_NUM_TASKS": "999999"},
        {"SLURM_JOB_ID": "1", "SLURM_STEP_ID": "0", "SLURM_PROCID": "0",
         "SLURM_STEP_NODELIST": "n[1-2]", "SLURM_STEP_TASKS_PER_NODE": "9999999999(x2)"},
        {"SLURM_JOB_ID": "1", "SLURM_STEP_ID": "0", "SLURM_PROCID": "0",
         "SLURM_STEP_NODELIST": "n[1-2]", "SLURM_STEP_TASKS_PER_NODE": "1(x2)",
         "SLURM_HET_SIZE": "99999999999999999"},
    ],
    ids=["deep-json", "huge-index", "million-nodes-disagree", "huge-counts", "huge-het-size"],
)
@pytest.mark.timeout(60)
def test_extreme_values_fail_fast_and_typed(env: Mapping[str, str]) -> None:
    if "TF_CONFIG" in env:
        resolver = typed(lambda: TFConfigClusterResolver(environ=env))
    else:
        resolver = typed(lambda: SlurmClusterResolver(environ=dict(env), gpus_per_node=0))
    assert resolver is None


_STEP = {"SLURM_JOB_ID": "1", "SLURM_STEP_ID": "0", "SLURM_PROCID": "0"}
_MANY_JOBS = {f"j{i}": ["a:1"] for i in range(100_000)}


@pytest.mark.parametrize(
    "make",
    [
        lambda: SlurmClusterResolver(
            environ={**_STEP, "SLURM_STEP_NODELIST": "n[0-99999]"},
            tasks_per_node={"x": 1},
            gpus_per_node=0,
        ),
        lambda: SlurmClusterResolver(
            environ={
                **_STEP,
                "SLURM_STEP_NODELIST": "n[0-99999]",
                "SLURM_STEP_TASKS_PER_NODE": "1(x100000)",
                "SLURM_HET_SIZE": "0" * 5000 + "2",
                "SLURM_JOB_NODELIST_HET_GROUP_0": "n0",
                "SLURM_JOB_NODELIST_HET_GROUP_1": "n1",
            },
            gpus_per_node=0,
        ),
        lambda: TFConfigClusterResolver(
            environ={"TF_CONFIG": json.dumps({"cluster": _MANY_JOBS,
                                              "task": {"type": "zz", "index": 0}})}
        ),
        lambda: TFConfigClusterResolver(
            environ={"TF_CONFIG": json.dumps({"cluster": {"worker": ["a:1"] * 100_000},
                                              "task": {"type": "worker", "index": 100_000}})}
        ),
        lambda: TFConfigClusterResolver(
            environ={"TF_CONFIG": '{"cluster": {"' + "w" * 100_000 + '": 3}}'}
        ),
        lambda: roles.validate_task(_MANY_JOBS, "worker", 0),
        lambda: roles.validate_task({"worker": ["a:1"] * 100_000}, "worker", 100_000),
        lambda: MPIClusterResolver(
            environ={"PMI_RANK": "0", "PMI_SIZE": "100000"}, hosts=["a"] * 100_000
        ),
    ],
    ids=["tasks-per-node-dict", "het-groups", "tf-jobs", "tf-task-ids", "tf-job-name",
         "roles-jobs", "roles-task-ids", "mpi-ports"],
)
def test_errors_about_huge_inputs_quote_them_short(make: Callable[[], Any]) -> None:
    """A message names the value at fault without copying a million host names into it."""
    with pytest.raises(ClusterConfigError) as info:
        make()
    assert len(str(info.value)) < 1000, str(info.value)[:300]


def test_mpi_port_error_gives_advice_that_can_be_followed() -> None:
    with pytest.raises(ClusterConfigError, match="more than the 65535 TCP ports") as info:
        MPIClusterResolver(environ={"PMI_RANK": "0", "PMI_SIZE": "70000"}, hosts=["a"] * 70_000)
    assert "port_base <= -" not in str(info.value)


def test_master_of_a_far_sparse_task() -> None:
    """A sparse job with a task index past a million still has a master (its address)."""
    config = {"cluster": {"ps": {"5000000": "p:1"}}, "task": {"type": "ps", "index": 5000000}}
    resolver = TFConfigClusterResolver(environ={"TF_CONFIG": json.dumps(config)})
    assert resolver.master(rpc_layer="grpc") == "grpc://p:1"  # TF: job_tasks has 5000001 entries
    single = {"cluster": {"ps": {"0": "p:1"}}, "task": {"type": "ps", "index": 0}}
    assert TFConfigClusterResolver(environ={"TF_CONFIG": json.dumps(single)}).master() == ""
