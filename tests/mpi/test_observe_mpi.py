"""The timeline, the straggler report and the flight recorder on real ranks.

Run under ``mpirun -n 2``, ``-n 4`` and ``HPCDIST_VIRTUAL_NODES=2 mpirun -n 4`` by
``make test``. Rank 0 makes a fresh directory and broadcasts its name; every rank
writes its files there; rank 0 reads them back.
"""

from __future__ import annotations

import io
import json
import shutil
import tempfile
import time

import numpy as np
import pytest

import hpcdist as hd
from hpcdist.collectives import Collectives
from hpcdist.errors import CollectiveMismatchError
from hpcdist.observe import analysis, merge, recorder
from hpcdist.runtime import world

pytestmark = [pytest.mark.mpi(min_size=2), pytest.mark.timeout(120)]

DELAY = 0.020  # the straggler's sleep before every allreduce


def _shared_dir() -> str:
    w = world()
    path = w.comm.bcast(tempfile.mkdtemp(prefix="hpcdist-observe-") if w.rank == 0 else None)
    return str(path)


def _cleanup(path: str) -> None:
    world().comm.Barrier()
    if world().rank == 0:
        shutil.rmtree(path, ignore_errors=True)


def test_a_rank_that_sleeps_before_every_allreduce_is_named_the_straggler():
    w = world()
    slow = w.size - 1
    engine = Collectives()
    path = _shared_dir()
    x = [np.ones(1000, np.float32)]
    engine.allreduce(x, "SUM")  # the engine's set-up (collective) before the timeline
    with hd.experimental.timeline(path):
        for _ in range(8):
            if w.rank == slow:
                time.sleep(DELAY)
            engine.allreduce(x, "SUM")
    w.comm.Barrier()
    if w.rank == 0:
        report = analysis.report_directory(path)
        assert report["stragglers"] == [slow], json.dumps(report, indent=1)
        rows = report["ranks"]
        assert set(rows) == set(range(w.size))
        # Each fast rank waited about DELAY per call; the slow one hardly at all.
        for rank, row in rows.items():
            if rank != slow:
                assert row["wait_ms"] > 8 * DELAY * 1e3 * 0.5, rows
        assert rows[slow]["wait_ms"] < 0.5 * min(r["wait_ms"] for k, r in rows.items() if k != slow)
        text = analysis.report(path)
        assert f"straggler: rank {slow} " in text, text
    _cleanup(path)


def test_the_merged_trace_is_chrome_json_with_one_track_per_rank_and_aligned_clocks(tmp_path):
    w = world()
    engine = Collectives()
    path = _shared_dir()
    with hd.experimental.timeline(path):
        for n in (4, 4096, 100_000):
            engine.allreduce([np.ones(n, np.float32)], "SUM")
        engine.broadcast([np.arange(5)], root=0)
        engine.barrier()
    w.comm.Barrier()
    if w.rank == 0:
        out = tmp_path / "run.json"
        merge.merge_directory(path, str(out))
        trace = json.loads(out.read_text())
        check_chrome_trace(trace, w.size)
    _cleanup(path)


def check_chrome_trace(trace: dict, size: int) -> None:
    """The schema of a merged trace: Chrome's JSON object format, one pid per rank."""
    assert isinstance(trace["traceEvents"], list) and trace["displayTimeUnit"] == "ms"
    timed = [e for e in trace["traceEvents"] if e["ph"] != "M"]
    for e in trace["traceEvents"]:
        assert isinstance(e["name"], str) and e["ph"] in {"X", "i", "M"}, e
        assert isinstance(e["pid"], int), e
        if e["ph"] == "X":
            assert e["ts"] >= 0 and e["dur"] >= 0 and isinstance(e["tid"], int), e
    assert {e["pid"] for e in timed} == set(range(size))
    names = {e["pid"]: e["args"]["name"] for e in trace["traceEvents"]
             if e["ph"] == "M" and e["name"] == "process_name"}
    assert sorted(names) == list(range(size)) and all(f"rank {r}" in names[r] for r in names)
    # Per rank, the collectives are in order and do not overlap (monotonic clock).
    calls: dict[tuple, dict[int, dict]] = {}
    for rank in range(size):
        mine = [e for e in timed if e["pid"] == rank and "seq" in e.get("args", {})]
        assert len(mine) == 5, mine
        for a, b in zip(mine, mine[1:], strict=False):
            assert a["args"]["seq"] < b["args"]["seq"] and a["ts"] + a["dur"] <= b["ts"] + 1
        for e in mine:
            calls.setdefault((e["args"]["comm"], e["args"]["seq"]), {})[rank] = e
    # Aligned: a collective ends on every rank after the last rank started it.
    for by_rank in calls.values():
        assert sorted(by_rank) == list(range(size))
        last_start = max(e["ts"] for e in by_rank.values())
        for e in by_rank.values():
            assert e["ts"] + e["dur"] >= last_start - 200, by_rank  # µs of slack
            assert e["args"]["wait_us"] + e["args"]["transfer_us"] <= e["dur"] + 1


def test_fit_phases_and_step_stats():
    w = world()
    strategy = hd.MultiWorkerMirroredStrategy()
    with strategy.scope():
        model = hd.nn.Sequential([hd.nn.Dense(8, activation="relu"), hd.nn.Dense(1)])
        model.compile(optimizer=hd.optimizers.SGD(0.01), loss="mse")
    rng = np.random.default_rng(0)
    x = rng.standard_normal((64, 4)).astype(np.float32)
    y = rng.standard_normal((64, 1)).astype(np.float32)
    out = io.StringIO()
    stats = hd.callbacks.StepStats(stream=out)
    path = _shared_dir()
    with hd.experimental.timeline(path):
        model.fit(x, y, batch_size=8, epochs=1, verbose=0, callbacks=[stats])
        hd.train.Checkpoint(model=model).write(f"{path}/ckpt/final")
    w.comm.Barrier()
    if w.rank == 0:
        events = merge.read_rank_file(f"{path}/rank-00000.json")
        assert [e["name"] for e in events if e.get("cat") == "checkpoint"] == ["checkpoint write"]
        report = analysis.report_directory(path)
        for rank, row in report["ranks"].items():
            assert row["steps"] == 8, (rank, row)
            for phase in ("input", "forward+backward", "optimizer", "gradient reduction",
                          "callbacks"):
                assert row["phases_ms"].get(phase, 0) > 0, (rank, phase, row)
        assert stats.last_report is not None
        assert {r["steps"] for r in stats.last_report["ranks"].values()} == {8}
        assert "epoch 1 step stats" in out.getvalue() and "forward+backward" in out.getvalue()
    else:
        assert out.getvalue() == ""
    _cleanup(path)


def test_one_rank_skipping_a_collective_shows_in_every_ranks_flight_dump(monkeypatch):
    w = world()
    path = _shared_dir()
    monkeypatch.setenv(recorder.DIR_VAR, path)
    engine = Collectives()
    skipper = w.size - 1
    errors = []
    seq_before = None
    for n in range(1, 6):
        if w.rank == skipper and n == 3:
            continue  # skips the allreduce of 3 floats: its next call meets the others' third
        try:
            engine.allreduce([np.ones(n, np.float32)], "SUM")
        except CollectiveMismatchError as err:
            errors.append(str(err))
            break
        seq_before = engine.session.seq
    assert len(errors) == 1 and "[flight recorder: " in errors[0], errors
    w.comm.Barrier()
    if w.rank == 0:
        dumps = analysis.read_dumps(path)
        assert [d["rank"] for d in dumps] == list(range(w.size))
        found = analysis.divergence(dumps)
        assert found is not None and found["kind"] == "mismatch", found
        assert found["seq"] == seq_before + 1, (found, seq_before)
        assert "float32(3,)" in found["calls"][0] and "float32(4,)" in found["calls"][skipper]
        text = analysis.format_divergence(dumps, found)
        assert f"first divergence: collective #{found['seq']}" in text, text
    _cleanup(path)


def test_torch_buckets_show_hook_ready_and_reduced():
    torch = pytest.importorskip("torch")
    import hpcdist.torch as hdt

    w = world()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    opt = hdt.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), model=model,
                                   bytes_per_pack=256)
    path = _shared_dir()
    with hd.experimental.timeline(path):
        for _ in range(2):
            opt.zero_grad()
            model(torch.ones(4, 8)).sum().backward()
            opt.step()
    w.comm.Barrier()
    if w.rank == 0:
        events = merge.read_rank_file(f"{path}/rank-00000.json")
        names = [e["name"] for e in events if e.get("cat") == "buckets"]
        assert names.count("reduced") >= 2 and names.count("bucket ready") == names.count("reduced")
        assert names.count("hook fired") == names.count("reduced"), names
    _cleanup(path)
