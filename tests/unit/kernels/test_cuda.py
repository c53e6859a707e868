"""The CUDA kernels under Numba's CUDA simulator (their PTX: ``tests/gpu_contract``)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tests.unit.kernels.simulator import imports_numba_cuda, run_cases_under_simulator

HERE = Path(__file__).parent


def test_kernels_run_under_the_cuda_simulator():
    run_cases_under_simulator(HERE / "sim_cases.py")


def test_importing_the_cpu_kernels_does_not_import_numba_cuda():
    assert not imports_numba_cuda("hpcdist.kernels")


class _CaiOnly:
    """Exposes ``__cuda_array_interface__`` only, as a CuPy array does."""

    __cuda_array_interface__ = {"shape": (3,), "typestr": "<f4", "data": (4096, False),
                                "version": 3, "strides": None}
    shape, dtype = (3,), np.dtype(np.float32)


def test_as_device_wraps_a_cupy_like_array_without_a_gpu(monkeypatch):
    # numba.cuda has no is_cuda_ndarray (numba-cuda 0.30): on a GPU every pack, unpack and
    # optimizer update passed through as_device and raised AttributeError
    from hpcdist.kernels import cuda as kernels

    wrapped = []
    monkeypatch.setattr(kernels.cuda, "as_cuda_array",
                        lambda x, sync=True: wrapped.append((x, sync)) or "numba view")
    x = _CaiOnly()
    assert kernels.as_device(x, "x") == "numba view"
    assert wrapped == [(x, False)]  # no sync: the caller orders the work on its stream

    class NumbaArray(_CaiOnly):
        __cuda_ndarray__ = True

    y = NumbaArray()
    assert kernels.as_device(y, "y") is y and len(wrapped) == 1
    with pytest.raises(TypeError, match="expected a device array"):
        kernels.as_device(np.ones(3), "z")
