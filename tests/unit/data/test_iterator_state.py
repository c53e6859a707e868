"""A distributed iterator's checkpoint state puts a fresh pipeline back at the same step."""

from __future__ import annotations

import pytest

from hpcdist.data.dataset import Dataset, iteration_counts, set_iteration_count
from hpcdist.data.distributed import distribute_dataset
from hpcdist.errors import CheckpointError


def pipeline() -> Dataset:
    return Dataset.range(23).shuffle(23, seed=5).batch(4)


def rest(it) -> list[list[int]]:
    return [b.tolist() for b in it]


def steps(it) -> list:
    return [[v.tolist() for v in getattr(x, "values", (x,))] for x in it]


@pytest.mark.parametrize("replicas", [1, 2])
def test_restore_gives_the_remaining_steps_of_the_same_epoch(replicas):
    dist = distribute_dataset(pipeline(), num_replicas_per_worker=replicas)
    first_epoch = steps(dist)
    it = iter(dist)  # the second iteration: another shuffle order
    for _ in range(2):
        next(it)
    arrays, meta = it._checkpoint_state()
    assert arrays == {} and meta == {"counts": [[1]], "steps": 2, "done": False}
    expected = steps(it)

    fresh = iter(distribute_dataset(pipeline(), num_replicas_per_worker=replicas))
    fresh._restore_checkpoint_state({}, meta)
    got = steps(fresh)
    assert got == expected
    assert len(got) == len(first_epoch) - 2
    assert got != first_epoch[2:]  # the second epoch's order, not the first one's


def test_a_finished_iterator_restores_finished():
    it = iter(distribute_dataset(pipeline()))
    rest(it)
    _, meta = it._checkpoint_state()
    assert meta["done"] and meta["steps"] == 6
    fresh = iter(distribute_dataset(pipeline()))
    fresh._restore_checkpoint_state({}, meta)
    assert rest(fresh) == []


def test_state_that_does_not_fit_is_refused():
    it = iter(distribute_dataset(pipeline()))
    with pytest.raises(CheckpointError, match="does not fit"):
        it._restore_checkpoint_state({}, {"counts": [[0], [0]], "steps": 0, "done": False})
    with pytest.raises(CheckpointError, match="ended after 6 of the 99 steps"):
        it._restore_checkpoint_state({}, {"counts": [[0]], "steps": 99, "done": False})


def test_set_iteration_count_replays_an_epoch_order():
    ds = pipeline()
    epochs = [[b.tolist() for b in ds] for _ in range(3)]
    assert iteration_counts(ds) == [3]
    set_iteration_count(ds, 1)
    assert [b.tolist() for b in ds] == epochs[1]
    with pytest.raises(ValueError, match="expected an int >= 0"):
        set_iteration_count(ds, -1)
