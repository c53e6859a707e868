"""``fit``/``evaluate``/``predict`` take Python lists as Keras does, refuse ragged ones with
advice, and "expected one of" lists in error messages name each choice once."""

from __future__ import annotations

import re

import numpy as np
import pytest

import hpcdist as hd
from hpcdist.nn import Dense, Sequential


def _model() -> Sequential:
    hd.utils.set_random_seed(3)
    model = Sequential([Dense(3, activation="relu", input_shape=(4,)), Dense(2)])
    model.compile(optimizer="sgd", loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    return model


@pytest.fixture(autouse=True)
def _forget_the_seed():
    from hpcdist.utils import seeding

    yield
    seeding._seed = None


def test_python_lists_train_exactly_like_arrays():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(40, 4))
    y = (x[:, 0] > 0).astype(np.int64)
    kwargs = {"batch_size": 8, "epochs": 2, "verbose": 0, "validation_split": 0.25}
    from_arrays = _model().fit(x, y, **kwargs).history
    model = _model()
    from_lists = model.fit(x.tolist(), y.tolist(), **kwargs).history
    assert from_lists == from_arrays
    assert model.evaluate(x.tolist(), y.tolist(), verbose=0) == model.evaluate(x, y, verbose=0)
    assert model.predict(x[:5].tolist(), verbose=0).shape == (5, 2)


def test_ragged_or_empty_lists_are_refused_with_advice():
    model = _model()
    with pytest.raises(ValueError, match="rows have different lengths.*pass a NumPy array"):
        model.fit([[1.0, 2.0, 3.0, 4.0], [1.0]], [0, 1], verbose=0)
    with pytest.raises(ValueError, match=r"no arrays with rows.*np\.asarray\(x\)"):
        model.fit([], [], verbose=0)


def _choices(message: str) -> list[str]:
    listed = message.split("one of ", 1)[1]
    return [c.strip() for c in re.split(r",\s*", listed) if c.strip()]


@pytest.mark.parametrize(
    "get",
    [hd.nn.metrics.get, hd.nn.losses.get, hd.nn.activations.get, hd.nn.initializers.get],
)
def test_unknown_names_list_each_choice_once(get):
    with pytest.raises(ValueError) as info:
        get("no_such_thing")
    choices = _choices(str(info.value))
    assert len(choices) > 3
    assert len(choices) == len(set(choices)), choices
