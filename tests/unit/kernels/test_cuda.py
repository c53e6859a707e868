"""The CUDA kernels: under Numba's CUDA simulator, and compiled to PTX where libNVVM is."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.unit.kernels.simulator import imports_numba_cuda, run_cases_under_simulator

HERE = Path(__file__).parent


def test_kernels_run_under_the_cuda_simulator():
    run_cases_under_simulator(HERE / "sim_cases.py")


def test_importing_the_cpu_kernels_does_not_import_numba_cuda():
    assert not imports_numba_cuda("hpcdist.kernels")


def _nvvm_available() -> bool:
    if os.environ.get("NUMBA_ENABLE_CUDASIM") == "1":
        return False
    try:
        from numba.cuda.cudadrv import nvvm

        nvvm.NVVM()
    except Exception:  # no libNVVM (no CUDA toolkit) on this machine
        return False
    return True


@pytest.mark.skipif(not _nvvm_available(), reason="libNVVM (CUDA toolkit) not installed")
def test_kernels_compile_to_ptx_for_the_hardware_path(monkeypatch):
    # The raw-address intrinsics only exist on real hardware; compiling the kernels to
    # PTX checks their code generation without a GPU (device functions ask the current
    # device for its compute capability, so a fake device answers).
    import numba.cuda.dispatcher
    from numba import cuda, types

    from hpcdist.kernels import cuda as kernels

    class _Device:
        compute_capability = (8, 0)

    monkeypatch.setattr(numba.cuda.dispatcher, "get_current_device", lambda: _Device())
    table = types.Array(types.int64, 1, "C")
    for dtype, acc in [(types.float16, types.float32), (types.int64, types.int64)]:
        flat = types.Array(dtype, 1, "C")
        for kernel in (kernels._pack_kernel, kernels._unpack_kernel):
            args = (flat, table, table, types.int64, acc, types.boolean)
            ptx, _ = cuda.compile_ptx(kernel.py_func, args, cc=(8, 0))
            assert ".entry" in ptx
        slots, out = types.Array(dtype, 2, "A"), types.Array(dtype, 1, "A")
        ints = (types.int64,) * 2
        # slots, lo, count, out, out_lo, op, divisor, zero
        args = (slots, *ints, out, *ints, acc, acc)
        ptx, _ = cuda.compile_ptx(kernels._reduce_kernel.py_func, args, cc=(8, 0))
        assert ".entry" in ptx
