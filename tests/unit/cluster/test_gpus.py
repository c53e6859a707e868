"""GPU binding (hpcdist.cluster.gpus): CUDA_VISIBLE_DEVICES parsing, binding among peers."""

from __future__ import annotations

import ast
import dataclasses
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hpcdist.cluster import gpus
from hpcdist.cluster.gpus import (
    MAX_GPUS,
    MAX_TASKS,
    GPUBinding,
    bind_among_peers,
    bind_gpus,
    count_gpus,
    parse_visible_devices,
)
from hpcdist.errors import ClusterConfigError, GPUBindingError, LauncherConfigError

UUID0 = "GPU-8932f937-d72c-4106-c12f-20bd9faed9f6"
UUID1 = "GPU-2c1e6a4b-5f3d-4a2e-9c1b-7d8e9f0a1b2c"
MIG_OLD = "MIG-GPU-5c89852c-d268-c3f3-1b07-005d5ae1dc3f/7/0"
MIG_NEW = "MIG-a1b2c3d4-e5f6-5a7b-8c9d-0e1f2a3b4c5d"


def srun_task(local_rank: int, local_size: int, **extra: str) -> dict[str, str]:
    """The variables srun gives task ``local_rank`` of a one-node step of ``local_size`` tasks."""
    env = {
        "SLURM_JOB_ID": "77",
        "SLURM_STEP_ID": "0",
        "SLURM_PROCID": str(local_rank),
        "SLURM_LOCALID": str(local_rank),
        "SLURM_NODEID": "0",
        "SLURM_STEP_NUM_TASKS": str(local_size),
        "SLURM_STEP_NUM_NODES": "1",
        "SLURM_STEP_NODELIST": "g1",
        "SLURM_STEP_TASKS_PER_NODE": str(local_size),
    }
    env.update(extra)
    return env


def mpirun_rank(local_rank: int, local_size: int, **extra: str) -> dict[str, str]:
    """An Open MPI rank started by mpirun inside an sbatch script (SLURM variables inherited)."""
    env = {
        "OMPI_COMM_WORLD_RANK": str(local_rank),
        "OMPI_COMM_WORLD_SIZE": str(local_size),
        "OMPI_COMM_WORLD_LOCAL_RANK": str(local_rank),
        "OMPI_COMM_WORLD_LOCAL_SIZE": str(local_size),
        "SLURM_JOB_ID": "77",
        "SLURM_STEP_ID": "0",  # the step srun started Open MPI's daemons in
        "SLURM_PROCID": "0",
    }
    env.update(extra)
    return env


@pytest.fixture(autouse=True)
def _no_machine_probe(monkeypatch: pytest.MonkeyPatch) -> None:
    """Tests never ask the machine; a test that needs a count patches it."""

    def _fail() -> int:
        raise AssertionError("count_gpus() called although the test gave the GPUs")

    monkeypatch.setattr(gpus, "count_gpus", _fail)


# -- parse_visible_devices ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "entries"),
    [
        (None, None),
        ("", []),
        ("-1", []),
        ("NoDevFiles", []),
        ("0,1", ["0", "1"]),
        (" 0 , 1 ", ["0", "1"]),
        ("3,01", ["3", "1"]),
        (UUID0, [UUID0]),
        (f"{UUID0},{UUID1}", [UUID0, UUID1]),
        ("GPU-8932f937", ["GPU-8932f937"]),  # CUDA accepts a unique UUID prefix
        (MIG_OLD, [MIG_OLD]),
        (MIG_NEW, [MIG_NEW]),
        (f"2,{MIG_OLD}", ["2", MIG_OLD]),
        # CUDA's rule: only the devices before the first invalid entry are visible.
        ("0,1,x,2", ["0", "1"]),
        ("1,-1,2", ["1"]),
        ("0,1,", ["0", "1"]),
        ("0,0,1", ["0"]),
        ("GPU-zz", []),
        ("MIG-GPU-abc", []),
    ],
)
def test_parse_visible_devices(value: str | None, entries: list[str] | None) -> None:
    assert parse_visible_devices(value) == entries


# -- GPUBinding --------------------------------------------------------------------------


def test_binding_value_and_description() -> None:
    b = GPUBinding(("2", "3"), (0, 1), False, "CUDA_VISIBLE_DEVICES")
    assert b.cuda_visible_devices() == "2,3" and not b.shared
    assert b.describe() == "GPUs 2,3 (CUDA_VISIBLE_DEVICES), used as devices 0,1"
    cpu = GPUBinding((), (), False, "num_gpus=0")
    assert cpu.cuda_visible_devices() == ""
    assert cpu.describe() == "no GPU, CPU only (num_gpus=0)"
    kept = GPUBinding(("5",), (0,), True, "CUDA_VISIBLE_DEVICES", shared=True)
    assert kept.describe() == (
        "GPU 5 (CUDA_VISIBLE_DEVICES, kept as given, shared with other ranks), used as devices 0"
    )
    with pytest.raises(dataclasses.FrozenInstanceError):
        b.visible = ()  # type: ignore[misc]


# -- bind_among_peers: the one rule --------------------------------------------------------

FOUR = ("4", "5", "6", "7")


def peers(lists: list, **kwargs) -> list[GPUBinding]:
    """Every rank's binding for the same ``lists``."""
    return [bind_among_peers(lists, r, **kwargs) for r in range(len(lists))]


@pytest.mark.parametrize(
    ("size", "per_task", "expected"),
    [
        (1, None, [FOUR]),
        (2, None, [("4", "5"), ("6", "7")]),
        (4, None, [("4",), ("5",), ("6",), ("7",)]),
        (3, None, [("4",), ("5",), ("6",)]),  # an even share: the 4th GPU is left over
        (2, 1, [("4",), ("5",)]),
        (1, 3, [("4", "5", "6")]),
        (2, 2, [("4", "5"), ("6", "7")]),
    ],
)
def test_equal_lists_are_split_in_rank_order(
    size: int, per_task: int | None, expected: list[tuple[str, ...]]
) -> None:
    bindings = peers([FOUR] * size, gpus_per_task=per_task)
    assert [b.visible for b in bindings] == expected
    assert all(b.ordinals == tuple(range(len(b.visible))) for b in bindings)
    assert not any(b.shared for b in bindings)
    assert all(b.source == "CUDA_VISIBLE_DEVICES" for b in bindings)
    assert [b.narrowed for b in bindings] == [b.visible == FOUR for b in bindings]


@pytest.mark.parametrize(
    "lists",
    [
        [("0",), ("1",), ("2",), ("3",)],  # srun --gpus-per-task=1 -n 4
        [("0", "1"), ("2", "3")],  # srun --gpus-per-task=2, or mask_gpu:0x3,0xC
        [(UUID0,), (UUID1,)],
        [(MIG_OLD,), (MIG_NEW,)],
    ],
)
def test_distinct_lists_are_kept_whole(lists: list[tuple[str, ...]]) -> None:
    for per_task in (None, len(lists[0])):
        bindings = peers(lists, gpus_per_task=per_task)
        assert [b.visible for b in bindings] == lists
        assert all(b.narrowed and not b.shared for b in bindings)
        assert "kept as given" in bindings[0].describe()


def test_closest_groups_split_within_the_group() -> None:
    # --gpu-bind=closest, 8 GPUs over 2 NUMA domains, 3 tasks on the first, 2 on the second
    numa0, numa1 = ("0", "1", "2", "3"), ("4", "5", "6", "7")
    lists = [numa0, numa1, numa0, numa1, numa0]  # cyclic placement
    visible = [b.visible for b in peers(lists)]
    assert visible == [("0",), ("4", "5"), ("1",), ("6", "7"), ("2",)]
    assert [b.visible for b in peers(lists, gpus_per_task=1)] == [
        ("0",),
        ("4",),
        ("1",),
        ("5",),
        ("2",),
    ]


def test_unset_lists_are_the_hosts_gpus() -> None:
    bindings = peers([None, None], num_gpus=4)
    assert [b.visible for b in bindings] == [("0", "1"), ("2", "3")]
    assert bindings[0].source == "num_gpus=4"
    # an unset list and the same ordinals written out are the same GPUs: one group
    assert bind_among_peers([None, ("0", "1", "2", "3")], 1, num_gpus=4).visible == ("2", "3")
    assert bind_among_peers([None], 0, num_gpus=2).visible == ("0", "1")


def test_unset_lists_count_the_machine_once(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = []
    monkeypatch.setattr(gpus, "count_gpus", lambda: calls.append(1) or 2)
    b = bind_among_peers([None, None], 1)
    assert b.visible == ("1",) and b.source == "count_gpus()" and calls == [1]
    # with every list given, the machine is not asked
    assert bind_among_peers([("3",), ("4",)], 0).visible == ("3",) and calls == [1]


@pytest.mark.parametrize(("n", "size"), [(1, 4), (3, 4), (2, 3), (1, 2)])
def test_too_few_without_gpus_per_task_are_shared_round_robin(n: int, size: int) -> None:
    entries = tuple(str(i + 2) for i in range(n))
    bindings = peers([entries] * size)
    assert [b.visible for b in bindings] == [(entries[r % n],) for r in range(size)]
    assert all(b.shared for b in bindings)
    assert "shared with other ranks" in bindings[0].describe()
    # unset and counted: the same rule, no error either
    assert [b.visible for b in peers([None] * size, num_gpus=n)] == [
        (str(r % n),) for r in range(size)
    ]


def test_too_few_for_an_explicit_gpus_per_task_names_the_numbers_and_fixes() -> None:
    with pytest.raises(GPUBindingError) as info:
        bind_among_peers([None] * 4, 0, gpus_per_task=2, num_gpus=6)
    message = str(info.value)
    assert "4 ranks on this host see the same 6 GPU(s) (num_gpus=6) and need 8" in message
    assert "run at most 3 rank(s) per node" in message
    assert "gpus_per_task=1" in message and "srun --gpus-per-task=2" in message
    assert isinstance(info.value, ClusterConfigError)
    with pytest.raises(GPUBindingError, match="see the same 1 GPU") as info:
        bind_among_peers([("3",)] * 2, 1, gpus_per_task=1)
    assert "gpus_per_task=None to let them share" in str(info.value)


def test_a_group_of_one_with_too_few_for_gpus_per_task() -> None:
    with pytest.raises(GPUBindingError, match="this rank sees only 1 GPU") as info:
        bind_among_peers([("0",), ("1",)], 1, gpus_per_task=2)
    assert "gpus_per_task=1" in str(info.value) and "--gpus-per-task=2" in str(info.value)
    # its own list longer than asked: the first entries
    assert bind_among_peers([("0", "1"), ("2", "3")], 1, gpus_per_task=1).visible == ("2",)


@pytest.mark.parametrize("lists", [[()] * 2, [None, None]])
def test_no_gpu_is_a_cpu_binding(lists: list) -> None:
    for b in peers(lists, num_gpus=0):
        assert b.visible == () and b.ordinals == () and b.narrowed and not b.shared
        assert "CPU only" in b.describe()
    with pytest.raises(GPUBindingError, match="gpus_per_task=1 was asked for, but no GPU"):
        bind_among_peers(lists, 0, gpus_per_task=1, num_gpus=0)


def test_gpus_per_task_zero_hides_the_gpus() -> None:
    b = bind_among_peers([("0", "1")] * 2, 1, gpus_per_task=0)
    assert b.visible == () and b.cuda_visible_devices() == "" and not b.narrowed
    assert bind_among_peers([()], 0, gpus_per_task=0).narrowed  # nothing to hide


def test_mig_devices_one_per_rank() -> None:
    assert [b.visible for b in peers([(MIG_OLD, MIG_NEW)] * 2)] == [(MIG_OLD,), (MIG_NEW,)]
    assert bind_among_peers([(MIG_OLD, MIG_NEW)], 0, gpus_per_task=1).visible == (MIG_OLD,)
    for lists, rank, per_task in (
        ([(MIG_OLD, MIG_NEW)], 0, None),
        ([(MIG_OLD, MIG_NEW, "0", "1")] * 2, 0, 2),
    ):
        with pytest.raises(GPUBindingError, match="only one MIG device") as info:
            bind_among_peers(lists, rank, gpus_per_task=per_task)
        assert "2 MIG devices" in str(info.value) and "gpus_per_task=1" in str(info.value)
    # one MIG device next to a whole GPU is left to CUDA
    assert bind_among_peers([(MIG_NEW, "1")], 0).visible == (MIG_NEW, "1")


@pytest.mark.parametrize(
    ("lists", "rank", "kwargs", "match"),
    [
        ([], 0, {}, "lists has 0 entries"),
        ("0,1", 0, {}, "lists must be a sequence"),
        (None, 0, {}, "lists must be a sequence"),
        (["0,1"], 0, {}, r"lists\[0\]"),
        ([[0, 1]], 0, {}, r"lists\[0\]"),
        ([("0",)], 1, {}, "rank 1 is not below"),
        ([("0",)], -1, {}, "rank"),
        ([("0",)], True, {}, "rank"),
        ([("0",)], 0, {"gpus_per_task": -1}, "gpus_per_task"),
        ([("0",)], 0, {"gpus_per_task": 1.5}, "gpus_per_task"),
        ([None], 0, {"num_gpus": -3}, "num_gpus"),
        ([None], 0, {"num_gpus": MAX_GPUS + 1}, "num_gpus"),
    ],
)
def test_bad_peer_arguments(lists: object, rank: object, kwargs: dict, match: str) -> None:
    with pytest.raises(GPUBindingError, match=match):
        bind_among_peers(lists, rank, **kwargs)  # type: ignore[arg-type]


# -- bind_gpus: one process guessing its peers' lists -------------------------------------


@pytest.mark.parametrize(
    ("local_rank", "local_size", "per_task", "expected"),
    [
        (0, 4, None, ("4",)),
        (3, 4, None, ("7",)),
        (1, 2, None, ("6", "7")),
        (1, 2, 1, ("5",)),
        (1, 2, 2, ("6", "7")),
        (0, 1, None, FOUR),
        (0, 1, 3, ("4", "5", "6")),
    ],
)
def test_without_evidence_every_rank_is_assumed_to_see_the_same_list(
    local_rank: int, local_size: int, per_task: int | None, expected: tuple[str, ...]
) -> None:
    for env in (
        {"CUDA_VISIBLE_DEVICES": "4,5,6,7"},
        srun_task(local_rank, local_size, CUDA_VISIBLE_DEVICES="4,5,6,7"),
        srun_task(local_rank, local_size, CUDA_VISIBLE_DEVICES="4,5,6,7", SLURM_GPUS_ON_NODE="4"),
        srun_task(local_rank, local_size, CUDA_VISIBLE_DEVICES="4,5,6,7", SLURM_GPU_BIND="none"),
    ):
        b = bind_gpus(local_rank, local_size, gpus_per_task=per_task, environ=env)
        assert b.visible == expected and b.source == "CUDA_VISIBLE_DEVICES"


def test_unset_cuda_visible_devices_splits_the_host() -> None:
    assert bind_gpus(2, 4, gpus_per_task=2, environ={}, num_gpus=8).visible == ("4", "5")
    assert bind_gpus(1, 2, environ={}, num_gpus=4).visible == ("2", "3")
    assert bind_gpus(0, 2, environ={}, num_gpus=0).visible == ()


@pytest.mark.parametrize("local_rank", range(4))
def test_srun_gpus_per_task_1_n_4_keeps_each_tasks_own_gpu(local_rank: int) -> None:
    # srun --gpus-per-task=1 -n 4 on a 4-GPU node: each task sees its own GPU, and
    # SLURM_STEP_GPUS is rewritten to it; SLURM_GPUS_ON_NODE still counts the node's 4.
    env = srun_task(
        local_rank,
        4,
        CUDA_VISIBLE_DEVICES=str(local_rank),
        SLURM_STEP_GPUS=str(local_rank),
        SLURM_GPUS_ON_NODE="4",
    )
    for per_task in (None, 1):
        b = bind_gpus(local_rank, 4, gpus_per_task=per_task, environ=env)
        assert b.visible == (str(local_rank),) and b.narrowed and not b.shared


@pytest.mark.parametrize("local_rank", range(2))
@pytest.mark.parametrize(
    "extra",
    [
        {"SLURM_GPU_BIND": "mask_gpu:0x3,0xC"},
        {"SLURM_GPU_BIND": "verbose,map_gpu:0,1"},
        {"SLURM_GPU_BIND": "per_task:2"},
        {"SLURM_GPU_BIND": "single:1"},
        {"SLURM_TRES_BIND": "gres/gpu:mask:0x3,0xC"},
        {"SLURM_TRES_BIND": "gres/nic:closest+gres/gpu:verbose,per_task:2"},
        {"SLURM_STEP_GPUS": "0,1,2,3"},
        {"SLURM_GPUS_ON_NODE": "4"},
    ],
)
def test_srun_binding_two_per_task_keeps_two(local_rank: int, extra: dict[str, str]) -> None:
    mine = ["0,1", "2,3"][local_rank]
    env = srun_task(local_rank, 2, CUDA_VISIBLE_DEVICES=mine, **extra)
    b = bind_gpus(local_rank, 2, environ=env)
    assert b.cuda_visible_devices() == mine and b.narrowed
    assert bind_gpus(local_rank, 2, gpus_per_task=2, environ=env).cuda_visible_devices() == mine


@pytest.mark.parametrize(
    "extra",
    [
        {"SLURM_GPU_BIND": "closest"},
        {"SLURM_GPU_BIND": "none"},
        {"SLURM_TRES_BIND": "gres/nic:map:0,1"},
        {"SLURM_STEP_GPUS": "0,x"},
        {"SLURM_GPUS_ON_NODE": "2"},
        {"SLURM_GPUS_ON_NODE": "9" * 5000},
    ],
)
def test_no_evidence_of_per_task_binding(extra: dict[str, str]) -> None:
    env = srun_task(1, 2, CUDA_VISIBLE_DEVICES="2,3", **extra)
    assert bind_gpus(1, 2, environ=env).visible == ("3",)


@pytest.mark.parametrize("local_rank", range(2))
def test_binding_variables_outside_an_srun_step_are_no_evidence(local_rank: int) -> None:
    # mpirun inside sbatch: the ranks inherit the batch step's variables; srun bound nothing.
    env = mpirun_rank(
        local_rank, 2, CUDA_VISIBLE_DEVICES="0,1", SLURM_GPUS_ON_NODE="4", SLURM_GPU_BIND="single:1"
    )
    assert bind_gpus(local_rank, 2, environ=env).visible == (str(local_rank),)
    env = {"CUDA_VISIBLE_DEVICES": "0,1", "SLURM_STEP_GPUS": "0,1,2,3"}  # no step at all
    assert bind_gpus(local_rank, 2, environ=env).visible == (str(local_rank),)


def test_too_few_under_the_assumption_says_what_was_assumed() -> None:
    # each rank may really see its own pair; without evidence the fallback cannot tell
    with pytest.raises(GPUBindingError) as info:
        bind_gpus(1, 2, gpus_per_task=2, environ={"CUDA_VISIBLE_DEVICES": "2,3"})
    message = str(info.value)
    assert "2 ranks on this host see the same 2 GPU(s)" in message and "need 4" in message
    assert "assumed" in message and "bind_among_peers" in message
    # an unset list is the host's for every rank: nothing was assumed
    with pytest.raises(GPUBindingError) as info:
        bind_gpus(1, 2, gpus_per_task=2, environ={}, num_gpus=2)
    assert "assumed" not in str(info.value)


def test_one_gpu_and_four_ranks_is_the_same_whether_set_or_counted() -> None:
    set_ = [bind_gpus(r, 4, environ={"CUDA_VISIBLE_DEVICES": "0"}) for r in range(4)]
    counted = [bind_gpus(r, 4, environ={}, num_gpus=1) for r in range(4)]
    assert [b.visible for b in set_] == [b.visible for b in counted] == [("0",)] * 4
    assert all(b.shared for b in set_ + counted)
    for env, num in (({"CUDA_VISIBLE_DEVICES": "0"}, None), ({}, 1)):
        with pytest.raises(GPUBindingError, match="need 4"):
            bind_gpus(0, 4, gpus_per_task=1, environ=env, num_gpus=num)


def test_uuid_and_mig_entries() -> None:
    assert bind_gpus(1, 2, environ={"CUDA_VISIBLE_DEVICES": f"{UUID0},{UUID1}"}).visible == (UUID1,)
    b = bind_gpus(0, 2, environ={"CUDA_VISIBLE_DEVICES": f"{MIG_OLD},{MIG_NEW}"})
    assert b.visible == (MIG_OLD,) and b.cuda_visible_devices() == MIG_OLD
    with pytest.raises(GPUBindingError, match="MIG"):
        bind_gpus(0, 1, environ={"CUDA_VISIBLE_DEVICES": f"{MIG_OLD},{MIG_NEW}"})


def test_malformed_step_id_is_a_typed_error() -> None:
    env = srun_task(0, 2, CUDA_VISIBLE_DEVICES="0", SLURM_STEP_ID="x")
    with pytest.raises(LauncherConfigError, match="SLURM_STEP_ID"):
        bind_gpus(0, 2, environ=env)


@pytest.mark.parametrize(
    ("args", "kwargs"),
    [
        ((2, 2), {}),
        ((-1, 2), {}),
        ((0, 0), {}),
        ((True, 2), {}),
        ((0, 2), {"gpus_per_task": -1}),
        ((0, 2), {"gpus_per_task": 1.5}),
        ((0, 2), {"num_gpus": -3}),
    ],
)
def test_bad_arguments(args: tuple, kwargs: dict) -> None:
    with pytest.raises(GPUBindingError):
        bind_gpus(*args, environ={"CUDA_VISIBLE_DEVICES": "0,1"}, **kwargs)


# -- digit strings beyond Python's int() limit ---------------------------------------------

LONG = ["9" * 5000, "1" * 4301, "1" * 19]
LONG_IDS = ["5000-digits", "4301-digits", "19-digits"]


@pytest.mark.parametrize("digits", LONG, ids=LONG_IDS)
def test_long_ordinals_end_the_visible_list(digits: str) -> None:
    assert parse_visible_devices(f"0,{digits},2") == ["0"]
    assert parse_visible_devices(digits) == []
    assert parse_visible_devices("0" * 5000 + "7") == ["7"]
    assert bind_gpus(0, 2, environ={"CUDA_VISIBLE_DEVICES": f"3,{digits}"}).visible == ("3",)


@pytest.mark.parametrize("digits", LONG, ids=LONG_IDS)
def test_long_step_gpus_and_step_id(digits: str) -> None:
    env = srun_task(1, 4, CUDA_VISIBLE_DEVICES="0,1,2,3", SLURM_STEP_GPUS=f"0,{digits}")
    assert bind_gpus(1, 4, environ=env).visible == ("1",)
    env["SLURM_STEP_ID"] = digits
    with pytest.raises(LauncherConfigError, match="SLURM_STEP_ID"):
        bind_gpus(1, 4, environ=env)


@pytest.mark.parametrize("value", [MAX_GPUS + 1, 10**18, 10**5000], ids=["max+1", "1e18", "1e5000"])
@pytest.mark.parametrize("name", ["num_gpus", "gpus_per_task", "local_size", "local_rank"])
def test_absurd_numbers_are_binding_errors(name: str, value: int) -> None:
    args = {"local_rank": 0, "local_size": 2, "gpus_per_task": 1, "num_gpus": 4, name: value}
    if name == "local_size":
        value += MAX_TASKS
        args[name] = value
    with pytest.raises(GPUBindingError, match=name) as info:
        bind_gpus(environ={}, **args)
    assert len(str(info.value)) < 1000


# -- fuzz ----------------------------------------------------------------------------------

_NUMBERS = st.one_of(
    st.integers(0, 9).map(str), st.sampled_from(LONG), st.integers(0, 4400).map(lambda n: "0" * n)
)
_ORDINALS = st.integers(0, 9).map(str)
_GPU_LISTS = st.lists(
    st.one_of(_ORDINALS, _ORDINALS, _ORDINALS, st.sampled_from(LONG + [UUID0, MIG_NEW])),
    max_size=6,
).map(",".join)
_FUZZ_VALUES = {
    "CUDA_VISIBLE_DEVICES": st.one_of(_GPU_LISTS, st.sampled_from(["", "-1", "NoDevFiles"])),
    "SLURM_STEP_GPUS": _GPU_LISTS,
    "SLURM_GPUS_ON_NODE": _NUMBERS,
    "SLURM_GPU_BIND": st.sampled_from(["none", "closest", "per_task:1", "map_gpu:0", ""]),
    "SLURM_TRES_BIND": st.sampled_from(["gres/gpu:none", "gres/gpu:mask:0x1", "x"]),
    "SLURM_STEP_ID": st.one_of(
        st.just("0"), _NUMBERS, st.sampled_from(["batch", "x", "4294967291"])
    ),
    "SLURM_PROCID": st.one_of(st.just("0"), _NUMBERS),
    "OMPI_COMM_WORLD_RANK": _NUMBERS,
}


@settings(deadline=None, max_examples=200)
@given(
    st.sampled_from(["none", "srun", "mpirun"]),
    st.one_of(st.none(), st.lists(_ORDINALS, min_size=1, max_size=4, unique=True)),
    st.lists(st.sampled_from(sorted(_FUZZ_VALUES)), max_size=4, unique=True).flatmap(
        lambda names: st.fixed_dictionaries({n: _FUZZ_VALUES[n] for n in names})
    ),
    st.integers(1, 4),
    st.one_of(st.none(), st.integers(0, 3)),
)
def test_fuzz_bind_gpus_gives_a_binding_or_a_typed_error(
    launch: str, devices: list[str] | None, changes: dict, local_size: int, per_task: int | None
) -> None:
    """A launch environment, changed: a binding from the visible list, or a typed error."""
    env = {"none": {}, "srun": srun_task(0, 4), "mpirun": mpirun_rank(0, 4)}[launch]
    if devices is not None:
        env["CUDA_VISIBLE_DEVICES"] = ",".join(devices)
    env.update(changes)
    visible = parse_visible_devices(env.get("CUDA_VISIBLE_DEVICES"))
    pool = visible if visible is not None else ["0", "1", "2", "3"]
    for local_rank in range(local_size):
        try:
            b = bind_gpus(local_rank, local_size, per_task, env, num_gpus=4)
        except ClusterConfigError as e:  # GPUBindingError or LauncherConfigError
            assert str(e) and len(str(e)) < 2000
            continue
        assert set(b.visible) <= set(pool) and b.ordinals == tuple(range(len(b.visible)))
        assert per_task is None or len(b.visible) == per_task
        assert sum(e.startswith("MIG-") for e in b.visible) <= 1


@st.composite
def host_lists(draw: st.DrawFn) -> tuple[list[tuple[str, ...] | None], int]:
    """What the ranks of one host saw, as a scheduler can lay it out.

    The host's GPUs are cut into disjoint lists (per-task or per-NUMA binding);
    each rank saw one of them, or (all ranks alike) nothing was set.
    """
    n_gpus = draw(st.integers(0, 8))
    host = [str(i) for i in range(n_gpus)]
    size = draw(st.integers(1, 6))
    if draw(st.booleans()):
        return [None] * size, n_gpus
    cuts = sorted(draw(st.lists(st.integers(0, n_gpus), max_size=3)))
    parts = [tuple(host[a:b]) for a, b in zip([0, *cuts], [*cuts, n_gpus], strict=True)]
    return [draw(st.sampled_from(parts)) for _ in range(size)], n_gpus


@settings(deadline=None, max_examples=200)
@given(host_lists(), st.one_of(st.none(), st.integers(0, 3)))
def test_fuzz_peers_never_share_a_gpu_unless_marked(
    case: tuple[list[tuple[str, ...] | None], int], per_task: int | None
) -> None:
    lists, n_gpus = case
    resolved = [tuple(str(i) for i in range(n_gpus)) if x is None else x for x in lists]
    bindings: dict[int, GPUBinding] = {}
    for rank in range(len(lists)):
        try:
            bindings[rank] = bind_among_peers(lists, rank, per_task, num_gpus=n_gpus)
        except GPUBindingError as e:
            assert per_task, e  # only an explicit request can fail here
            group = resolved.count(resolved[rank])
            assert len(resolved[rank]) < group * per_task
            if resolved[rank]:
                assert f"{len(resolved[rank])} GPU" in str(e)
            else:
                assert "no GPU is visible" in str(e)
    for r, b in bindings.items():
        assert set(b.visible) <= set(resolved[r])
        assert per_task is None or not resolved[r] or len(b.visible) == per_task
        if per_task is None and resolved[r]:
            assert b.visible  # no rank that sees GPUs is left without one
        for s, c in bindings.items():
            if s == r or not set(b.visible) & set(c.visible):
                continue
            assert resolved[s] == resolved[r], (lists, r, s)  # never across groups
            assert b.shared and c.shared, (lists, r, s)  # within a group only when marked


# -- count_gpus ----------------------------------------------------------------------------

_SMI = """GPU 0: NVIDIA A100-SXM4-40GB (UUID: GPU-8932f937-d72c-4106-c12f-20bd9faed9f6)
  MIG 3g.20gb     Device  0: (UUID: MIG-a1b2c3d4-e5f6-5a7b-8c9d-0e1f2a3b4c5d)
  MIG 3g.20gb     Device  1: (UUID: MIG-b1b2c3d4-e5f6-5a7b-8c9d-0e1f2a3b4c5d)
GPU 1: NVIDIA A100-SXM4-40GB (UUID: GPU-2c1e6a4b-5f3d-4a2e-9c1b-7d8e9f0a1b2c)
"""


@pytest.fixture
def real_count(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.undo()  # restore the real count_gpus
    monkeypatch.setattr(gpus.importlib.util, "find_spec", lambda name: None)
    count_gpus.cache_clear()
    yield monkeypatch
    count_gpus.cache_clear()  # forget the faked machine


def test_count_with_nvidia_smi(real_count: pytest.MonkeyPatch) -> None:
    calls = []

    def run(cmd, **kwargs):
        calls.append((cmd, kwargs))
        return subprocess.CompletedProcess(cmd, 0, stdout=_SMI, stderr="")

    real_count.setattr(gpus.shutil, "which", lambda name: "/usr/bin/nvidia-smi")
    real_count.setattr(gpus.subprocess, "run", run)
    assert count_gpus() == 2
    assert calls[0][0] == ["/usr/bin/nvidia-smi", "-L"] and calls[0][1]["timeout"] <= 10


@pytest.mark.parametrize(
    "failure",
    [
        subprocess.TimeoutExpired("nvidia-smi", 5),
        OSError("exec format error"),
        RuntimeError("anything else"),
    ],
)
def test_count_never_raises(real_count: pytest.MonkeyPatch, failure: Exception) -> None:
    def run(cmd, **kwargs):
        raise failure

    real_count.setattr(gpus.shutil, "which", lambda name: "/usr/bin/nvidia-smi")
    real_count.setattr(gpus.subprocess, "run", run)
    assert count_gpus() == 0


def test_count_is_asked_once_per_process(real_count: pytest.MonkeyPatch) -> None:
    calls = []

    def run(cmd, **kwargs):
        calls.append(cmd)
        return subprocess.CompletedProcess(cmd, 0, stdout=_SMI, stderr="")

    real_count.setattr(gpus.shutil, "which", lambda name: "/usr/bin/nvidia-smi")
    real_count.setattr(gpus.subprocess, "run", run)
    assert count_gpus() == count_gpus() == 2 and len(calls) == 1
    count_gpus.cache_clear()
    assert count_gpus() == 2 and len(calls) == 2


def test_count_without_nvidia_smi_or_cupy(real_count: pytest.MonkeyPatch) -> None:
    real_count.setattr(gpus.shutil, "which", lambda name: None)
    assert count_gpus() == 0


def test_count_falls_back_to_cupy_in_a_child(real_count: pytest.MonkeyPatch) -> None:
    commands = []

    def run(cmd, **kwargs):
        commands.append(cmd)
        return subprocess.CompletedProcess(cmd, 0, stdout="3\n", stderr="")

    real_count.setattr(gpus.shutil, "which", lambda name: None)
    real_count.setattr(gpus.importlib.util, "find_spec", lambda name: object())
    real_count.setattr(gpus.glob, "glob", lambda pattern: ["/dev/nvidia0"] * ("nvidia" in pattern))
    real_count.setattr(gpus.subprocess, "run", run)
    assert count_gpus() == 3
    assert commands[0][0] == sys.executable and "getDeviceCount" in commands[0][-1]


def test_count_without_a_gpu_driver_starts_no_cupy_child(real_count: pytest.MonkeyPatch) -> None:
    def run(cmd, **kwargs):
        raise AssertionError(f"no GPU driver's device file, yet {cmd} ran")

    seen = []
    real_count.setattr(gpus.shutil, "which", lambda name: None)
    real_count.setattr(gpus.importlib.util, "find_spec", lambda name: object())
    real_count.setattr(gpus.glob, "glob", lambda pattern: seen.append(pattern) or [])
    real_count.setattr(gpus.subprocess, "run", run)
    assert count_gpus() == 0
    assert seen == list(gpus.GPU_DEVICE_FILES)


def test_module_imports_only_the_standard_library() -> None:
    tree = ast.parse(Path(gpus.__file__).read_text())
    imported = set()
    for node in tree.body:
        if isinstance(node, ast.Import):
            imported |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            imported.add(node.module.split(".")[0])
    assert imported - {"hpcdist", "__future__"} <= set(sys.stdlib_module_names)
    # hpcdist's own modules it imports are pure too: no MPI, no CuPy, no subprocess of theirs
    seen: set[str] = set()
    todo = ["hpcdist.cluster.gpus"]
    while todo:
        module = todo.pop()
        path = Path(gpus.__file__).parents[2] / (module.replace(".", "/") + ".py")
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("hpcdist"):
                if node.module not in seen:
                    seen.add(node.module)
                    todo.append(node.module)
            elif isinstance(node, (ast.Import, ast.ImportFrom)):
                if isinstance(node, ast.Import):
                    top = {a.name.split(".")[0] for a in node.names}
                else:
                    top = {(node.module or "").split(".")[0]}
                assert top - {"", "__future__"} <= set(sys.stdlib_module_names), (module, top)
    assert seen <= {
        "hpcdist.errors",
        "hpcdist.cluster.envparse",
        "hpcdist.cluster.launchers",
        "hpcdist.cluster.hostlist",
    }, seen


# -- apply_binding: binding twice gives the same GPUs ----------------------------------------


def test_apply_binding_records_the_value_from_before() -> None:
    env = {"CUDA_VISIBLE_DEVICES": "4,5,6,7"}
    first = bind_gpus(1, 4, environ=env)
    gpus.apply_binding(first, env)
    assert env["CUDA_VISIBLE_DEVICES"] == "5"
    assert gpus.visible_devices_before_binding(env) == "4,5,6,7"
    again = bind_gpus(1, 4, environ=env)
    assert again == first
    gpus.apply_binding(again, env)
    assert env["CUDA_VISIBLE_DEVICES"] == "5" and env[gpus.BEFORE_MARK] == "4,5,6,7"


def test_apply_binding_from_unset() -> None:
    env: dict[str, str] = {}
    gpus.apply_binding(bind_gpus(3, 4, environ=env, num_gpus=4), env)
    assert env["CUDA_VISIBLE_DEVICES"] == "3" and gpus.BEFORE_MARK not in env
    assert gpus.visible_devices_before_binding(env) is None
    assert bind_gpus(3, 4, environ=env, num_gpus=4).visible == ("3",)


def test_a_value_changed_after_binding_wins() -> None:
    env = {"CUDA_VISIBLE_DEVICES": "0,1"}
    gpus.apply_binding(bind_gpus(0, 2, environ=env), env)
    env["CUDA_VISIBLE_DEVICES"] = "6,7"
    assert gpus.visible_devices_before_binding(env) == "6,7"
    assert bind_gpus(1, 2, environ=env).visible == ("7",)
    assert env[gpus.BEFORE_MARK] == "0,1"  # stale, and ignored
