"""What the GPU suite and the install say: which tests skip without Numba CUDA, the extras,
and the wheels named in messages (CUDA 13 first, CUDA 12 only next to it)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from tests.gpu import conftest as gpu_conftest

REPO = Path(__file__).resolve().parents[2]
GPU = (True, "1 GPU(s): NVIDIA H100")
NO_GPU = (False, "no GPU: cudaGetDeviceCount() failed")
NO_NUMBA = (False, "no Numba CUDA: numba.cuda.is_available() is False")


def test_without_numba_cuda_only_the_kernel_tests_skip():
    # the old conftest skipped the whole suite (CuPy and NCCL tests too) in this case
    assert gpu_conftest.skip_reason(False, GPU, NO_NUMBA) is None
    assert gpu_conftest.skip_reason(True, GPU, NO_NUMBA) == NO_NUMBA[1]
    assert gpu_conftest.skip_reason(True, GPU, (True, "")) is None
    assert gpu_conftest.skip_reason(False, NO_GPU, (True, "")) == NO_GPU[1]
    assert gpu_conftest.skip_reason(True, NO_GPU, NO_NUMBA) == NO_GPU[1]
    assert "test_kernels_gpu.py" in gpu_conftest.KERNEL_MODULES
    for name in gpu_conftest.KERNEL_MODULES:
        assert (REPO / "tests" / "gpu" / name).exists(), name


def test_gpu_status_does_not_ask_numba():
    source = ast.unparse(ast.parse(
        (REPO / "tests" / "gpu" / "conftest.py").read_text()
    ))
    tree = ast.parse(source)
    status = next(n for n in ast.walk(tree)
                  if isinstance(n, ast.FunctionDef) and n.name == "gpu_status")
    assert "numba" not in ast.unparse(status)


def test_the_gpu_extras_name_todays_wheels():
    text = (REPO / "pyproject.toml").read_text()  # (tomllib is Python >= 3.11 only)
    extras = {m[1]: re.findall(r'"([^"]+)"', m[2])
              for m in re.finditer(r'^([\w-]+) = \[(.*?)\]$', text, re.MULTILINE)}
    names = {k: sorted(d.split(">")[0].split("=")[0] for d in v) for k, v in extras.items()}
    assert names["gpu"] == ["cupy-cuda13x", "numba-cuda[cu13]", "nvidia-nccl-cu13"]
    assert names["gpu-cuda12"] == ["cupy-cuda12x", "numba-cuda[cu12]", "nvidia-nccl-cu12"]


def _strings(path: Path) -> list[str]:
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            out.append(node.value)
        elif isinstance(node, ast.JoinedStr):
            out.append("".join(v.value for v in node.values
                               if isinstance(v, ast.Constant) and isinstance(v.value, str)))
    return out


def test_messages_naming_cuda12_wheels_name_the_cuda13_ones_too():
    files = [*(REPO / "hpcdist").rglob("*.py"), *(REPO / "tests" / "gpu").rglob("*.py"),
             *REPO.glob("benchmarks/gpu_*.py")]
    cuda12 = ("cupy-cuda12x", "nvidia-nccl-cu12", "[cu12]")
    cuda13 = ("cupy-cuda13x", "nvidia-nccl-cu13", "[cu13]", "hpcdist[gpu]")
    bad = [f"{path.relative_to(REPO)}: {text[:90]!r}" for path in files
           for text in _strings(path)
           if any(w in text for w in cuda12) and not any(w in text for w in cuda13)]
    assert not bad, "\n".join(bad)
