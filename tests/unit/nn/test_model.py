"""The model core: build rules, backward against finite differences, replicas, weights, files."""

from __future__ import annotations

import os
import types
import zipfile

import numpy as np
import pytest

import hpcdist as hd
from hpcdist.nn import activations
from hpcdist.nn.initializers import GlorotUniform
from hpcdist.nn.layers import Activation, Dense, Dropout, InputLayer
from hpcdist.nn.model import Model


def three_layers(**kw) -> Model:
    return Model(
        [
            Dense(5, activation="tanh", input_shape=(4,), dtype="float64"),
            Dense(4, activation="gelu", dtype="float64"),
            Dense(3, activation="softmax", dtype="float64"),
        ],
        **kw,
    )


def reference_forward(weights, x):
    """The three-layer model in plain NumPy from its weight list."""
    w1, b1, w2, b2, w3, b3 = weights
    h = np.tanh(x @ w1 + b1)
    h = activations.gelu(h @ w2 + b2)
    z = h @ w3 + b3
    e = np.exp(z - z.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


def test_three_layer_backward_matches_finite_differences():
    rng = np.random.default_rng(0)
    model = three_layers()
    x = rng.standard_normal((6, 4))
    r = rng.standard_normal((6, 3))  # f = sum(r * model(x)), so df/dy = r
    y, caches = model.forward(x, training=True)
    np.testing.assert_allclose(y, reference_forward(model.get_weights(), x), rtol=1e-12)
    grads = model.backward(caches, r)
    assert [g.shape for g in grads] == [v.shape for v in model.trainable_variables]
    eps = 1e-6
    for var, grad in zip(model.trainable_variables, grads, strict=True):
        base = var.numpy()
        numeric = np.zeros_like(base)
        for idx in np.ndindex(base.shape):
            for sign in (1, -1):
                p = base.copy()
                p[idx] += sign * eps
                var.assign(p)
                numeric[idx] += sign * float(np.sum(r * model(x))) / (2 * eps)
        var.assign(base)
        np.testing.assert_allclose(grad, numeric, rtol=1e-6, atol=1e-9, err_msg=var.name)


def test_frozen_first_layer_is_skipped_and_grads_align():
    rng = np.random.default_rng(1)
    model = three_layers()
    x, r = rng.standard_normal((3, 4)), rng.standard_normal((3, 3))
    _, caches = model.forward(x)
    full = model.backward(caches, r)
    model.layers[0].trainable = False
    assert [v.name for v in model.trainable_variables] == [
        "dense_1/kernel", "dense_1/bias", "dense_2/kernel", "dense_2/bias",
    ]  # fmt: skip
    assert len(model.non_trainable_variables) == 2 and len(model.variables) == 6
    partial = model.backward(caches, r)
    assert len(partial) == 4
    for a, b in zip(partial, full[2:], strict=True):
        np.testing.assert_allclose(a, b)


def test_backward_checks_its_arguments():
    model = three_layers()
    _, caches = model.forward(np.ones((2, 4)))
    with pytest.raises(ValueError, match=r"dy has shape \(2,\), but the model's output had shape"):
        model.backward(caches, np.ones(2))
    with pytest.raises(TypeError, match="model.forward"):
        model.backward([1, 2], np.ones((2, 3)))


def test_building_rules():
    model = Model([Dense(3), Activation("relu"), Dense(2)])
    assert not model.built and model.distribute_strategy is hd.get_strategy()
    with pytest.raises(ValueError, match="not built"):
        model.count_params()
    with pytest.raises(AttributeError, match="not built"):
        _ = model.output_shape
    y = model(np.ones((5, 7)))  # builds from the input
    assert model.built and y.shape == (5, 2) and y.dtype == np.float32
    assert model.input_shape == (None, 7) and model.output_shape == (None, 2)
    assert model.count_params() == 7 * 3 + 3 + 3 * 2 + 2
    with pytest.raises(ValueError, match="batch dimension"):
        Model([Dense(1)]).build((10,))
    with pytest.raises(ValueError, match="does not know its input shape"):
        Model([Dense(1)]).build()
    built = Model([InputLayer((6,)), Dense(2)])
    assert built.built and len(built.layers) == 1 and built.count_params() == 14
    built.add(Dense(4))  # added to a built model: built at once
    assert built.layers[-1].built and built.output_shape == (None, 4)
    assert built(np.ones((1, 6))).shape == (1, 4)
    with pytest.raises(ValueError, match="InputLayer must come first"):
        built.add(InputLayer((3,)))
    with pytest.raises(TypeError, match="expects an hpcdist.nn.layers.Layer"):
        built.add("dense")


def test_layer_names_are_per_model_and_unique():
    names = [[v.name for v in three_layers().weights] for _ in range(2)]
    assert names[0] == names[1] == [
        "dense/kernel", "dense/bias", "dense_1/kernel", "dense_1/bias",
        "dense_2/kernel", "dense_2/bias",
    ]  # fmt: skip
    model = Model([Dense(2, name="dense_1"), Dense(2), Dense(2), Dropout(0.1)])
    assert [layer.name for layer in model.layers] == ["dense_1", "dense", "dense_2", "dropout"]
    with pytest.raises(ValueError, match="already has a layer named 'out'"):
        Model([Dense(2, name="out"), Dense(2, name="out")])
    first, second = Model(), Model()
    assert first.name != second.name and first.name.startswith("model")
    assert model.get_layer("dense_2") is model.layers[2] and model.get_layer(index=0).units == 2


# -- strategies -------------------------------------------------------------------------------


def test_model_under_mirrored_strategy(strategy):
    with strategy.scope():
        model = Model(
            [
                Dense(4, activation="tanh", input_shape=(3,), kernel_initializer=GlorotUniform(1)),
                Dense(2, bias_initializer="ones"),
            ]
        )
    assert model.distribute_strategy is strategy
    assert all(isinstance(v, hd.MirroredVariable) for v in model.weights)
    inputs = [np.full((2, 3), 1.0, np.float32), np.arange(6.0, dtype=np.float32).reshape(2, 3)]
    x = strategy.experimental_distribute_values_from_function(
        lambda ctx: inputs[ctx.replica_id_in_sync_group]
    )

    def step(xb):
        y, caches = model.forward(xb, training=True)
        return y, model.backward(caches, np.ones_like(y))

    ys, grads = strategy.run(step, args=(x,))
    w1, b1, w2, b2 = model.get_weights()
    for i in range(2):
        h = np.tanh(inputs[i] @ w1 + b1)
        np.testing.assert_allclose(ys.values[i], h @ w2 + b2, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(grads[2].values[i], h.T @ np.ones((2, 2)), rtol=1e-5, atol=1e-6)
    assert not np.allclose(ys.values[0], ys.values[1])


def test_each_replica_reads_its_own_component(strategy):
    with strategy.scope():
        model = Model([Dense(1, use_bias=False, kernel_initializer="ones", input_shape=(2,))])
    kernel = model.weights[0]
    kernel.values[1]._value = np.full((2, 1), 3.0, np.float32)  # make replica 1's copy differ
    out = strategy.run(lambda: model(np.ones((1, 2))))
    assert out.values[0].tolist() == [[2.0]] and out.values[1].tolist() == [[6.0]]


def test_building_inside_run_is_an_error(strategy):
    with strategy.scope():
        model = Model([Dense(2)])
    with pytest.raises(RuntimeError, match=r"model.build\(input_shape\)"):
        strategy.run(lambda: model(np.ones((1, 3))))
    assert not model.built
    model.build((None, 3))  # outside the scope: it enters the model's strategy scope itself
    assert isinstance(model.weights[0], hd.MirroredVariable)
    out = strategy.run(lambda: model(np.ones((1, 3))))
    np.testing.assert_allclose(out.values[0], out.values[1])


def test_a_model_made_outside_a_scope_is_not_built_in_another(strategy):
    model = Model([Dense(2)])
    with strategy.scope(), pytest.raises(RuntimeError, match="made outside any strategy scope"):
        model.build((None, 3))


# -- weights and files ------------------------------------------------------------------------


def test_get_and_set_weights(strategy):
    with strategy.scope():
        model = Model([Dense(3, input_shape=(2,)), Dense(1)])
    new = [np.full(v.shape, i, np.float32) for i, v in enumerate(model.weights)]
    model.set_weights(new)
    for i, v in enumerate(model.weights):
        for component in v.values:
            np.testing.assert_array_equal(component.numpy(), np.full(v.shape, i))
    got = model.get_weights()
    got[0][...] = 99  # host copies: changing them does not change the model
    assert model.get_weights()[0].max() == 0
    with pytest.raises(ValueError, match="got 1 arrays, but model .* has 4 weights"):
        model.set_weights(new[:1])
    with pytest.raises(ValueError, match=r"'dense/kernel' has shape \(2, 3\), but the array"):
        model.set_weights([np.zeros((3, 3))] + new[1:])
    with pytest.raises(RuntimeError, match="outside strategy.run"):
        strategy.run(lambda: model.set_weights(new))


def test_save_and_load_round_trip(tmp_path, strategy):
    source = three_layers()
    target = three_layers()
    assert not np.allclose(source.get_weights()[0], target.get_weights()[0])
    path = tmp_path / "sub" / "weights"  # no suffix: written exactly there; dirs made
    source.save_weights(path)
    assert sorted(os.listdir(tmp_path / "sub")) == ["weights"]  # no temporary file left
    assert zipfile.is_zipfile(path)
    with np.load(path, allow_pickle=False) as data:
        assert data["__names__"].tolist() == [v.name for v in source.weights]
        np.testing.assert_array_equal(data["dense/kernel"], source.get_weights()[0])
    target.load_weights(path)
    for a, b in zip(source.get_weights(), target.get_weights(), strict=True):
        np.testing.assert_array_equal(a, b)
    with strategy.scope():
        mirrored = three_layers()
    mirrored.load_weights(path)
    for a, v in zip(source.get_weights(), mirrored.weights, strict=True):
        for component in v.values:
            np.testing.assert_array_equal(component.numpy(), a)


def test_save_is_not_collective_and_only_the_chief_writes(tmp_path, strategy, monkeypatch):
    with strategy.scope():
        model = Model([Dense(2, input_shape=(3,))])

    def collective(*args, **kwargs):
        raise AssertionError("save_weights must not run a collective")

    monkeypatch.setattr(strategy.extended, "reduce_leaves", collective)
    monkeypatch.setattr(strategy.extended, "broadcast_initial_value", collective)
    model.save_weights(tmp_path / "chief.npz")
    assert (tmp_path / "chief.npz").exists()
    worker = types.SimpleNamespace(extended=types.SimpleNamespace(should_checkpoint=False))
    monkeypatch.setattr(model, "_distribute_strategy", worker)
    model.save_weights(tmp_path / "worker.npz")
    assert not (tmp_path / "worker.npz").exists()


def test_load_into_a_mismatched_model_errors(tmp_path):
    path = tmp_path / "w.npz"
    three_layers().save_weights(path)
    wider = Model([Dense(6, input_shape=(4,)), Dense(4), Dense(3)])
    before = wider.get_weights()
    with pytest.raises(ValueError, match=r"'dense/kernel' has shape \(4, 6\) .* shape \(4, 5\)"):
        wider.load_weights(path)
    for a, b in zip(before, wider.get_weights(), strict=True):  # nothing was assigned
        np.testing.assert_array_equal(a, b)
    with pytest.raises(ValueError, match="holds 6 weights .* has 4"):
        Model([Dense(5, input_shape=(4,)), Dense(4)]).load_weights(path)
    renamed = Model([Dense(5, input_shape=(4,), name="a"), Dense(4), Dense(3)])
    with pytest.raises(ValueError, match="weight 0 of .* is 'dense/kernel', but .* is 'a/kernel'"):
        renamed.load_weights(path)
    np.save(tmp_path / "plain.npy", np.zeros(3))
    with pytest.raises(ValueError, match="not a weights file"):
        renamed.load_weights(tmp_path / "plain.npy")
    with pytest.raises(ValueError, match="needs a built model"):
        Model([Dense(1)]).load_weights(path)


def test_summary_text():
    model = Model([Dense(64, activation="relu", input_shape=(10,)), Dropout(0.2), Dense(1)],
                  name="mlp")  # fmt: skip
    model.layers[2].trainable = False
    lines: list[str] = []
    model.summary(print_fn=lines.append)
    assert lines == [
        'Model: "mlp"',
        "_" * 65,
        " Layer (type)                Output Shape              Param #",
        "=" * 65,
        " dense (Dense)               (None, 64)                704",
        "",
        " dropout (Dropout)           (None, 64)                0",
        "",
        " dense_1 (Dense)             (None, 1)                 65",
        "=" * 65,
        "Total params: 769",
        "Trainable params: 704",
        "Non-trainable params: 65",
        "_" * 65,
    ]
    with pytest.raises(ValueError, match="not built yet"):
        Model([Dense(1)]).summary(print_fn=lines.append)
