"""`hpcdist bench report` (scaling table), the train interval, the OSU and nccl-tests layouts."""

from __future__ import annotations

import json

import pytest

from hpcdist.bench import formats, scaling, train
from hpcdist.errors import BenchmarkError


def _run(ranks, nodes, total, mode="weak", model="mlp"):
    return {"benchmark": "train", "model": model, "scaling": mode, "ranks": ranks, "nodes": nodes,
            "samples_per_s_total": {"mean": total, "ci95": 0.05 * total}}


def test_report_groups_by_model_and_mode_against_the_smallest_run(tmp_path, capsys):
    runs = [_run(4, 2, 300.0), _run(1, 1, 100.0), _run(2, 1, 190.0),
            _run(2, 1, 50.0, "strong"), _run(8, 4, 150.0, "strong")]
    for i, run in enumerate(runs):
        (tmp_path / f"r{i}.json").write_text(json.dumps(run))
    (tmp_path / "other.json").write_text(json.dumps({"benchmark": "allreduce"}))
    assert scaling.main([str(tmp_path), "--out", str(tmp_path / "out")]) == 0
    rows = json.loads((tmp_path / "out" / "scaling.json").read_text())["rows"]
    weak = [(r["ranks"], r["efficiency"]) for r in rows if r["scaling"] == "weak"]
    strong = [(r["ranks"], r["speedup"], r["efficiency"]) for r in rows if r["scaling"] == "strong"]
    assert weak == [(1, 1.0), (2, 0.95), (4, 0.75)]
    assert strong == [(2, 1.0, 1.0), (8, 3.0, 0.75)]
    assert "75.0%" in capsys.readouterr().out
    assert (tmp_path / "out" / "scaling.png").stat().st_size > 1000


def test_report_without_train_results_says_what_to_run(tmp_path):
    with pytest.raises(BenchmarkError, match="hpcdist bench train"):
        scaling.load([str(tmp_path)])


def test_the_95_percent_interval_is_1_96_standard_deviations():
    mean, half = train.interval([10.0, 12.0, 14.0])
    assert mean == 12.0 and half == pytest.approx(1.96 * 2.0)
    assert train.interval([5.0]) == (5.0, 0.0)


def test_nccl_tests_layout_has_its_columns():
    rows = [{"bytes": b, "iters": 10, "checked": True, "series": {"s": {
        "seconds": 1e-5 * (i + 1), "repeats": [1e-5], "algbw_gb_per_s": 0.5 * i,
        "busbw_gb_per_s": 0.5 * i}}} for i, b in enumerate([4, 1024])]
    text = formats.format_nccl_tests(rows, "s", 2)
    data = [line.split() for line in text.splitlines() if not line.startswith("#")]
    assert data[1] == ["1024", "256", "float", "sum", "-1", "20.00", "0.50", "0.50", "0",
                       "20.00", "0.50", "0.50", "0"]
    assert "# Avg bus bandwidth    : 0.25" in text
    osu = [line.split() for line in formats.format_osu(rows, "s").splitlines()
           if not line.startswith("#")]
    assert osu[0] == ["4", "10.00", "10.00", "10.00", "10"]
