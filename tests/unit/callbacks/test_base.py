"""Callback, CallbackList, History and is_chief."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

import hpcdist as hd
from hpcdist.callbacks import (
    Callback,
    CallbackList,
    EarlyStopping,
    History,
    ProgressBar,
    is_chief,
)
from hpcdist.callbacks.base import monitor_op_for
from hpcdist.distribute import context

EPOCH_HOOKS = ["on_epoch_begin", "on_epoch_end"]
BATCH_HOOKS = [
    f"on_{mode}_batch_{when}" for mode in ("train", "test", "predict") for when in ("begin", "end")
]
RUN_HOOKS = [
    f"on_{mode}_{when}" for mode in ("train", "test", "predict") for when in ("begin", "end")
]


class Recorder(Callback):
    """Records (tag, hook, args, logs) for every hook into a shared list."""

    def __init__(self, tag: str, calls: list) -> None:
        super().__init__()
        self.tag = tag
        self.calls = calls


def _recording(name: str):
    def hook(self, *args):  # CallbackList passes logs positionally, as Keras
        self.calls.append((self.tag, name, args[:-1], args[-1]))

    return hook


for _name in EPOCH_HOOKS + BATCH_HOOKS + RUN_HOOKS:
    setattr(Recorder, _name, _recording(_name))


class FakeModel:
    def __init__(self, chief: bool = True) -> None:
        self.stop_training = False
        self.distribute_strategy = SimpleNamespace(
            extended=SimpleNamespace(should_checkpoint=chief)
        )


@pytest.fixture(autouse=True)
def _clean_context():
    yield
    context.set_thread_stack([])
    hd.experimental_set_strategy(None)


def test_every_keras_hook_exists_and_is_a_noop():
    cb = Callback()
    for name in EPOCH_HOOKS + BATCH_HOOKS:
        assert getattr(cb, name)(0, logs={"loss": 1.0}) is None
    for name in RUN_HOOKS:
        assert getattr(cb, name)(logs={}) is None
    assert cb.model is None and dict(cb.params) == {}


def test_callbacklist_dispatches_every_hook_in_order_with_arguments():
    calls: list = []
    a, b = Recorder("a", calls), Recorder("b", calls)
    cbs = CallbackList([a, b])
    logs = {"loss": 0.5}
    for name in EPOCH_HOOKS + BATCH_HOOKS:
        getattr(cbs, name)(3, logs)
    for name in RUN_HOOKS:
        getattr(cbs, name)(logs)
    expected = []
    for name in EPOCH_HOOKS + BATCH_HOOKS:
        expected += [("a", name, (3,), logs), ("b", name, (3,), logs)]
    for name in RUN_HOOKS:
        expected += [("a", name, (), logs), ("b", name, (), logs)]
    assert calls == expected


def test_callbacklist_simulated_fit_order_and_none_logs_become_empty_dicts():
    calls: list = []
    cbs = CallbackList(Recorder("a", calls))
    cbs.on_train_begin()
    for epoch in range(2):
        cbs.on_epoch_begin(epoch)
        for batch in range(2):
            cbs.on_train_batch_begin(batch)
            cbs.on_train_batch_end(batch, {"loss": 1.0 + batch})
        cbs.on_epoch_end(epoch, {"loss": 2.0})
    cbs.on_train_end()
    seq = [(hook, args) for _, hook, args, _ in calls]
    assert seq == [
        ("on_train_begin", ()),
        ("on_epoch_begin", (0,)),
        ("on_train_batch_begin", (0,)),
        ("on_train_batch_end", (0,)),
        ("on_train_batch_begin", (1,)),
        ("on_train_batch_end", (1,)),
        ("on_epoch_end", (0,)),
        ("on_epoch_begin", (1,)),
        ("on_train_batch_begin", (0,)),
        ("on_train_batch_end", (0,)),
        ("on_train_batch_begin", (1,)),
        ("on_train_batch_end", (1,)),
        ("on_epoch_end", (1,)),
        ("on_train_end", ()),
    ]
    assert calls[0][3] == {} and calls[3][3] == {"loss": 1.0}


def test_train_batch_hooks_call_the_legacy_batch_hooks():
    seen = []

    class Legacy(Callback):
        def on_batch_begin(self, batch, logs=None):
            seen.append(("begin", batch))

        def on_batch_end(self, batch, logs=None):
            seen.append(("end", batch, logs["loss"]))

    cbs = CallbackList([Legacy()])
    cbs.on_train_batch_begin(4)
    cbs.on_batch_end(4, {"loss": 2.0})  # CallbackList alias of on_train_batch_end
    assert seen == [("begin", 4), ("end", 4, 2.0)]


def test_set_model_and_set_params_propagate_and_history_is_attached():
    a = Callback()
    model = FakeModel()
    cbs = CallbackList([[a]], add_history=True, model=model, verbose=2, epochs=3, steps=7)
    hist = cbs.callbacks[-1]
    assert isinstance(hist, History) and len(cbs) == 2
    for cb in cbs:
        assert cb.model is model
        assert cb.params == {"verbose": 2, "epochs": 3, "steps": 7}
    assert model.history is hist
    other = FakeModel()
    cbs.set_model(other)
    assert a.model is other and hist.model is other and other.history is hist
    cbs.set_params({"epochs": 1})
    assert a.params == {"epochs": 1}


def test_default_callbacks_are_added_once_progbar_first_history_last():
    es = EarlyStopping()
    cbs = CallbackList([es], add_history=True, add_progbar=True)
    assert [type(c) for c in cbs] == [ProgressBar, EarlyStopping, History]
    mine_h, mine_p = History(), ProgressBar(verbose=2)
    cbs = CallbackList([mine_h, es, mine_p], add_history=True, add_progbar=True)
    assert cbs.callbacks == [mine_h, es, mine_p]
    assert CallbackList([es]).callbacks == [es]
    cbs = CallbackList()
    cbs.append(es)
    assert cbs.callbacks == [es]


def test_callbacklist_rejects_non_callbacks():
    with pytest.raises(TypeError, match="Callback"):
        CallbackList([object()])
    with pytest.raises(TypeError, match="Callback"):
        CallbackList([Callback(), 3])


def test_history_records_every_epoch():
    model = FakeModel()
    cbs = CallbackList(model=model, add_history=True)
    cbs.on_train_begin()
    rows = [{"loss": 1.0 / (e + 1), "accuracy": 0.1 * e, "val_loss": 2.0 - e} for e in range(4)]
    for e, row in enumerate(rows):
        cbs.on_epoch_begin(e)
        cbs.on_epoch_end(e, row)
    hist = model.history
    assert hist.epoch == [0, 1, 2, 3]
    assert hist.history == {k: [r[k] for r in rows] for k in ("loss", "accuracy", "val_loss")}
    hist.on_train_begin()
    assert hist.epoch == [] and len(hist.history["loss"]) == 4  # Keras keeps history


def test_is_chief():
    assert is_chief(None)
    assert is_chief(object())
    assert is_chief(SimpleNamespace(distribute_strategy=None))
    assert is_chief(FakeModel(chief=True))
    assert not is_chief(FakeModel(chief=False))
    s = hd.MirroredStrategy(["/cpu:0", "/cpu:1"])
    assert is_chief(SimpleNamespace(distribute_strategy=s))
    assert is_chief(SimpleNamespace(distribute_strategy=context.get_strategy()))


@pytest.mark.parametrize(
    ("monitor", "mode", "expected"),
    [
        ("val_loss", "auto", "min"),
        ("loss", "auto", "min"),
        ("acc", "auto", "max"),
        ("val_acc", "auto", "max"),
        ("accuracy", "auto", "max"),
        ("val_sparse_categorical_accuracy", "auto", "max"),
        ("val_auc", "auto", "max"),
        ("val_accuracy", "min", "min"),
        ("loss", "max", "max"),
    ],
)
def test_monitor_direction(monitor, mode, expected):
    assert monitor_op_for(monitor, mode, "X") == expected


def test_unknown_mode_is_a_clear_error():
    with pytest.raises(ValueError, match="'auto', 'min' or 'max'"):
        monitor_op_for("loss", "minimum", "EarlyStopping")


def test_logs_are_passed_positionally_so_any_parameter_name_works():
    seen = []

    class Custom(Callback):
        def on_epoch_end(self, epoch, epoch_logs):
            seen.append((epoch, epoch_logs))

        def on_train_end(self, final):
            seen.append(final)

    cbs = CallbackList([Custom()])
    cbs.on_epoch_end(2, {"loss": 1.0})
    cbs.on_train_end()
    assert seen == [(2, {"loss": 1.0}), {}]
