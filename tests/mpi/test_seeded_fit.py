"""With ``hd.utils.set_random_seed``, ``fit`` under MultiWorkerMirroredStrategy repeats bit for
bit (initial weights, shuffles, dropout masks), and every rank reports the same history."""

from __future__ import annotations

import numpy as np
import pytest

import hpcdist as hd
from hpcdist.nn import Dense, Dropout, Sequential
from hpcdist.utils import seeding

pytestmark = pytest.mark.mpi(min_size=2)


@pytest.fixture(autouse=True)
def _forget_the_seed():
    yield
    seeding._seed = None


def _seeded_history(seed: int, dropout: bool) -> dict:
    hd.utils.set_random_seed(seed)
    rng = np.random.default_rng(1)
    x = rng.normal(size=(120, 6)).astype(np.float32)
    y = (x[:, 0] > x[:, 1]).astype(np.int64)
    # the input pipeline's own shuffle has no seed: it draws from set_random_seed's stream
    data = hd.data.Dataset.from_tensor_slices((x, y)).shuffle(120).batch(24)
    strategy = hd.MultiWorkerMirroredStrategy()
    with strategy.scope():
        layers = [Dense(12, activation="relu", input_shape=(6,))]
        layers += [Dropout(0.25)] if dropout else []
        model = Sequential([*layers, Dense(2)])
        model.compile(optimizer="adam", loss="sparse_categorical_crossentropy", metrics=["acc"])
    return model.fit(data, epochs=3, verbose=0).history


@pytest.mark.parametrize("dropout", [False, True])
def test_two_seeded_fits_repeat_bit_for_bit_on_every_rank(dropout):
    first = _seeded_history(21, dropout)
    assert _seeded_history(21, dropout) == first
    comm = hd.world().comm
    assert all(h == first for h in comm.allgather(first))  # every rank reports the same
    assert _seeded_history(22, dropout) != first
