"""model.save / hd.nn.load_model: architecture, weights and optimizer state in a safe format,
restored in one process and on another number of ranks; training continues exactly."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import hpcdist as hd
from hpcdist.errors import CheckpointError
from hpcdist.nn import (
    BatchNormalization,
    Dense,
    Dropout,
    Embedding,
    Flatten,
    Input,
    Layer,
    LayerNormalization,
    Sequential,
    load_model,
    losses,
    metrics,
    regularizers,
)
from tests.faults.launch import run_mpi

HERE = Path(__file__).parent


def dense_model(dropout=False):
    np.random.seed(0)
    model = Sequential([
        Input((4,)),
        Dense(8, activation="leaky_relu", kernel_regularizer=regularizers.l1_l2(0.01, 0.01),
              dtype="float64"),
        BatchNormalization(dtype="float64"),
        *([Dropout(0.25, seed=3)] if dropout else []),
        LayerNormalization(dtype="float64"),
        Dense(3, activation="softmax", dtype="float64"),
    ], name="classifier")  # fmt: skip
    model.compile(
        optimizer=hd.optimizers.Nadam(0.01, global_clipnorm=5.0),
        loss=losses.SparseCategoricalCrossentropy(),
        metrics=["accuracy", metrics.SparseTopKCategoricalAccuracy(k=2, name="top2"),
                 "sparse_categorical_crossentropy"],
    )  # fmt: skip
    return model


def data(seed=1):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(48, 4))
    return x, (x[:, 0] > 0).astype(np.int64) + (x[:, 1] > 0.5).astype(np.int64)


def assert_same_state(a, b):
    assert [v.name for v in a.weights] == [v.name for v in b.weights]
    for u, v in zip(a.weights, b.weights, strict=True):
        np.testing.assert_array_equal(u.numpy(), v.numpy(), err_msg=u.name)
    assert int(a.optimizer.iterations) == int(b.optimizer.iterations)
    for u, v in zip(a.trainable_variables, b.trainable_variables, strict=True):
        for s in a.optimizer.get_slot_names():
            np.testing.assert_array_equal(a.optimizer.get_slot(u, s).numpy(),
                                          b.optimizer.get_slot(v, s).numpy())  # fmt: skip


def test_round_trip_and_training_continues_exactly(tmp_path):
    x, y = data()
    model = dense_model()
    fit = {"batch_size": 16, "verbose": 0, "shuffle": False}
    model.fit(x, y, epochs=2, **fit)
    model.save(tmp_path / "m.keras")
    loaded = load_model(tmp_path / "m.keras")
    assert type(loaded) is Sequential and loaded.name == "classifier"
    assert [type(layer).__name__ for layer in loaded.layers] == [
        type(layer).__name__ for layer in model.layers]  # fmt: skip
    assert loaded.get_config() == model.get_config()
    assert type(loaded.optimizer) is hd.optimizers.Nadam
    assert loaded.optimizer.get_config() == model.optimizer.get_config()
    assert loaded.metrics_names == model.metrics_names
    assert_same_state(model, loaded)
    np.testing.assert_array_equal(loaded.predict(x), model.predict(x))
    assert loaded.evaluate(x, y, verbose=0) == model.evaluate(x, y, verbose=0)
    # two more epochs from the saved state == two more epochs of the original
    h1 = model.fit(x, y, epochs=2, **fit)
    h2 = loaded.fit(x, y, epochs=2, **fit)
    assert h1.history == h2.history
    assert_same_state(model, loaded)


def test_confusion_metrics_and_loss_objects_are_restored(tmp_path):
    rng = np.random.default_rng(2)
    x = rng.normal(size=(40, 3))
    y = (x[:, :2] > 0).astype(np.float64)
    model = Sequential([Dense(2, activation="sigmoid", input_shape=(3,), dtype="float64")])
    model.compile(optimizer=hd.optimizers.Adam(0.05),
                  loss=losses.BinaryCrossentropy(label_smoothing=0.1),
                  metrics=[metrics.Precision(thresholds=[0.3, 0.6], name="p"),
                           metrics.Recall(top_k=1), metrics.AUC(curve="PR", num_thresholds=50),
                           losses.mean_absolute_error,
                           metrics.BinaryAccuracy(threshold=0.3)])  # fmt: skip
    model.fit(x, y, batch_size=8, epochs=2, verbose=0)
    model.save(tmp_path / "m")
    loaded = load_model(tmp_path / "m")
    assert loaded._loss_obj.get_config() == model._loss_obj.get_config()
    assert [m.get_config() for m in loaded.compiled_metrics] == [
        m.get_config() for m in model.compiled_metrics]  # fmt: skip
    got = loaded.evaluate(x, y, verbose=0, return_dict=True)
    assert got == model.evaluate(x, y, verbose=0, return_dict=True)
    assert len(got["p"]) == 2 and set(got) == {"loss", "p", "recall", "auc",
                                               "mean_absolute_error", "binary_accuracy"}


def test_the_files_are_json_and_npz_without_pickle(tmp_path):
    x, y = data()
    model = dense_model(dropout=True)
    model.fit(x, y, epochs=1, verbose=0)
    model.save(tmp_path / "m")
    assert sorted(os.listdir(tmp_path / "m")) == ["model.data.npz", "model.index.json"]
    dropout = load_model(tmp_path / "m").get_layer("dropout")
    assert (dropout.rate, dropout.seed) == (0.25, 3)  # its masks' generator state is not saved
    manifest = json.loads((tmp_path / "m" / "model.index.json").read_text())
    arch = manifest["meta"]["per_worker"][0]["architecture"]
    assert arch["class_name"] == "Sequential" and arch["build_input_shape"] == [None, 4]
    assert arch["compile_config"]["optimizer"]["class_name"] == "Nadam"
    assert arch["compile_config"]["metrics"][0] == "accuracy"
    with np.load(tmp_path / "m" / "model.data.npz", allow_pickle=False) as npz:
        assert all(npz[k].dtype != object for k in npz.files)
    assert {"model", "optimizer", "architecture"} <= set(manifest["objects"])


def test_embedding_model_uncompiled_and_compile_false(tmp_path):
    model = Sequential([Input((3,)), Embedding(7, 2), Flatten(), Dense(1)])
    model.save(tmp_path / "plain")
    loaded = load_model(tmp_path / "plain")
    assert not getattr(loaded, "_compiled", False)
    ids = np.array([[0, 6, 2]])
    np.testing.assert_array_equal(loaded.predict(ids), model.predict(ids))
    model.compile(optimizer="adagrad", loss="mae")
    model.fit(np.random.default_rng(0).integers(0, 7, (8, 3)), np.ones(8), verbose=0)
    model.save(tmp_path / "compiled")
    bare = load_model(tmp_path / "compiled", compile=False)
    assert not getattr(bare, "_compiled", False)
    np.testing.assert_array_equal(bare.predict(ids), model.predict(ids))
    again = load_model(tmp_path / "compiled")
    assert type(again.optimizer).__name__ == "Adagrad"
    np.testing.assert_array_equal(
        again.optimizer.get_slot(again.trainable_variables[0], "accumulator").numpy(),
        model.optimizer.get_slot(model.trainable_variables[0], "accumulator").numpy(),
    )


class Doubling(Layer):
    def forward(self, x, training=False):
        return 2 * np.asarray(x, dtype=self.dtype), None

    def backward(self, cache, dy):
        return 2 * dy, []


def test_errors_and_custom_objects(tmp_path):
    model = Sequential([Dense(2, input_shape=(3,)), Doubling()])
    model.save(tmp_path / "custom")
    with pytest.raises(ValueError, match=r"layer 'Doubling'.*custom_objects=\{'Doubling'"):
        load_model(tmp_path / "custom")
    loaded = load_model(tmp_path / "custom", custom_objects={"Doubling": Doubling})
    np.testing.assert_array_equal(loaded.predict(np.ones((1, 3))), model.predict(np.ones((1, 3))))
    with pytest.raises(FileExistsError, match="overwrite=False"):
        model.save(tmp_path / "custom", overwrite=False)
    model.save(tmp_path / "custom")  # overwrite=True by default
    with pytest.raises(ValueError, match="HDF5"):
        model.save(tmp_path / "m.h5")
    with pytest.raises(ValueError, match="not built"):
        Sequential([Dense(2)]).save(tmp_path / "unbuilt")
    hd.checkpoint.Checkpoint(model=model).write(str(tmp_path / "ckpt" / "model"))
    with pytest.raises(CheckpointError, match="not a model saved by model.save"):
        load_model(tmp_path / "ckpt")
    with pytest.raises(FileNotFoundError):
        load_model(tmp_path / "nothing")


def test_load_into_a_mirrored_strategy(tmp_path):
    x, y = data()
    model = dense_model()
    model.fit(x, y, epochs=1, verbose=0, shuffle=False)
    model.save(tmp_path / "m")
    strategy = hd.MirroredStrategy(["/cpu:0", "/cpu:1"])
    with strategy.scope():
        mirrored = load_model(tmp_path / "m")
    assert mirrored.distribute_strategy is strategy
    assert isinstance(mirrored.trainable_variables[0], hd.distribute.MirroredVariable)
    assert_same_state(model, mirrored)
    np.testing.assert_allclose(mirrored.predict(x), model.predict(x), rtol=1e-12)


def _job(n, mode, path, out):
    script = HERE / "save_load_job.py"
    if n == 1:
        env = {**os.environ, "PYTHONPATH": str(HERE.parents[2])}
        done = subprocess.run([sys.executable, str(script), mode, str(path), str(out)],
                              capture_output=True, text=True, timeout=300, env=env)  # fmt: skip
        assert done.returncode == 0, done.stdout + done.stderr
        return
    done = run_mpi(script, n, args=[mode, str(path), str(out)], timeout=300,
                   env={"PYTHONPATH": str(HERE.parents[2])})  # fmt: skip
    assert done.returncode == 0, done.stdout


def test_saved_on_2_ranks_loads_on_1_and_4(tmp_path):
    """Save under mpirun -n 2; load in one process and under -n 4: the same predictions and
    optimizer slots; two more epochs after loading == two more epochs without saving."""
    path, out = tmp_path / "model.keras", tmp_path
    _job(2, "save", path, out)
    _job(1, "load", path, out)
    _job(4, "load", path, out)
    saved = np.load(out / "saved-2.npz")
    uninterrupted = np.load(out / "uninterrupted-2.npz")
    assert int(saved["iterations"]) == 4 and int(uninterrupted["iterations"]) == 8
    for n in (1, 4):
        loaded, continued = np.load(out / f"loaded-{n}.npz"), np.load(out / f"continued-{n}.npz")
        assert sorted(loaded.files) == sorted(saved.files)
        for key in saved.files:  # restored state: the same numbers (predictions up to sums)
            tol = 1e-12 if key == "pred" else 0
            np.testing.assert_allclose(loaded[key], saved[key], rtol=tol, atol=tol, err_msg=key)
        for key in uninterrupted.files:  # training on from it: up to the order of the sums
            np.testing.assert_allclose(continued[key], uninterrupted[key], rtol=1e-8, atol=1e-12,
                                       err_msg=f"{key} after loading on {n}")  # fmt: skip
