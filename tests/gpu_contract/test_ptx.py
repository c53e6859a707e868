"""Every CUDA kernel of hpcdist compiles to PTX for sm_80 and sm_90, for every argument-type
signature its host code launches it with, on a machine without a GPU (NVVM comes with
numba-cuda's ``[cu13]`` extra). Integer rows never pass through a float conversion."""

from __future__ import annotations

import ast
import importlib
import re
from functools import cache
from pathlib import Path
from typing import Any

import pytest

from tests.gpu_contract.kernel_signatures import compile_on_cpu, dispatched_signatures

ROOT = Path(__file__).resolve().parents[2] / "hpcdist"
CCS = [(8, 0), (9, 0)]
#: A PTX conversion instruction (cvt.rn.f64.s64, cvt.rzi.s64.f64, cvt.u32.u64, ...).
CVT = re.compile(r"\bcvt(?:\.[a-z0-9]+)+")
FLOAT_TYPES = {"f16", "f32", "f64", "bf16"}
#: Kernels whose integer signatures must stay integer all the way (pack, unpack, reduce).
INTEGER_EXACT = ("_pack_kernel", "_unpack_kernel", "_reduce_kernel")


@cache
def signatures() -> dict[str, frozenset[tuple[Any, ...]]]:
    return {name: frozenset(sigs) for name, sigs in dispatched_signatures().items()}


def _kernels_in_source() -> set[str]:
    """``module.name`` of every ``@cuda.jit`` function of hpcdist that is not a device function."""
    found = set()
    for path in sorted(ROOT.rglob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        module = ".".join(path.relative_to(ROOT.parent).with_suffix("").parts)
        for node in ast.walk(tree):
            if not isinstance(node, ast.FunctionDef):
                continue
            for deco in node.decorator_list:
                call = deco if isinstance(deco, ast.Call) else None
                target = call.func if call else deco
                if ast.unparse(target) not in ("cuda.jit", "numba.cuda.jit"):
                    continue
                device = any(k.arg == "device" and ast.unparse(k.value) == "True"
                             for k in (call.keywords if call else []))
                if not device:
                    found.add(f"{module}.{node.name}")
    return found


def test_every_kernel_in_the_source_is_launched_by_the_host_code():
    in_source = _kernels_in_source()
    assert len(in_source) >= 13, in_source  # pack, unpack, reduce, mean and 9 optimizer kernels
    assert in_source == set(signatures()), (
        "kernels without recorded launches (add their host calls to kernel_signatures.py): "
        f"{sorted(in_source - set(signatures()))}; recorded but not found: "
        f"{sorted(set(signatures()) - in_source)}"
    )


def _compile(name: str, sig: tuple[Any, ...], cc: tuple[int, int]) -> str:
    from numba import cuda  # lazy: numba.cuda

    module, fn = name.rsplit(".", 1)
    kernel = getattr(importlib.import_module(module), fn)
    with compile_on_cpu(cc):
        ptx, _ = cuda.compile_ptx(kernel.py_func, sig, cc=cc)
    return ptx


def float_conversions(ptx: str) -> list[str]:
    """The distinct conversions from or to a float type in ``ptx``."""
    return sorted({c for c in CVT.findall(ptx) if FLOAT_TYPES & set(c.split(".")[1:])})


def _is_integer(sig: tuple[Any, ...]) -> bool:
    """Whether the kernel's data (its first argument: flat buffer or slots) is integer."""
    from numba import types  # lazy: numba

    return isinstance(sig[0].dtype, types.Integer)


@pytest.mark.parametrize("cc", CCS, ids=lambda cc: f"sm_{cc[0]}{cc[1]}")
@pytest.mark.parametrize("name", sorted(signatures()), ids=lambda n: n.rsplit(".", 1)[1])
def test_kernel_compiles_to_ptx_for_every_dispatched_signature(name, cc):
    for sig in sorted(signatures()[name], key=str):
        ptx = _compile(name, sig, cc)
        assert ".entry" in ptx and f".target sm_{cc[0]}{cc[1]}" in ptx, sig
        if name.endswith(INTEGER_EXACT) and _is_integer(sig):
            converts = float_conversions(ptx)
            assert not converts, f"{name}{sig} converts through floats: {converts}"


def test_the_float_conversion_check_sees_a_float_round_trip():
    # the check above would pass vacuously if the pattern missed NVVM's spelling
    ptx = "cvt.rn.f64.s64 %fd1, %rd5;\n cvt.rzi.s64.f64 %rd6, %fd2;\n cvt.u32.u64 %r1, %rd1;"
    assert float_conversions(ptx) == ["cvt.rn.f64.s64", "cvt.rzi.s64.f64"]


def test_integer_reductions_are_integer_signatures():
    from numba import types

    reduce_sigs = signatures()["hpcdist.kernels.cuda._reduce_kernel"]
    int64 = [s for s in reduce_sigs if s[0].dtype == types.int64]
    assert int64 and all(_is_integer(s) for s in int64)
    mean = signatures()["hpcdist.kernels.cuda._mean_kernel"]
    assert {str(s[0].dtype) for s in mean} == {"float16", "float32", "float64"}
