"""The strategy-path benchmark's pure parts: sizes and how the targets are judged."""

from __future__ import annotations

from hpcdist.bench.strategy import judge_targets, size_list


def _row(nbytes, raw, engine, reduce, run):
    return {"bytes": nbytes, "seconds": {
        "mpi4py": raw, "engine": engine, "strategy-reduce": reduce, "run-all-reduce": run}}


def test_sizes_step_by_four_then_by_two():
    assert size_list(4, 64) == [4, 16, 64]
    assert size_list(1 << 20, 8 << 20) == [1 << 20, 2 << 20, 4 << 20, 8 << 20]


def test_targets_are_judged_on_the_worst_size():
    rows = [
        _row(4, 1e-6, 2.5e-6, 10e-6, 13e-6),  # run is 10.5 us over the engine: missed
        _row(1 << 20, 2e-4, 1e-4, 1.05e-4, 1.2e-4),  # run 1.2x the engine: missed
        _row(64 << 20, 0.05, 0.02, 0.021, 0.021),
    ]
    resnet = {"loop_over_run": 1.6}
    got = {t["id"]: t for t in judge_targets(rows, resnet, 2)}
    assert got["public_large"]["status"] == "MISSED"
    assert abs(got["public_large"]["worst"] - 1.2) < 1e-9
    assert got["public_small"]["status"] == "MISSED"
    assert abs(got["public_small"]["worst"] - 10.5) < 1e-6
    assert got["engine_small"]["status"] == "MET"  # 2.5x raw
    assert got["auto_large"]["status"] == "MET" and got["auto_64mib"]["status"] == "MET"
    assert abs(got["auto_64mib"]["worst"] - 2.5) < 1e-9
    assert got["resnet"]["status"] == "MET"
    assert judge_targets(rows, None, 2)[-1]["status"] == "SKIPPED"


def _band_row(nbytes, shm, mpi):
    return {"bytes": nbytes, "seconds": {"engine-shm": shm, "engine-mpi": mpi}}


def test_the_mpi_band_is_where_mpi_beats_the_window_best_over_runs():
    from hpcdist.bench.strategy import mpi_band_from_rows

    mib = 1 << 20
    first = [_band_row(mib, 1.0, 2.0), _band_row(4 * mib, 5.0, 4.0), _band_row(8 * mib, 9.0, 8.0),
             _band_row(16 * mib, 1.0, 2.0)]
    assert mpi_band_from_rows([first]) == (4 * mib, 16 * mib)
    # A second run where the window was faster at 4 MiB: best of each over both runs.
    second = [_band_row(4 * mib, 3.0, 4.0)]
    assert mpi_band_from_rows([first, second]) == (8 * mib, 16 * mib)
    assert mpi_band_from_rows([[_band_row(mib, 1.0, 2.0)]]) == (0, 0)  # MPI never wins
    assert mpi_band_from_rows([[_band_row(mib, 3.0, 2.0)]]) == (mib, 2 * mib)  # wins at the top
    assert mpi_band_from_rows([[{"bytes": 4, "seconds": {"mpi4py": 1.0}}]]) == (0, 0)
