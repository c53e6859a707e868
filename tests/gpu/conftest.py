"""GPU tests: decide once whether a usable GPU exists; without one, skip every test here.

The probe (:func:`gpu_status`) checks, in order, that CuPy imports, that
``cudaGetDeviceCount()`` is positive, that a tiny CuPy kernel runs on GPU 0
and gives the right answer, and gives the right answer. Its first failure
becomes the skip reason of every test under ``tests/gpu``, so
``pytest -rs tests/gpu`` says exactly why nothing ran, e.g.
``no GPU: CuPy is not installed (...)`` or
``no GPU: cudaGetDeviceCount() == 0 (CUDA_VISIBLE_DEVICES='')``. Where CuPy runs
but ``numba.cuda.is_available()`` is False (numba-cuda without its ``[cu13]``
extra), only the tests of hpcdist's Numba kernels skip (:func:`kernels_status`);
the CuPy and NCCL tests still run (the engine then packs with CuPy copies).

Tests marked ``mpi`` (``test_shared_gpu_mpi.py``) run only under
``mpirun -n 2 python -m pytest --with-mpi -m mpi tests/gpu``; a one-process run
deselects them.

Fixtures: ``cp`` (the CuPy module), ``gpus`` (how many GPUs this process
sees), ``nccl_ok`` (skips with the reason when NCCL cannot be used; else the
NCCL version text) and ``spin`` (a kernel that keeps a stream busy for a
while, to show that a call returned without waiting for its stream).
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

HERE = Path(__file__).resolve().parent


def _visible() -> str:
    value = os.environ.get("CUDA_VISIBLE_DEVICES")
    return "CUDA_VISIBLE_DEVICES unset" if value is None else f"CUDA_VISIBLE_DEVICES={value!r}"


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0][:200] if text else ''}"


@functools.lru_cache(maxsize=1)
def gpu_status() -> tuple[bool, str]:
    """``(True, "N GPU(s): name")`` when the GPU tests can run, else ``(False, "no GPU: why")``.

    Runs once per process (cached). Never raises.

    Example: ``ok, why = gpu_status()``; on a machine without CuPy ``why`` starts
    with ``"no GPU: CuPy is not installed"``.
    """
    if os.environ.get("NUMBA_ENABLE_CUDASIM") == "1":
        return False, (
            "no GPU: NUMBA_ENABLE_CUDASIM=1 turns on Numba's CUDA simulator; the tests under "
            "tests/gpu need the real device (unset the variable)"
        )
    try:
        import cupy
    except ImportError as exc:
        return False, (
            f"no GPU: CuPy is not installed ({exc}); install cupy-cuda13x (cupy-cuda12x for "
            "CUDA 12 drivers)"
        )
    except Exception as exc:  # noqa: BLE001 - a broken CuPy install: report it, skip
        return False, f"no GPU: CuPy fails to import ({_first_line(exc)})"
    try:
        count = int(cupy.cuda.runtime.getDeviceCount())
    except Exception as exc:  # noqa: BLE001 - no driver, no device: CUDARuntimeError
        return False, f"no GPU: cudaGetDeviceCount() failed ({_first_line(exc)}; {_visible()})"
    if count <= 0:
        return False, f"no GPU: cudaGetDeviceCount() == 0 ({_visible()})"
    try:
        with cupy.cuda.Device(0):
            total = float((cupy.arange(8, dtype=cupy.float32) * 2).sum())
            name = cupy.cuda.runtime.getDeviceProperties(0)["name"]
    except Exception as exc:  # noqa: BLE001 - e.g. no NVRTC, or a driver too old for CuPy
        return False, f"no GPU: a tiny CuPy kernel failed on GPU 0 ({_first_line(exc)})"
    if total != 56.0:
        return False, f"no GPU: a tiny CuPy kernel on GPU 0 returned {total}, expected 56.0"
    if isinstance(name, bytes):
        name = name.decode(errors="replace")
    return True, f"{count} GPU(s): {name}"


@functools.lru_cache(maxsize=1)
def kernels_status() -> tuple[bool, str]:
    """``(True, "")`` when Numba can launch CUDA kernels, else ``(False, "why")``. Cached.

    Only the tests of hpcdist's own Numba kernels need it (module ``test_kernels_gpu.py``
    and tests marked ``numba_cuda``); CuPy and NCCL tests run without it.
    """
    try:
        from numba import cuda
    except Exception as exc:  # noqa: BLE001
        return False, f"no Numba CUDA: numba.cuda fails to import ({_first_line(exc)})"
    if not cuda.is_available():
        return False, (
            "no Numba CUDA: numba.cuda.is_available() is False (CuPy runs, but Numba finds no "
            "usable CUDA driver or libNVVM; install numba-cuda[cu13], or numba-cuda[cu12] "
            "for CUDA 12 drivers)"
        )
    return True, ""


def skip_reason(
    needs_kernels: bool, gpu: tuple[bool, str], kernels: tuple[bool, str]
) -> str | None:
    """Why one GPU test skips (``None``: it runs): no GPU skips all, no Numba CUDA only the
    tests that launch hpcdist's Numba kernels.

    Example: ``skip_reason(False, (True, "1 GPU(s)"), (False, "no Numba CUDA"))`` is None.
    """
    if not gpu[0]:
        return gpu[1]
    if needs_kernels and not kernels[0]:
        return kernels[1]
    return None


#: Modules whose tests launch hpcdist's Numba kernels (the kernels, and fused optimizer updates).
KERNEL_MODULES = frozenset({"test_kernels_gpu.py", "test_training_gpu.py",
                            "test_keras_basics_gpu.py"})


def _needs_kernels(item: pytest.Item) -> bool:
    return item.path.name in KERNEL_MODULES or item.get_closest_marker("numba_cuda") is not None


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "numba_cuda: the test launches hpcdist's Numba CUDA kernels"
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark the tests under ``tests/gpu`` skipped, with the reason, where they cannot run.

    (A conftest's collection hook sees the whole session's items: only ours are marked.)
    """
    ours = [item for item in items if HERE == item.path.parent or HERE in item.path.parents]
    if not ours:
        return
    if not config.getoption("with_mpi", default=False):  # multi-rank tests: mpirun only
        multi = [item for item in ours if item.get_closest_marker("mpi") is not None]
        if multi:
            config.hook.pytest_deselected(items=multi)
            items[:] = [item for item in items if item not in multi]
            ours = [item for item in ours if item not in multi]
    gpu = gpu_status()
    for item in ours:
        needs = _needs_kernels(item)
        why = skip_reason(needs, gpu, kernels_status() if needs and gpu[0] else (True, ""))
        if why is not None:
            item.add_marker(pytest.mark.skip(reason=why))


def _require_gpu() -> None:
    ok, why = gpu_status()
    if not ok:
        pytest.skip(why)


@pytest.fixture(scope="session")
def cp() -> Any:
    """The CuPy module (the test is skipped without a usable GPU)."""
    _require_gpu()
    import cupy

    return cupy


@pytest.fixture(scope="session")
def gpus() -> int:
    """How many GPUs this process sees (at least 1: the test is skipped otherwise)."""
    _require_gpu()
    import cupy

    return int(cupy.cuda.runtime.getDeviceCount())


@pytest.fixture(scope="session")
def nccl_ok() -> str:
    """The NCCL version text; skips the test, with the reason, when NCCL cannot be used."""
    _require_gpu()
    try:
        from hpcdist.collectives.nccl import nccl_available
    except ImportError as exc:
        pytest.skip(f"no NCCL: hpcdist.collectives.nccl cannot be imported ({exc})")
    ok, why = nccl_available()
    if not ok:
        pytest.skip(f"no NCCL: {why}")
    return why


@pytest.fixture(scope="session")
def spin(cp: Any) -> Callable[[Any, float], None]:
    """``spin(stream, seconds)``: enqueue a one-thread kernel that busy-waits on the GPU.

    Work enqueued after it on the same stream starts only when it ends, so a test
    can check that a call returned while its work was still queued (``not stream.done``).
    """
    from hpcdist.bench.gpu_spin import spin

    return lambda stream, seconds: spin(cp, stream, seconds)
