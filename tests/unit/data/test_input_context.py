"""InputContext, InputOptions and InputReplicationMode: TF's values, defaults and errors."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from hpcdist.data.input_context import (
    InputContext,
    InputOptions,
    InputReplicationMode,
    check_input_options,
)


def test_input_context_defaults_are_one_pipeline_one_replica():
    ctx = InputContext()
    assert (ctx.num_input_pipelines, ctx.input_pipeline_id, ctx.num_replicas_in_sync) == (1, 0, 1)
    assert ctx.get_per_replica_batch_size(5) == 5


@pytest.mark.parametrize(
    ("replicas", "global_batch", "per_replica"),
    [(1, 7, 7), (2, 8, 4), (4, 64, 16), (8, 8, 1), (3, 0, 0), (6, 36, 6)],
)
def test_per_replica_batch_size_divides(replicas, global_batch, per_replica):
    ctx = InputContext(num_replicas_in_sync=replicas)
    assert ctx.get_per_replica_batch_size(global_batch) == per_replica
    assert ctx.get_per_replica_batch_size(np.int64(global_batch)) == per_replica


@pytest.mark.parametrize(("replicas", "global_batch"), [(2, 7), (4, 6), (3, 8), (8, 4)])
def test_per_replica_batch_size_not_divisible_raises(replicas, global_batch):
    ctx = InputContext(2, 1, replicas)
    with pytest.raises(ValueError, match=f"{global_batch} is not divisible by .*{replicas}"):
        ctx.get_per_replica_batch_size(global_batch)


def test_per_replica_batch_size_needs_an_int():
    with pytest.raises(TypeError, match="global_batch_size must be an int"):
        InputContext().get_per_replica_batch_size(4.0)


def test_input_context_str_and_repr_name_the_pipeline():
    ctx = InputContext(4, 2, 8)
    assert str(ctx) == "hpcdist.InputContext(input pipeline id 2, total: 4)"
    assert repr(ctx) == (
        "InputContext(num_input_pipelines=4, input_pipeline_id=2, num_replicas_in_sync=8)"
    )


@pytest.mark.parametrize(
    ("args", "error", "match"),
    [
        ((0, 0, 1), ValueError, "num_input_pipelines must be >= 1"),
        ((2, 2, 1), ValueError, "input_pipeline_id is 2 but there are only 2"),
        ((2, -1, 1), ValueError, "input_pipeline_id must be >= 0"),
        ((1, 0, 0), ValueError, "num_replicas_in_sync must be >= 1"),
        ((1.5, 0, 1), TypeError, "num_input_pipelines must be an int"),
        ((True, 0, 1), TypeError, "num_input_pipelines must be an int"),
    ],
)
def test_input_context_rejects_bad_arguments(args, error, match):
    with pytest.raises(error, match=match):
        InputContext(*args)


def test_input_options_defaults_follow_tf():
    o = InputOptions()
    assert o.experimental_fetch_to_device is True  # None means True, as in TF
    assert o.experimental_replication_mode is InputReplicationMode.PER_WORKER
    assert o.experimental_place_dataset_on_device is False
    assert o.experimental_per_replica_buffer_size == 1


def test_input_options_accept_mode_names_and_are_frozen():
    o = InputOptions(experimental_replication_mode="PER_REPLICA")
    assert o.experimental_replication_mode is InputReplicationMode.PER_REPLICA
    with pytest.raises(dataclasses.FrozenInstanceError):
        o.experimental_fetch_to_device = False  # type: ignore[misc]
    assert InputOptions(experimental_fetch_to_device=False).experimental_fetch_to_device is False


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"experimental_replication_mode": "PER_HOST"}, ValueError, "PER_WORKER or"),
        ({"experimental_fetch_to_device": "yes"}, TypeError, "fetch_to_device must be a bool"),
        ({"experimental_place_dataset_on_device": 1}, TypeError, "must be a bool"),
        ({"experimental_per_replica_buffer_size": -1}, ValueError, "must be >= 0"),
        ({"experimental_per_replica_buffer_size": 1.0}, TypeError, "must be an int"),
    ],
)
def test_input_options_reject_bad_values(kwargs, error, match):
    with pytest.raises(error, match=match):
        InputOptions(**kwargs)


def test_replication_mode_values_are_tf_names():
    assert [m.value for m in InputReplicationMode] == ["PER_WORKER", "PER_REPLICA"]


def test_check_input_options_defaults_and_type():
    assert check_input_options(None, from_function=False) == InputOptions()
    with pytest.raises(TypeError, match="InputOptions"):
        check_input_options({"experimental_fetch_to_device": True}, from_function=True)


def test_per_replica_mode_only_for_datasets_from_function():
    o = InputOptions(experimental_replication_mode=InputReplicationMode.PER_REPLICA)
    with pytest.raises(NotImplementedError, match="distribute_datasets_from_function"):
        check_input_options(o, from_function=False)
    assert check_input_options(o, from_function=True) is o


def test_place_dataset_on_device_needs_per_replica_without_fetch():
    on_device = {"experimental_place_dataset_on_device": True}
    with pytest.raises(ValueError, match="needs experimental_replication_mode"):
        check_input_options(InputOptions(**on_device), from_function=True)
    with pytest.raises(ValueError, match="experimental_fetch_to_device=False"):
        check_input_options(
            InputOptions(experimental_replication_mode="PER_REPLICA", **on_device),
            from_function=True,
        )
    ok = InputOptions(
        experimental_replication_mode="PER_REPLICA", experimental_fetch_to_device=False, **on_device
    )
    assert check_input_options(ok, from_function=True) is ok
