"""Helpers for the CUDA kernel tests: a fresh process under Numba's CUDA simulator."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path


def run_cases_under_simulator(cases: Path) -> None:
    """Run the pytest file ``cases`` with ``NUMBA_ENABLE_CUDASIM=1``; fail if any case fails.

    The variable must be set before numba.cuda is imported, hence a fresh process.
    """
    env = {**os.environ, "NUMBA_ENABLE_CUDASIM": "1"}
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-W",
         "ignore::RuntimeWarning", str(cases)],
        env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-3000:]
    assert " passed" in result.stdout and "skipped" not in result.stdout


def imports_numba_cuda(module: str) -> bool:
    """Whether importing ``module`` in a fresh process imports ``numba.cuda``."""
    code = f"import sys, {module}; print('numba.cuda' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    return result.stdout.strip() == "True"
