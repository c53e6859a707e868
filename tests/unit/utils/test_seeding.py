"""``hd.utils.set_random_seed``: Python, NumPy and hpcdist's own draws repeat after it."""

from __future__ import annotations

import random

import numpy as np
import pytest

import hpcdist as hd
from hpcdist.nn import Dense, Dropout, Sequential
from hpcdist.utils import seeding


@pytest.fixture(autouse=True)
def _forget_the_seed():
    yield
    seeding._seed = None  # other tests expect fresh entropy


def _draws() -> tuple:
    order = list(hd.data.Dataset.range(20).shuffle(20).as_numpy_iterator())
    return random.random(), float(np.random.random()), seeding.next_seed(), tuple(order)


def test_every_generator_repeats_after_the_same_seed():
    hd.utils.set_random_seed(5)
    first = _draws()
    hd.utils.set_random_seed(5)
    assert _draws() == first
    hd.utils.set_random_seed(6)
    assert _draws()[0] != first[0] and _draws()[3] != first[3]
    assert hd.utils.get_random_seed() == 6


def test_without_a_seed_dataset_shuffles_differ():
    assert seeding.next_seed() is None
    orders = {tuple(hd.data.Dataset.range(30).shuffle(30).as_numpy_iterator()) for _ in range(3)}
    assert len(orders) > 1


@pytest.mark.parametrize("bad", [1.5, "3", True, None])
def test_a_seed_that_is_not_an_integer_is_refused(bad):
    with pytest.raises(TypeError, match="integer seed"):
        hd.utils.set_random_seed(bad)


def test_a_seed_out_of_range_is_refused():
    with pytest.raises(ValueError, match=r"0 <= seed < 2\*\*32"):
        hd.utils.set_random_seed(-1)


def _fit_history() -> dict:
    rng = np.random.default_rng(1)
    x = rng.normal(size=(96, 6)).astype(np.float32)
    y = (x[:, 0] > x[:, 1]).astype(np.int64)
    model = Sequential([Dense(12, activation="relu", input_shape=(6,)), Dropout(0.3), Dense(2)])
    model.compile(optimizer="adam", loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    return model.fit(x, y, batch_size=16, epochs=3, shuffle=True, verbose=0).history


def test_two_seeded_fits_give_bit_identical_histories():
    hd.utils.set_random_seed(11)
    first = _fit_history()
    hd.utils.set_random_seed(11)
    assert _fit_history() == first  # weights, dropout masks and the shuffle all repeat
    hd.utils.set_random_seed(12)
    assert _fit_history() != first


def test_list_files_shuffles_alike_after_the_same_seed(tmp_path):
    for i in range(12):
        (tmp_path / f"f{i:02d}.npy").write_bytes(b"")
    pattern = str(tmp_path / "*.npy")

    def order() -> list:
        return list(hd.data.Dataset.list_files(pattern, shuffle=True).as_numpy_iterator())

    hd.utils.set_random_seed(4)
    first = order()
    assert len(first) == 12 and sorted(first) != first  # shuffled (fixed seed: deterministic)
    hd.utils.set_random_seed(4)
    assert order() == first
    hd.utils.set_random_seed(5)
    assert order() != first
