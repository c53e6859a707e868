"""The demo (``examples/train_digits.py``) is seeded: two runs on 1, 2 or 4 ranks repeat bit
for bit, different rank counts agree to float32 rounding, and the figures the README and the
quickstart show are the ones a user gets."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
MPIRUN = Path(sys.executable).parent / "mpirun"

pytestmark = pytest.mark.timeout(900)


def _demo(n: int, path: Path) -> dict[str, list[float]]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OMPI_COMM", "PMIX_"))}
    env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", OMP_NUM_THREADS="1")
    command = ["examples/train_digits.py", "--verbose", "0", "--history", str(path)]
    if n > 1:
        command = [str(MPIRUN), "--oversubscribe", "-n", str(n), sys.executable, *command]
    else:
        command = [sys.executable, *command]
    done = subprocess.run(command, env=env, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    hexed = json.loads(path.read_text())
    return {k: [float.fromhex(v) for v in vs] for k, vs in hexed.items()}


def test_the_demo_repeats_bit_for_bit_and_matches_the_docs(tmp_path):
    runs = {}
    for n in (1, 2, 4):
        runs[n] = _demo(n, tmp_path / f"{n}a.json")
        assert _demo(n, tmp_path / f"{n}b.json") == runs[n], n  # every float, bit for bit
    first = runs[2]
    assert len(first["loss"]) == 20 and set(first) >= {"loss", "val_accuracy", "test_loss"}
    # Other rank counts sum the float32 per-replica partial sums in another order: the
    # figures agree to float32 rounding (docs/training.md, "Reproducible runs").
    for n in (1, 4):
        assert runs[n].keys() == first.keys()
        for key, values in first.items():
            np.testing.assert_allclose(runs[n][key], values, rtol=2e-5, err_msg=f"{n} {key}")
    for page in ("README.md", "docs/quickstart.md"):
        text = (ROOT / page).read_text()
        for epoch in (1, 20):
            shown = re.search(
                rf"Epoch {epoch}/20 - 21 steps - [\d.]+s - loss: ([\d.]+) - accuracy: ([\d.]+)"
                r" - val_loss: ([\d.]+) - val_accuracy: ([\d.]+)",
                text,
            )
            assert shown, (page, epoch)
            got = [first[k][epoch - 1] for k in ("loss", "accuracy", "val_loss", "val_accuracy")]
            assert list(shown.groups()) == [f"{v:.4f}" for v in got], (page, epoch)
        assert f"test loss: {first['test_loss'][0]:.4f}" in text, page
        assert f"test accuracy: {first['test_accuracy'][0]:.4f}" in text, page
