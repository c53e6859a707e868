"""The flight recorder ring and dumps, the timeline, merging and the reports (one process)."""

from __future__ import annotations

import json
import os
import signal
import time

import numpy as np
import pytest

from hpcdist import cli
from hpcdist.collectives import Collectives
from hpcdist.errors import CollectiveTimeoutError, TimelineError
from hpcdist.observe import analysis, merge, recorder, timeline
from hpcdist.runtime import mpi


def test_the_ring_keeps_the_last_n_records_oldest_first():
    rec = recorder.FlightRecorder(3)
    for seq in range(1, 6):
        rec.begin("0/2", seq, f"allreduce(op=SUM, [float32({seq},)])", "shm")
        if seq != 5:
            rec.end()
    got = rec.records()
    assert [r["seq"] for r in got] == [3, 4, 5]
    assert [r["done"] for r in got] == [True, True, False]
    assert got[0]["operation"] == "allreduce" and got[0]["algorithm"] == "shm"
    assert got[0]["start"] <= got[0]["end"] <= got[1]["start"] and got[2]["end"] is None


def test_collectives_of_two_threads_each_close_their_own_record():
    import threading

    rec = recorder.FlightRecorder(8)
    opened, closing = threading.Event(), threading.Event()

    def other() -> None:  # another thread's collective: opened first, closed last
        rec.begin("1/2", 1, "allreduce(op=SUM, [float32(8,)])", "mpi")
        opened.set()
        closing.wait(5)
        rec.end()

    thread = threading.Thread(target=other)
    thread.start()
    opened.wait(5)
    rec.begin("0/2", 1, "allreduce(op=SUM, [float32(4,)])", "mpi")
    rec.end()  # closes this thread's record only
    mine, theirs = sorted(rec.records(), key=lambda r: r["comm"])
    assert mine["done"] and not theirs["done"]
    closing.set()
    thread.join(5)
    assert all(r["done"] for r in rec.records())


def test_a_dump_is_json_with_rank_job_and_records(tmp_path, monkeypatch):
    monkeypatch.setenv("SLURM_JOB_ID", "77")
    monkeypatch.setenv("SLURM_STEP_ID", "2")
    rec = recorder.FlightRecorder(4)
    rec.rank, rec.size = 3, 4
    rec.begin("0/4", 9, "barrier(no timeout)", None)
    path = rec.dump("SIGUSR1", str(tmp_path))
    assert os.path.basename(path) == "77.2-rank00003.json"
    data = json.loads(open(path).read())
    assert data["rank"] == 3 and data["size"] == 4 and data["reason"] == "SIGUSR1"
    assert data["records"][0]["seq"] == 9 and data["records"][0]["done"] is False


def test_a_collective_error_names_the_dump_in_its_message(tmp_path, monkeypatch):
    monkeypatch.setenv(recorder.DIR_VAR, str(tmp_path))

    class Engine:
        @recorder.recorded
        def allreduce(self):
            recorder.RECORDER.begin("9/2", 4, "allreduce(op=SUM, [float32(4,)])", "shm")
            raise CollectiveTimeoutError("allreduce (collective #4) did not complete")

    with pytest.raises(CollectiveTimeoutError, match=r"\[flight recorder: .*rank\d+\.json\]") as e:
        Engine().allreduce()
    data = json.loads(open(e.value.flight_record).read())
    assert data["reason"].startswith("CollectiveTimeoutError: allreduce (collective #4)")
    assert data["records"][-1]["seq"] == 4 and not data["records"][-1]["done"]


def test_sigusr1_writes_the_dump_and_the_process_goes_on(tmp_path, monkeypatch):
    monkeypatch.setenv(recorder.DIR_VAR, str(tmp_path))
    previous = signal.signal(signal.SIGUSR1, recorder._on_usr1)
    try:
        recorder.RECORDER.begin("9/2", 1, "barrier(no timeout)", None)
        recorder.RECORDER.end()
        os.kill(os.getpid(), signal.SIGUSR1)
        time.sleep(0.05)
    finally:
        signal.signal(signal.SIGUSR1, previous)
    dumps = analysis.read_dumps(str(tmp_path))
    assert len(dumps) == 1 and dumps[0]["reason"] == "SIGUSR1"


def test_the_engine_records_each_collective_once():
    engine = Collectives(mpi().COMM_SELF)
    before = list(recorder.RECORDER.records())
    engine.allreduce([np.ones(3)], "SUM")
    assert recorder.RECORDER.records() == before  # one rank: no communication, nothing to record


@pytest.mark.parametrize(
    "name", ["allreduce", "reduce_scatter", "allgather", "allgather_list", "broadcast",
             "alltoall", "barrier"],
)
def test_each_engine_operation_is_wrapped_by_the_recorder_exactly_once(name):
    wrapped = getattr(Collectives, name).__wrapped__  # the @recorded wrapper's target
    assert not hasattr(wrapped, "__wrapped__"), f"{name} is wrapped by @recorded twice"


def _dump(rank, records, size=2, job="j"):
    return {"rank": rank, "size": size, "job": job, "time": 1.0, "reason": "x",
            "records": [{"comm": "0/2", "seq": s, "what": w, "done": d} for s, w, d in records]}


def test_divergence_finds_the_first_mismatch_before_later_absences():
    dumps = [
        _dump(0, [(1, "a", True), (2, "b(3)", True), (3, "c", False)]),
        _dump(1, [(1, "a", True), (2, "b(4)", False)]),
    ]
    found = analysis.divergence(dumps)
    assert found["seq"] == 2 and found["kind"] == "mismatch"
    assert found["calls"] == {0: "b(3)", 1: "b(4)"}


def test_divergence_ignores_records_that_left_the_ring_and_names_missing_dumps():
    dumps = [_dump(0, [(5, "a", True), (6, "a", False)], size=3),
             _dump(1, [(2, "a", True), (3, "a", True), (4, "a", True), (5, "a", True)], size=3)]
    found = analysis.divergence(dumps)
    assert (found["seq"], found["missing"], found["ranks_without_dump"]) == (6, [1], [2])
    assert analysis.divergence([_dump(0, [(1, "a", True)]), _dump(1, [(1, "a", True)])]) is None


def _x(rank, name, ts, dur, seq=None, cat="collectives", tid=1):
    e = {"ph": "X", "name": name, "cat": cat, "ts": ts, "dur": dur, "pid": rank, "tid": tid}
    if seq is not None:
        e["args"] = {"comm": "0/3", "seq": seq}
    return e


def test_merge_aligns_clocks_and_computes_waits_and_blame():
    # Rank 2 arrives 20 ms late at every call; its clock reads 1000 us behind rank 0's.
    ranks = {
        r: [_x(r, "allreduce", 100.0 + 30_000 * k + (20_000 if r == 2 else 0)
               - (1000.0 if r == 2 else 0.0), 25_000 - (20_000 if r == 2 else 0), seq=k + 1)
            for k in range(3)]
        for r in range(3)
    }
    events = merge.merge_events(ranks, {0: 0.0, 1: 0.0, 2: 1000.0})
    first = [e for e in events if e["args"]["seq"] == 1]
    assert min(e["ts"] for e in events) == 0.0
    assert {e["pid"]: e["args"]["wait_us"] for e in first} == {0: 20_000, 1: 20_000, 2: 0}
    assert all(e["args"]["last_rank"] == 2 for e in first)
    report = analysis.step_report(events)
    assert report["stragglers"] == [2]
    assert report["ranks"][2]["blame_ms"] == pytest.approx(3 * 40.0)
    assert report["ranks"][0]["wait_ms"] == pytest.approx(60.0)
    text = analysis.format_step_report(report)
    assert "straggler: rank 2 " in text


def test_no_straggler_when_waits_are_spread_evenly():
    rows = {r: {"blame_ms": b} for r, b in enumerate([10.0, 11.0, 9.0, 10.5])}
    assert analysis.stragglers(rows) == []
    assert analysis.stragglers({0: {"blame_ms": 1.0}, 1: {"blame_ms": 90.0}}) == [1]


def test_timeline_off_writes_nothing_and_spans_are_shared_no_ops():
    assert not timeline.active
    assert timeline.span("input") is timeline.span("step")
    timeline.complete("x", "phases", 0.0, 1.0)  # off: dropped


def test_a_rank_file_merges_and_reports_through_the_cli(tmp_path, capsys):
    path = timeline.start(str(tmp_path), rank=0, size=1)
    try:
        for step in range(3):
            t0 = time.perf_counter()
            with timeline.span("input"):
                pass
            with timeline.span("forward+backward"):
                time.sleep(0.002)
            timeline.complete("step", "phases", t0, time.perf_counter(), {"step": step})
    finally:
        assert timeline.stop() == path
    assert not timeline.active
    out = tmp_path / "run.json"
    assert cli.main(["timeline", "merge", str(tmp_path), "-o", str(out)]) == 0
    trace = json.loads(out.read_text())
    steps = [e for e in trace["traceEvents"] if e["name"] == "step"]
    assert len(steps) == 3 and all(e["pid"] == 0 for e in steps)
    assert cli.main(["timeline", "report", str(tmp_path), "--png", str(tmp_path / "r.png")]) == 0
    text = capsys.readouterr().out
    assert "forward+backward ms" in text and (tmp_path / "r.png").stat().st_size > 1000


def test_an_unclosed_rank_file_is_still_read(tmp_path):
    (tmp_path / "rank-00001.json").write_text('[\n{"name":"a","ph":"X","ts":1,"dur":2,"pid":1}')
    assert merge.read_directory(str(tmp_path))[1][0]["name"] == "a"
    with pytest.raises(TimelineError, match="no rank-R.json"):
        merge.read_directory(str(tmp_path / "none"))
