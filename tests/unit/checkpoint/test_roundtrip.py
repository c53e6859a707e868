"""Checkpoint round trips in one process: training resumes bit for bit, RNG streams continue."""

from __future__ import annotations

import os

import numpy as np
import pytest

import hpcdist as hd
from hpcdist.checkpoint import Checkpoint, CheckpointMatchError
from hpcdist.errors import CheckpointError
from hpcdist.nn.layers import Dense
from hpcdist.nn.model import Model
from hpcdist.optimizers import SGD, Adam

OPTIMIZERS = {
    "sgd_momentum": lambda: SGD(0.05, momentum=0.9),
    "adam": lambda: Adam(0.01),
    "adam_amsgrad": lambda: Adam(0.01, amsgrad=True),
}


def make_model(seed: int) -> Model:
    model = Model([Dense(5, activation="relu", input_shape=(3,)), Dense(2)])
    rng = np.random.default_rng(seed)
    model.set_weights([rng.standard_normal(w.shape).astype(w.dtype) for w in model.weights])
    return model


def train_step(model: Model, opt, step: int) -> None:
    rng = np.random.default_rng(1000 + step)
    x = rng.standard_normal((8, 3))
    y = rng.standard_normal((8, 2))
    out, caches = model.forward(x, training=True)
    grads = model.backward(caches, 2.0 * (out - y) / x.shape[0])
    opt.apply_gradients(zip(grads, model.trainable_variables, strict=True))


@pytest.mark.parametrize("kind", sorted(OPTIMIZERS))
def test_resumed_training_is_bitwise_equal_to_an_uninterrupted_run(tmp_path, kind):
    model, opt = make_model(0), OPTIMIZERS[kind]()
    for step in range(7):
        train_step(model, opt, step)
    reference = model.get_weights()

    model, opt = make_model(0), OPTIMIZERS[kind]()
    for step in range(3):
        train_step(model, opt, step)
    path = Checkpoint(model=model, optimizer=opt).save(str(tmp_path / "ckpt"))
    for step in range(3, 5):  # the interrupted run goes on a little: must not leak into the file
        train_step(model, opt, step)

    fresh_model, fresh_opt = make_model(99), OPTIMIZERS[kind]()  # other weights, no slots yet
    status = Checkpoint(model=fresh_model, optimizer=fresh_opt).restore(path)
    assert int(fresh_opt.iterations) == 3
    assert status.pending() == ["optimizer"]  # slots wait for the optimizer to be built
    with pytest.raises(CheckpointMatchError, match="wait for variables"):
        status.assert_consumed()
    status.assert_existing_objects_matched()
    for step in range(3, 7):
        train_step(fresh_model, fresh_opt, step)
    status.assert_consumed()
    for got, want in zip(fresh_model.get_weights(), reference, strict=True):
        assert got.tobytes() == want.tobytes()


def test_restore_into_a_built_optimizer_assigns_slots_at_once(tmp_path):
    model, opt = make_model(0), SGD(0.05, momentum=0.9)
    for step in range(2):
        train_step(model, opt, step)
    momentum = [opt.get_slot(v, "momentum").numpy() for v in model.trainable_variables]
    path = Checkpoint(m=model, o=opt).write(str(tmp_path / "w"))
    other, other_opt = make_model(1), SGD(0.05, momentum=0.9)
    other_opt.build(other.trainable_variables)
    Checkpoint(m=other, o=other_opt).read(path).assert_consumed()
    got = [other_opt.get_slot(v, "momentum").numpy() for v in other.trainable_variables]
    for a, b in zip(got, momentum, strict=True):
        np.testing.assert_array_equal(a, b)
    assert int(other_opt.iterations) == 2


def test_rng_streams_continue_after_restore(tmp_path):
    gen = np.random.default_rng(7)
    mt = np.random.Generator(np.random.MT19937(3))
    legacy = np.random.RandomState(11)
    legacy.standard_normal()  # leaves a cached gaussian in the state
    ckpt = Checkpoint(gen=gen, mt=mt, legacy=legacy)
    path = ckpt.save(str(tmp_path / "rng"))
    expected = (gen.random(5), mt.integers(0, 1 << 40, 5), legacy.standard_normal(3))
    gen.random(100), mt.random(100), legacy.random_sample(100)  # move on
    ckpt.restore(path).assert_consumed()
    got = (gen.random(5), mt.integers(0, 1 << 40, 5), legacy.standard_normal(3))
    for a, b in zip(got, expected, strict=True):
        np.testing.assert_array_equal(a, b)


def test_rng_with_another_bit_generator_is_refused(tmp_path):
    path = Checkpoint(g=np.random.default_rng(0)).write(str(tmp_path / "g"))
    with pytest.raises(CheckpointError, match="'PCG64' state.*'MT19937'"):
        Checkpoint(g=np.random.Generator(np.random.MT19937(0))).read(path)


def test_save_counter_numbering_write_and_read(tmp_path):
    v = hd.Variable(np.arange(3.0))
    ckpt = Checkpoint(v=v)
    assert [os.path.basename(ckpt.save(str(tmp_path / "c"))) for _ in range(3)] == [
        "c-1",
        "c-2",
        "c-3",
    ]
    assert os.path.basename(ckpt.write(str(tmp_path / "plain"))) == "plain"
    assert ckpt.save_counter == 3
    again = Checkpoint(v=hd.Variable(np.zeros(3)))
    assert again.restore(str(tmp_path / "c-2")).save_counter == 2
    assert again.save_counter == 2  # restore brings the counter back
    again.read(str(tmp_path / "plain"))
    assert again.save_counter == 2  # read does not
    np.testing.assert_array_equal(again.v.numpy(), np.arange(3.0))


def test_nested_checkpoints_dicts_lists_and_status(tmp_path):
    a, b, c = hd.Variable(1.0), hd.Variable(np.ones(2)), hd.Variable(np.int64(5))
    inner = Checkpoint(b=b)
    outer = Checkpoint(a=a, inner=inner, extra={"c": c, "list": [hd.Variable(2.0)]})
    inner._save_counter = 4
    path = outer.write(str(tmp_path / "n"))
    a.assign(0.0), b.assign(np.zeros(2)), c.assign(0)
    inner._save_counter = 0
    status = outer.read(path).assert_consumed()
    assert sorted(status.matched) == ["a", "extra.c", "extra.list.0", "inner", "inner.b"]
    assert float(a) == 1.0 and b.numpy().tolist() == [1.0, 1.0] and int(c) == 5
    assert inner.save_counter == 4

    partial = Checkpoint(a=a, new=hd.Variable(3.0)).read(path)
    assert partial.missing == ["new"] and "inner.b" in partial.unused
    with pytest.raises(CheckpointMatchError, match="'new'"):
        partial.assert_existing_objects_matched()
    partial.expect_partial().assert_nontrivial_match()


def test_restore_none_and_attribute_tracking(tmp_path):
    ckpt = Checkpoint()
    ckpt.w = hd.Variable(np.ones(2))
    status = ckpt.restore(None)
    with pytest.raises(CheckpointMatchError, match="save_path=None"):
        status.assert_existing_objects_matched()
    path = ckpt.save(str(tmp_path / "attr"))
    ckpt.w.assign(np.zeros(2))
    ckpt.restore(path)
    assert ckpt.w.numpy().tolist() == [1.0, 1.0]
    with pytest.raises(TypeError, match="cannot track .*type object"):
        Checkpoint(thing=object())
    with pytest.raises(ValueError, match="save_counter"):
        Checkpoint(save_counter=hd.Variable(1))


def test_layout_mismatches_are_checkpoint_errors_and_nothing_is_assigned(tmp_path):
    model, opt = make_model(0), SGD(0.1, momentum=0.9)
    train_step(model, opt, 0)
    path = Checkpoint(model=model, opt=opt, v=hd.Variable(np.ones(3))).write(str(tmp_path / "l"))

    wide = Model([Dense(6, activation="relu", input_shape=(3,)), Dense(2)])
    before = wide.get_weights()
    v = hd.Variable(np.zeros(3))
    with pytest.raises(CheckpointError, match=r"model .*weight 0 .*shape \(3, 5\).*\(3, 6\)"):
        Checkpoint(v=v, model=wide).read(path)
    assert all(np.array_equal(x, y) for x, y in zip(before, wide.get_weights(), strict=True))
    assert v.numpy().tolist() == [0.0, 0.0, 0.0]  # checked everything before assigning

    with pytest.raises(CheckpointError, match="holds 4 weights, but the model has 2"):
        Checkpoint(model=Model([Dense(2, input_shape=(3,))])).read(path)
    with pytest.raises(CheckpointError, match="state of a SGD.*Adam"):
        Checkpoint(opt=Adam()).read(path)
    with pytest.raises(CheckpointError, match="slot 'momentum'"):
        Checkpoint(opt=SGD(0.1)).read(path)
    with pytest.raises(CheckpointError, match=r"variable 'v'.*shape \(3,\).*shape \(4,\)"):
        Checkpoint(v=hd.Variable(np.zeros(4), name="v")).read(path)
    with pytest.raises(CheckpointError, match="dtype float64.*dtype float32"):
        Checkpoint(v=hd.Variable(np.zeros(3, np.float32))).read(path)


def test_deferred_slot_with_the_wrong_shape_is_refused_at_build(tmp_path):
    model, opt = make_model(0), Adam(0.01)
    train_step(model, opt, 0)
    path = Checkpoint(opt=opt).write(str(tmp_path / "d"))
    fresh = Adam(0.01)
    Checkpoint(opt=fresh).read(path)
    other = Model([Dense(4, input_shape=(3,)), Dense(2)])
    with pytest.raises(CheckpointError, match=r"slot 'm' of variable 0"):
        fresh.build(other.trainable_variables)


def test_protocol_objects_get_their_meta_back(tmp_path):
    class Counter:
        def __init__(self):
            self.n, self.big = 0, 0

        def _checkpoint_state(self):
            return {"hist": np.arange(self.n)}, {"n": self.n, "big": self.big}

        def _restore_checkpoint_state(self, arrays, meta):
            self.n, self.big = meta["n"], meta["big"]
            assert arrays["hist"].tolist() == list(range(self.n))

    c = Counter()
    c.n, c.big = 4, 3**200  # Python ints of any size survive (JSON)
    path = Checkpoint(c=c).write(str(tmp_path / "p"))
    d = Counter()
    Checkpoint(c=d).read(path)
    assert (d.n, d.big) == (4, 3**200)


def test_unbuilt_model_is_refused_with_a_hint(tmp_path):
    path = Checkpoint(model=make_model(0)).write(str(tmp_path / "u"))
    unbuilt = Model([Dense(5, activation="relu"), Dense(2)])
    with pytest.raises(CheckpointError, match="not built yet"):
        Checkpoint(model=unbuilt).read(path)
