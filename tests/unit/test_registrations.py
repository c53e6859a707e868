"""The inversions of docs/architecture.md: what upper layers register with lower ones.

Each lower layer reaches the layer above through a registration point; ``import
hpcdist`` fills them all, and an empty one raises ``NotRegisteredError`` naming
what to import.
"""

from __future__ import annotations

import importlib

import numpy as np
import pytest

import hpcdist as hd
from hpcdist.checkpoint.state import ModelState, WeightsOwner, adapt
from hpcdist.errors import NotRegisteredError

cluster_mpi = importlib.import_module("hpcdist.cluster.mpi")
runtime_mpi = importlib.import_module("hpcdist.runtime.mpi")  # hpcdist.runtime.mpi is a function
input_pipeline = importlib.import_module("hpcdist.distribute.input_pipeline")
context = importlib.import_module("hpcdist.distribute.context")
dataset = importlib.import_module("hpcdist.data.dataset")


def test_import_hpcdist_fills_every_registration_point() -> None:
    assert cluster_mpi._mpi_provider is runtime_mpi.mpi
    assert type(input_pipeline.input_pipeline()).__name__ == "DataInputPipeline"
    assert type(context.default_strategy()).__name__ == "DefaultStrategy"
    assert dataset._node("BatchDataset").__module__ == "hpcdist.data.transform_nodes"
    assert hd.nn.metrics.get("precision").__class__.__name__ == "Precision"


def test_the_strategy_layer_distributes_datasets_through_the_provider() -> None:
    s = hd.MirroredStrategy(["/cpu:0", "/cpu:1"])
    ds = s.experimental_make_numpy_dataset(np.arange(4.0)).batch(2)
    batches = [s.experimental_local_results(b) for b in s.experimental_distribute_dataset(ds)]
    assert [[float(x[0]) for x in b] for b in batches] == [[0.0, 1.0], [2.0, 3.0]]


def test_empty_registration_points_say_what_to_import(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cluster_mpi, "_mpi_provider", None)
    with pytest.raises(NotRegisteredError, match="hpcdist.runtime"):
        cluster_mpi.MPIClusterResolver(environ={})  # no launcher variables, no comm
    monkeypatch.setattr(input_pipeline, "_provider", None)
    with pytest.raises(NotRegisteredError, match="import hpcdist.data"):
        hd.MirroredStrategy(["/cpu:0"]).experimental_make_numpy_dataset([1, 2])
    monkeypatch.setattr(context, "_default", [])
    monkeypatch.setattr(context, "_default_class", [])
    with pytest.raises(NotRegisteredError, match="hpcdist.distribute"):
        context.default_strategy()
    with pytest.raises(NotRegisteredError, match="NoSuchDataset"):
        dataset._node("NoSuchDataset")
    assert issubclass(NotRegisteredError, RuntimeError)


def test_checkpoint_adapts_any_weights_owner_without_knowing_nn() -> None:
    class Weights:  # not an hpcdist.nn.Model
        def __init__(self) -> None:
            self.weights = [hd.Variable(np.zeros(2))]

        def get_weights(self) -> list[np.ndarray]:
            return [w.numpy() for w in self.weights]

        def set_weights(self, values: list[np.ndarray]) -> None:
            for w, v in zip(self.weights, values, strict=True):
                w.assign(v)

    owner = Weights()
    assert isinstance(owner, WeightsOwner) and isinstance(adapt(owner), ModelState)
    model = hd.nn.Sequential([hd.nn.Dense(2, input_shape=(3,))])
    model.build((None, 3))
    assert isinstance(adapt(model), ModelState)
    with pytest.raises(TypeError, match="cannot track"):
        adapt(object())
