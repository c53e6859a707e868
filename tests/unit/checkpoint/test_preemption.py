"""PreemptionCheckpointHandler and TerminationConfig in one process, with real signals."""

from __future__ import annotations

import math
import os
import signal
import time

import numpy as np
import pytest

import hpcdist as hd
from hpcdist.checkpoint.checkpoint import Checkpoint
from hpcdist.checkpoint.manager import CheckpointManager
from hpcdist.checkpoint.preemption import (
    PREEMPTION_EXIT_CODE,
    PREEMPTION_SIGNALS,
    PreemptionCheckpointHandler,
    TerminationConfig,
)


class Recorder:
    """An exit_fn that records the step at which it was called instead of exiting."""

    def __init__(self) -> None:
        self.handler: PreemptionCheckpointHandler | None = None
        self.calls: list[int] = []

    def __call__(self) -> None:
        assert self.handler is not None
        self.calls.append(self.handler.total_run_calls)


def make(directory, exit_fn=None, **config):
    v = hd.Variable(np.zeros(3))
    ckpt = Checkpoint(v=v)
    handler = PreemptionCheckpointHandler(
        None, ckpt, str(directory), TerminationConfig(exit_fn=exit_fn, **config)
    )
    return v, handler


def train(v, handler, steps, signal_at=None, signum=signal.SIGUSR1, pause=0.0):
    """Steps add 1 to v; step ``signal_at`` (0-based) signals this process during the step."""

    def step(i):
        v.assign_add(np.ones(3))
        if i == signal_at:
            os.kill(os.getpid(), signum)
        if pause:
            time.sleep(pause)

    for i in range(handler.total_run_calls, steps):
        handler.run(step, i)


def test_the_documented_defaults():
    assert PREEMPTION_EXIT_CODE == 42
    assert PREEMPTION_SIGNALS == (signal.SIGTERM, signal.SIGUSR1)
    cfg = TerminationConfig()
    assert (cfg.termination_watcher_fn, cfg.exit_fn, cfg.grace_period, cfg.save_fn) == (None,) * 4


@pytest.mark.parametrize("bad", [-1, -0.5, math.inf, math.nan, True, "10"])
def test_a_bad_grace_period_is_refused(bad):
    with pytest.raises(ValueError, match="grace_period"):
        TerminationConfig(grace_period=bad)


@pytest.mark.parametrize("name", ["termination_watcher_fn", "exit_fn", "save_fn"])
def test_a_function_argument_must_be_callable(name):
    with pytest.raises(TypeError, match=name):
        TerminationConfig(**{name: 42})


def test_bad_handler_arguments(tmp_path):
    ckpt = Checkpoint(v=hd.Variable(np.zeros(1)))
    with pytest.raises(ValueError, match="checkpoint_dir"):
        PreemptionCheckpointHandler(None, ckpt)
    with pytest.raises(TypeError, match="Checkpoint or CheckpointManager"):
        PreemptionCheckpointHandler(None, {"v": 1}, str(tmp_path))
    with pytest.raises(TypeError, match="TerminationConfig"):
        PreemptionCheckpointHandler(None, ckpt, str(tmp_path), termination_config={})
    manager = CheckpointManager(ckpt, str(tmp_path / "a"))
    with pytest.raises(ValueError, match="differs"):
        PreemptionCheckpointHandler(None, manager, str(tmp_path / "b"))


@pytest.mark.parametrize("signum", PREEMPTION_SIGNALS)
def test_a_signal_saves_at_the_next_step_and_calls_exit_fn(tmp_path, signum):
    before = signal.getsignal(signum)
    rec = Recorder()
    v, handler = make(tmp_path, exit_fn=rec)
    rec.handler = handler
    assert signal.getsignal(signum) != before  # watching from creation, as TF
    train(v, handler, 8, signal_at=3, signum=signum)
    # The signal came during step 3: the check before step 4 saves 4 steps, then exits.
    assert rec.calls == [4]
    assert handler.total_run_calls == 8
    assert os.path.exists(tmp_path / "ckpt-4.index.json")
    assert [p for p in os.listdir(tmp_path) if p.endswith(".index.json")] == ["ckpt-4.index.json"]
    handler.close()
    assert signal.getsignal(signum) == before
    # A restart restores the weights and the run count of the save.
    v2, handler2 = make(tmp_path, exit_fn=rec)
    assert handler2.total_run_calls == 4
    np.testing.assert_array_equal(v2.numpy(), np.full(3, 4.0))
    handler2.close()


def test_the_default_exit_fn_exits_with_the_documented_code(tmp_path):
    v, handler = make(tmp_path)
    try:
        with pytest.raises(SystemExit) as info:
            train(v, handler, 5, signal_at=1)
        assert info.value.code == PREEMPTION_EXIT_CODE
        assert handler.total_run_calls == 2
        assert os.path.exists(tmp_path / "ckpt-2.index.json")
    finally:
        handler.close()


def test_no_signal_no_save(tmp_path):
    rec = Recorder()
    v, handler = make(tmp_path, exit_fn=rec)
    rec.handler = handler
    train(v, handler, 5)
    handler.close()
    assert rec.calls == []
    assert not any(p.endswith(".index.json") for p in os.listdir(tmp_path))
    with pytest.raises(RuntimeError, match="closed"):
        handler.run(v.assign_add, np.ones(3))


def test_a_grace_period_saves_at_once_then_again_before_the_deadline(tmp_path):
    rec = Recorder()
    saves: list[tuple[int, float]] = []

    def save_fn():  # save_fn replaces the manager's save; it records when it was called
        saves.append((handler.total_run_calls, time.monotonic()))
        handler._manager.save(checkpoint_number=handler.total_run_calls, check_interval=False)

    v, handler = make(tmp_path, exit_fn=rec, grace_period=1.5, save_fn=save_fn)
    rec.handler = handler
    start = time.monotonic()
    train(v, handler, 150, signal_at=2, pause=0.02)
    handler.close()
    assert len(saves) == 2 and rec.calls == [saves[1][0]]
    assert saves[0][0] == 3  # at once, at the next step
    assert saves[1][0] > saves[0][0] + 5  # trained on during the grace period
    assert saves[1][1] - start < 1.5  # and saved before the deadline
    assert handler.total_run_calls == 150  # exit_fn returned: training went on


def test_a_termination_watcher_fn_replaces_the_signals(tmp_path):
    before = signal.getsignal(signal.SIGTERM)
    rec = Recorder()
    calls = []

    def watcher():
        calls.append(1)
        return len(calls) >= 2  # the second poll (about 1 s later) reports a notice

    v, handler = make(tmp_path, exit_fn=rec, termination_watcher_fn=watcher)
    rec.handler = handler
    assert signal.getsignal(signal.SIGTERM) == before
    deadline = time.monotonic() + 20
    while not rec.calls and time.monotonic() < deadline:
        handler.run(v.assign_add, np.ones(3))
        time.sleep(0.01)
    handler.close()
    assert len(rec.calls) == 1
    n = rec.calls[0]
    assert os.path.exists(tmp_path / f"ckpt-{n}.index.json")


def test_save_checkpoint_if_preempted_counts_calls_and_forwards_arguments(tmp_path):
    rec = Recorder()
    v, handler = make(tmp_path, exit_fn=rec)
    rec.handler = handler
    for i in range(6):
        handler.save_checkpoint_if_preempted(checkpoint_number=100 + i)
        v.assign_add(np.ones(3))
        if i == 2:
            os.kill(os.getpid(), signal.SIGUSR1)
    handler.close()
    assert rec.calls == [3] and handler.total_run_calls == 6
    assert os.path.exists(tmp_path / "ckpt-103.index.json")  # the given checkpoint_number
    v2, handler2 = make(tmp_path, exit_fn=rec)
    handler2.close()
    assert handler2.total_run_calls == 3
    np.testing.assert_array_equal(v2.numpy(), np.full(3, 3.0))


def test_watch_preemption_scope_bounds_the_watch(tmp_path):
    before = signal.getsignal(signal.SIGUSR1)
    rec = Recorder()
    v, handler = make(tmp_path, exit_fn=rec)
    rec.handler = handler
    with handler.watch_preemption_scope():
        train(v, handler, 4, signal_at=1)
    assert rec.calls == [2]
    assert signal.getsignal(signal.SIGUSR1) == before
    handler.close()


def test_a_checkpoint_manager_is_used_as_given(tmp_path):
    rec = Recorder()
    v = hd.Variable(np.zeros(2))
    manager = CheckpointManager(Checkpoint(v=v), str(tmp_path), max_to_keep=3)
    handler = PreemptionCheckpointHandler(
        None, manager, termination_config=TerminationConfig(exit_fn=rec)
    )
    rec.handler = handler
    for i in range(handler.total_run_calls, 3):
        handler.run(v.assign_add, np.ones(2))
        if i == 0:
            os.kill(os.getpid(), signal.SIGTERM)
    handler.close()
    assert rec.calls == [1]
    assert manager.latest_checkpoint is not None
    assert manager.latest_checkpoint.endswith("ckpt-1")
