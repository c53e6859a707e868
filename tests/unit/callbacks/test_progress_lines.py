"""Progress where a bar cannot work (under mpirun/srun, output in a file): plain lines at a
steady interval, never a carriage return; a live bar on a terminal. The end-to-end tests run a
real ``fit`` in a pseudo-terminal, into a file, and under ``mpirun`` in a pseudo-terminal."""

from __future__ import annotations

import fcntl
import io
import os
import pty
import re
import select
import struct
import subprocess
import sys
import termios
import time
from pathlib import Path

import pytest

from hpcdist.callbacks import CallbackList, ProgressBar
from hpcdist.callbacks import progress as progress_mod
from hpcdist.callbacks.progress import live_display
from tests.unit.callbacks.test_progress import FakeModel

ROOT = Path(__file__).resolve().parents[3]
SCRIPT = Path(__file__).parent / "scripts" / "fit_progress.py"
MPIRUN = Path(sys.executable).parent / "mpirun"
LINE = re.compile(
    r"Epoch 1/1 - step (\d+)/100 \((\d+)%\) - [\d.]+ steps/s - ETA [\d:]+s? - loss: [\d.]+"
)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _epoch(monkeypatch, seconds_per_step: float, steps: int | None = 100, **kwargs) -> str:
    clock = Clock()
    monkeypatch.setattr(progress_mod.time, "perf_counter", clock)
    out = io.StringIO()
    bar = ProgressBar(verbose=1, stream=out, **kwargs)
    cbs = CallbackList([bar], model=FakeModel(), epochs=1, steps=steps)
    cbs.on_train_begin()
    cbs.on_epoch_begin(0)
    for batch in range(100):
        clock.now += seconds_per_step
        cbs.on_train_batch_end(batch, {"loss": 1.0 / (batch + 1)})
    cbs.on_epoch_end(0, {"loss": 0.01})
    cbs.on_train_end()
    return out.getvalue()


def test_a_long_epoch_prints_a_line_per_tenth_then_the_summary(monkeypatch):
    text = _epoch(monkeypatch, seconds_per_step=1.0)  # 100 s: a tenth every 10 s
    assert "\r" not in text
    lines = text.splitlines()
    steps = [int(LINE.fullmatch(line).group(1)) for line in lines[:-1]]
    assert steps == [10, 20, 30, 40, 50, 60, 70, 80, 90], lines
    assert "ETA 1:30" in lines[0] and "1 steps/s" in lines[0] and "loss: 0.1000" in lines[0]
    assert re.fullmatch(r"Epoch 1/1 - 100 steps - 100\.0s - loss: 0\.0100", lines[-1])


def test_a_short_epoch_prints_only_its_summary_line(monkeypatch):
    text = _epoch(monkeypatch, seconds_per_step=0.01)  # 1 s in all: below the 5 s spacing
    assert text.count("\n") == 1 and text.startswith("Epoch 1/1 - 100 steps")


def test_tenths_closer_than_the_minimum_interval_are_skipped(monkeypatch):
    text = _epoch(monkeypatch, seconds_per_step=0.3)  # a tenth every 3 s, lines >= 5 s apart
    steps = [int(LINE.fullmatch(line).group(1)) for line in text.splitlines()[:-1]]
    assert steps == [17, 34, 51, 68, 85], text  # the first step 5 s after the last line


def test_slow_steps_without_a_total_print_every_30_seconds(monkeypatch):
    text = _epoch(monkeypatch, seconds_per_step=7.0, steps=None)  # 700 s, no total
    lines = text.splitlines()[:-1]
    assert [re.match(r"Epoch 1/1 - step (\d+) - ", x).group(1) for x in lines][:3] == [
        "5", "10", "15",
    ]  # fmt: skip
    assert len(lines) == 20 and all("ETA" not in x for x in lines)  # every 35 s (5 steps)


def test_verbose_2_and_non_chiefs_print_no_progress_lines(monkeypatch):
    clock = Clock()
    monkeypatch.setattr(progress_mod.time, "perf_counter", clock)
    for verbose, chief in ((2, True), (1, False)):
        out = io.StringIO()
        cbs = CallbackList([ProgressBar(verbose=verbose, stream=out)], model=FakeModel(chief))
        cbs.set_params({"epochs": 1, "steps": 100})
        cbs.on_epoch_begin(0)
        for batch in range(100):
            clock.now += 1.0
            cbs.on_train_batch_end(batch, {"loss": 1.0})
        assert "step" not in out.getvalue()


def test_live_display_needs_a_terminal_and_no_launcher():
    assert not live_display(io.StringIO(), {})
    parent, child = pty.openpty()
    try:
        with os.fdopen(child, "w", closefd=False) as tty:
            assert live_display(tty, {})
            assert not live_display(tty, {"OMPI_COMM_WORLD_SIZE": "2", "OMPI_COMM_WORLD_RANK": "0",
                                          "OMPI_COMM_WORLD_LOCAL_RANK": "0",
                                          "OMPI_COMM_WORLD_LOCAL_SIZE": "2"})  # fmt: skip
    finally:
        os.close(parent)
        os.close(child)


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OMPI_", "PMIX_", "PMI_"))}
    env.update(
        OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", OMP_NUM_THREADS="1",
        PYTHONPATH=str(ROOT), COLUMNS="120",
    )  # fmt: skip
    env.pop("SLURM_STEP_ID", None)
    return env


def _in_pty(command: list[str], timeout: float = 240) -> str:
    """Run ``command`` with its stdout and stderr on a pseudo-terminal; return what it wrote."""
    parent, child = pty.openpty()
    fcntl.ioctl(child, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 120, 0, 0))  # 120 columns
    proc = subprocess.Popen(command, stdout=child, stderr=child, env=_env(), cwd=ROOT)
    os.close(child)
    chunks, deadline = [], time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([parent], [], [], 0.5)
            if ready:
                try:
                    data = os.read(parent, 65536)
                except OSError:  # EIO: the terminal's other end closed
                    break
                if not data:
                    break
                chunks.append(data)
            elif proc.poll() is not None:
                break
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
        os.close(parent)
    return b"".join(chunks).decode(errors="replace")


@pytest.mark.timeout(300)
def test_plain_python_on_a_terminal_shows_a_live_bar():
    pytest.importorskip("tqdm")
    text = _in_pty([sys.executable, str(SCRIPT)])
    assert re.search(r"\rEpoch 1/2: +\d+%.*\d+/50", text), text[-2000:]  # tqdm redraws
    assert re.search(r"Epoch 2/2 - 50 steps - [\d.]+s - loss: [\d.]+ - acc: [\d.]+", text)


@pytest.mark.timeout(300)
def test_output_to_a_file_gets_lines_and_never_a_carriage_return(tmp_path):
    log = tmp_path / "log"
    with open(log, "w") as f:
        subprocess.run(
            [sys.executable, str(SCRIPT), "0.2"], stdout=f, stderr=subprocess.STDOUT,
            env=_env(), cwd=ROOT, timeout=240, check=True,
        )  # fmt: skip
    text = log.read_text()
    assert "\r" not in text, text
    assert re.search(r"Epoch 1/2 - step \d+/50 \(\d+%\) - [\d.]+ steps/s - ETA \d+s - loss:", text)
    assert re.search(r"Epoch 2/2 - 50 steps - [\d.]+s - loss: ", text), text


@pytest.mark.timeout(300)
def test_under_mpirun_in_a_terminal_the_chief_prints_lines():
    text = _in_pty([str(MPIRUN), "--oversubscribe", "-n", "2", sys.executable, str(SCRIPT), "0.2"])
    lines = [line for line in text.replace("\r\n", "\n").split("\n") if line.startswith("Epoch")]
    assert "\r" not in text.replace("\r\n", "\n"), text[-2000:]
    progress = [line for line in lines if " - step " in line]
    assert progress, lines
    assert all(re.fullmatch(r"Epoch \d/2 - step .*loss: [\d.]+.*", x) for x in progress), lines
    summary = [line for line in lines if " - 50 steps - " in line]
    assert len(summary) == 2, lines  # the chief only
