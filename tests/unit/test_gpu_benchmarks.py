"""The GPU benchmarks without a GPU: each refuses with exit code 2; their pure helpers work.

The scripts run as subprocesses with ``CUDA_VISIBLE_DEVICES=""`` so that they
find no GPU on any machine (with or without CuPy) and must refuse before
measuring or writing anything.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import math
import os
import platform
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
BENCHMARKS = ROOT / "benchmarks"
SCRIPTS = ["gpu_kernels", "gpu_nccl", "gpu_training"]


@pytest.fixture
def bench(monkeypatch):
    """``importlib.import_module`` with ``benchmarks/`` on ``sys.path``, as the scripts see it."""
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    return importlib.import_module


@pytest.fixture
def common(bench):
    return bench("gpu_common")


def _run(name: str, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "1"}
    env.pop("NUMBA_ENABLE_CUDASIM", None)
    return subprocess.run(
        [sys.executable, str(BENCHMARKS / f"{name}.py"), *args],
        capture_output=True, text=True, env=env, timeout=120, cwd=ROOT,
    )  # fmt: skip


@pytest.mark.timeout(180)
@pytest.mark.parametrize("name", SCRIPTS)
def test_each_script_refuses_without_a_gpu_with_exit_code_2(name, tmp_path):
    proc = _run(name, "--out", str(tmp_path))
    assert proc.returncode == 2, proc.stdout + proc.stderr
    first = proc.stderr.strip().splitlines()[-1]
    assert first.startswith(f"{name}: cannot run: no usable GPU: "), proc.stderr
    assert "CuPy is not installed" in first or "cudaGetDeviceCount()" in first, first
    assert first.endswith("Nothing was measured or written.")
    assert list(tmp_path.iterdir()) == []  # no JSON, no plot


@pytest.mark.timeout(180)
@pytest.mark.parametrize("name", SCRIPTS)
def test_each_script_prints_its_help_without_a_gpu(name):
    proc = _run(name, "--help")
    assert proc.returncode == 0, proc.stderr
    assert f"usage: python benchmarks/{name}.py" in proc.stdout
    assert "--out" in proc.stdout


def test_summarize(common):
    stats = common.summarize([4.0, 1.0, 3.0, 2.0])
    assert stats["n"] == 4
    assert (stats["median"], stats["min"], stats["max"], stats["mean"]) == (2.5, 1.0, 4.0, 2.5)
    assert stats["stdev"] == pytest.approx(math.sqrt(5 / 3))  # sample stdev: n - 1
    assert common.summarize([7.0]) == {
        "n": 1, "median": 7.0, "min": 7.0, "max": 7.0, "mean": 7.0, "stdev": 0.0,
    }  # fmt: skip
    with pytest.raises(ValueError, match="no samples"):
        common.summarize([])
    with pytest.raises(ValueError, match="finite"):
        common.summarize([1.0, float("nan")])


def test_bandwidth_ratio_and_overhead(common):
    assert common.gb_per_s(3e9, 1.5) == pytest.approx(2.0)
    assert common.gb_per_s(64 << 20, 1e-3) == pytest.approx(67.108864)
    with pytest.raises(ValueError, match="positive time"):
        common.gb_per_s(100, 0.0)
    assert common.ratio_status(0.8, 0.8) == "PASS"
    assert common.ratio_status(0.79, 0.8) == "FAIL"
    assert common.overhead_percent(1.1, 1.0) == pytest.approx(10.0)
    assert common.overhead_percent(45e-6, 50e-6) == pytest.approx(-10.0)
    with pytest.raises(ValueError, match="baseline"):
        common.overhead_percent(1.0, 0.0)


def test_iterations_for(common):
    assert common.iterations_for(256 << 20) == 4
    assert common.iterations_for(512 << 20) == 3  # never fewer than lo
    assert common.iterations_for(4096) == 200  # never more than hi
    assert common.iterations_for(1 << 20, budget=1 << 24, lo=1, hi=1000) == 16
    with pytest.raises(ValueError, match="bytes_per_call"):
        common.iterations_for(0)


def test_format_table(common):
    text = common.format_table(["size", "GB/s"], [["1 MiB", 12.5], ["256 MiB", 3]])
    assert text.splitlines() == [
        "   size  GB/s",
        "-------  ----",
        "  1 MiB  12.5",
        "256 MiB     3",
    ]
    with pytest.raises(ValueError, match="row 1 has 1 cells; expected 2"):
        common.format_table(["a", "b"], [[1, 2], [3]])


def test_write_report_writes_plain_json_only(common, tmp_path):
    report = {"rows": [{"bytes": 4096, "gb_per_s": 1.5}], "target": {"status": "PASS"}}
    path = common.write_report("gpu_demo", report, tmp_path)
    assert path == tmp_path / "gpu_demo.json"
    assert json.loads(path.read_text()) == report
    with pytest.raises(TypeError, match="not plain JSON"):
        common.write_report("bad_numpy", {"x": np.float32(1.0)}, tmp_path)
    with pytest.raises(TypeError, match="not plain JSON"):
        common.write_report("bad_nan", {"x": float("nan")}, tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["gpu_demo.json"]
    assert common.RESULTS == BENCHMARKS / "results"


def test_refuse_exits_2_with_the_reason(common, capsys):
    with pytest.raises(SystemExit) as info:
        common.refuse("gpu_x", "NCCL is not available: no libnccl")
    assert info.value.code == common.EXIT_NO_GPU == 2
    assert capsys.readouterr().err == (
        "gpu_x: cannot run: NCCL is not available: no libnccl. Nothing was measured or written.\n"
    )


def test_gpu_problem_names_the_missing_cupy(common):
    if importlib.util.find_spec("cupy") is not None:
        pytest.skip("CuPy is installed here: the message for a missing CuPy cannot be shown")
    assert common.gpu_problem().startswith("CuPy is not installed")


def test_machine_info_without_a_gpu(common):
    info = common.machine_info()
    assert info["python"] == platform.python_version()
    assert info["numpy"] == np.__version__
    assert "gpu" not in info


def test_kernel_benchmark_splits_buffers_into_64_tensors(bench):
    kernels = bench("gpu_kernels")
    assert kernels.split_sizes(10, 3) == [4, 3, 3]
    sizes = kernels.split_sizes((1 << 20) // 4, kernels.TENSORS)
    assert len(sizes) == 64 and sum(sizes) == 1 << 18 and max(sizes) - min(sizes) <= 1
    assert kernels.TRAFFIC == {"pack_cuda": 2, "unpack_cuda": 2, "reduce_slots_cuda": 3,
                               "adam": 7}


def test_training_benchmark_data_and_medians(bench):
    training = bench("gpu_training")
    x, y = training.synthetic("digits")
    assert (x.shape, x.dtype, y.shape, y.dtype) == ((64, 64), np.float32, (64,), np.int64)
    assert y.min() >= 0 and y.max() < 10
    x, y = training.synthetic("large")
    assert x.shape == (1024, 1024) and y.shape == (1024,)
    rounds = [{"steps_per_s": 1.0, "params": 3}, {"steps_per_s": 5.0, "params": 3},
              {"steps_per_s": 2.0, "params": 3}]  # fmt: skip
    assert training.median_of(rounds) == {"steps_per_s": 2.0, "params": 3}


def test_training_benchmark_fit_comparison_is_exact_between_identical_runs(bench):
    training = bench("gpu_training")
    start, weights, loss = training.fit_digits(["/cpu:0"], None, 1)
    again, weights2, loss2 = training.fit_digits(["/cpu:0"], start, 1)
    assert len(loss) == 1 and loss == loss2  # same start, same data: the comparison's baseline
    assert all(np.array_equal(a, b) for a, b in zip(start, again, strict=True))
    assert all(np.array_equal(a, b) for a, b in zip(weights, weights2, strict=True))
    assert training.FIT_TARGET_RELATIVE == 1e-5
