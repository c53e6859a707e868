"""Checked mode in one process: the arrival board on COMM_SELF, its reports, the watch,
the default timeout and the engine's choice between blocking and checked calls."""

from __future__ import annotations

import time
import warnings

import numpy as np
import pytest

from hpcdist.collectives import Collectives, CommunicationOptions
from hpcdist.collectives import options as options_module
from hpcdist.collectives.arrivals import (
    INSIDE,
    LEFT,
    NONE,
    TEXT_BYTES,
    ArrivalBoard,
    Entry,
    Watch,
    describe_arrivals,
    missing_ranks,
)
from hpcdist.collectives.options import (
    get_default_timeout,
    set_default_timeout,
    stall_warning_seconds,
    timeout_from_env,
)
from hpcdist.collectives.session import Topology
from hpcdist.collectives.shm_backend import _sync_sleeping
from hpcdist.errors import CollectiveStallWarning, CollectiveTimeoutError
from hpcdist.runtime import mpi


@pytest.fixture
def default_timeout():
    """Restore the process-wide default timeout after the test."""
    before = get_default_timeout()
    yield
    set_default_timeout(before)


# -- the board ---------------------------------------------------------------------


def test_board_on_comm_self_records_enter_and_leave():
    board = ArrivalBoard(mpi().COMM_SELF)
    try:
        assert board.read() == [Entry(0, NONE, "")]
        board.enter(1, "allreduce(op=SUM, [float32(4,)])")
        assert board.read() == [Entry(1, INSIDE, "allreduce(op=SUM, [float32(4,)])")]
        board.leave(1)
        assert board.read() == [Entry(1, LEFT, "allreduce(op=SUM, [float32(4,)])")]
        board.leave(0)  # an older call: ignored
        assert board.read()[0].state == LEFT
        board.enter(2, "barrier()")  # a shorter text replaces the longer one
        assert board.read() == [Entry(2, INSIDE, "barrier()")]
        board.enter(3, "barrier()")  # same text: only the number and state change
        assert board.read() == [Entry(3, INSIDE, "barrier()")]
    finally:
        board.free()


def test_board_cuts_long_descriptions_at_a_character_boundary():
    board = ArrivalBoard(mpi().COMM_SELF)
    try:
        text = "allreduce(" + "é" * TEXT_BYTES + ")"  # two bytes per é
        board.enter(5, text)
        entry = board.read()[0]
        assert entry.seq == 5
        assert text.startswith(entry.text)
        assert len(entry.text.encode("utf-8")) <= TEXT_BYTES
        assert len(entry.text) == 10 + (TEXT_BYTES - 10) // 2
    finally:
        board.free()


# -- reports -----------------------------------------------------------------------


def test_report_names_ranks_behind_and_where_they_are():
    entries = [
        Entry(7, INSIDE, "allreduce(op=SUM, [float32(4,)])"),
        Entry(6, LEFT, "allreduce(op=SUM, [float32(4,)])"),
        Entry(6, LEFT, "allreduce(op=SUM, [float32(4,)])"),
        Entry(5, INSIDE, "broadcast(root=0, [int64(3,)])"),
        Entry(0, NONE, ""),
    ]
    text = describe_arrivals(7, entries)
    assert text.startswith("ranks 1-4 have not arrived (")
    assert "ranks 1-2: it last left collective #6 allreduce(op=SUM" in text
    assert "rank 3: it is still inside collective #5 broadcast(root=0, [int64(3,)])" in text
    assert "rank 4: it has not entered any checked collective yet" in text
    assert missing_ranks(7, entries) == [1, 2, 3, 4]


def test_report_names_ranks_ahead_and_those_whose_host_did_not_answer():
    entries = [Entry(7, INSIDE, "a()"), None, Entry(8, INSIDE, "b()"), Entry(7, LEFT, "a()")]
    text = describe_arrivals(7, entries)
    assert "rank 2 is ahead (rank 2: it is still inside collective #8 b())" in text
    assert "rank 1 has not arrived (rank 1: no answer from its host" in text
    assert "not waiting in any collective" in text
    assert missing_ranks(7, entries) == []  # what the records say: rank 1 has none


def test_report_when_everyone_is_there():
    entries = [Entry(3, INSIDE, "a()"), Entry(3, LEFT, "a()"), Entry(3, INSIDE, "a()")]
    text = describe_arrivals(3, entries)
    assert text == "every rank has entered this collective (still inside it: 0, 2)"


# -- the watch ---------------------------------------------------------------------


class FakeBoard:
    """Rank 1 is one collective behind; counts reads."""

    def __init__(self):
        self.reads = 0
        self.serves = 0

    def serve(self):
        self.serves += 1

    def read(self, budget=1.0):
        self.reads += 1
        return [Entry(4, INSIDE, "allreduce(x)"), Entry(3, LEFT, "allreduce(x)")]


def test_watch_warns_once_after_the_stall_threshold_and_names_the_late_rank():
    board = FakeBoard()
    watch = Watch(board, 0, 4, "allreduce(op=SUM, [float32(2,)])", timeout=5.0, stall=0.05)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        watch.tick()
        assert caught == [] and board.reads == 0  # too early
        time.sleep(0.06)
        watch.tick()
        watch.tick()
    assert len(caught) == 1 and board.reads == 1
    assert caught[0].category is CollectiveStallWarning
    message = str(caught[0].message)
    assert message.startswith("allreduce(op=SUM, [float32(2,)]) (collective #4")
    assert "rank 1 has not arrived (rank 1: it last left collective #3 allreduce(x)" in message
    assert caught[0].filename == __file__  # points at the caller, not at hpcdist
    assert board.serves >= 1  # each tick answers the other hosts' queries


def test_watch_does_not_warn_when_the_threshold_is_past_the_timeout():
    watch = Watch(FakeBoard(), 0, 4, "x()", timeout=0.01, stall=0.02)
    time.sleep(0.03)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        watch.tick()
    assert caught == [] and watch.expired()


def test_watch_timeout_error_names_the_missing_rank_and_the_call():
    watch = Watch(FakeBoard(), 0, 4, "allreduce(op=MAX, [int32(3,)])", timeout=2.5, stall=None)
    error = watch.timeout_error("in Iallreduce")
    assert isinstance(error, CollectiveTimeoutError)
    message = str(error)
    assert message.startswith("allreduce(op=MAX, [int32(3,)]) (collective #4 on this communicator)")
    assert "within 2.5 s on rank 0 (waiting in Iallreduce)" in message
    assert "rank 1 has not arrived" in message and "abort" in message
    no_board = Watch(None, 0, 1, "barrier()", timeout=1.0, stall=None)
    assert "unknown" in str(no_board.timeout_error("in Iallreduce"))


class NeverWindow:
    """A node window whose other rank never arrives; counts the checks."""

    def __init__(self):
        self.checks = 0

    def sync(self, digest, deadline):
        self.checks += 1
        return None, 1

    def wait(self, seq, deadline):
        self.checks += 1
        return False


def test_checked_node_barrier_sleeps_while_it_waits():
    window = NeverWindow()
    watch = Watch(FakeBoard(), 0, 4, "allreduce(x)", timeout=0.3, stall=0.1)
    start = time.monotonic()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        agreed, seq = _sync_sleeping(window, 123, watch)
    elapsed = time.monotonic() - start
    assert agreed is None and seq == 1
    assert 0.3 <= elapsed < 1.0
    assert window.checks < 100  # 50 us doubling to 10 ms: a sleeping wait, not a spin
    assert [w.category for w in caught] == [CollectiveStallWarning]


# -- the default timeout -----------------------------------------------------------


def test_timeout_from_env():
    assert timeout_from_env({"HPCDIST_TIMEOUT_SECONDS": " 2.5 "}) == 2.5
    for off in ("", "0", "off", "None"):
        assert timeout_from_env({"HPCDIST_TIMEOUT_SECONDS": off}) is None
    assert timeout_from_env({}) is None
    for bad in ("abc", "-3", "inf", "nan"):
        with pytest.raises(ValueError, match="HPCDIST_TIMEOUT_SECONDS is"):
            timeout_from_env({"HPCDIST_TIMEOUT_SECONDS": bad})


def test_stall_warning_seconds():
    assert stall_warning_seconds(8.0, {}) == 4.0
    assert stall_warning_seconds(None, {}) is None
    assert stall_warning_seconds(8.0, {"HPCDIST_STALL_WARNING_SECONDS": "1.5"}) == 1.5
    assert stall_warning_seconds(8.0, {"HPCDIST_STALL_WARNING_SECONDS": "off"}) is None
    with pytest.raises(ValueError, match="HPCDIST_STALL_WARNING_SECONDS is 'x'"):
        stall_warning_seconds(8.0, {"HPCDIST_STALL_WARNING_SECONDS": "x"})


def test_set_default_timeout_validates_and_overrides(default_timeout):
    set_default_timeout(3)
    assert get_default_timeout() == 3
    set_default_timeout(None)
    assert get_default_timeout() is None
    with pytest.raises(ValueError, match="timeout_seconds"):
        set_default_timeout(-1)
    assert get_default_timeout() is None


def test_default_timeout_is_read_from_the_environment_once(monkeypatch, default_timeout):
    monkeypatch.setenv("HPCDIST_TIMEOUT_SECONDS", "42")
    monkeypatch.setattr(options_module.Default, "unset", True)
    assert get_default_timeout() == 42.0
    monkeypatch.setenv("HPCDIST_TIMEOUT_SECONDS", "7")
    assert get_default_timeout() == 42.0


# -- the engine: blocking vs checked -----------------------------------------------


class Request:
    def Test(self):
        return True

    def Wait(self):
        return None


class RecordingComm:
    """Rank 0 of 2 that records calls and the digests of the agreement check; moves no data."""

    def __init__(self):
        self.calls: list[str] = []
        self.digests: list[int] = []

    def Get_rank(self):
        return 0

    def Get_size(self):
        return 2

    def __getattr__(self, name):
        if not name[:1].isupper():
            raise AttributeError(name)

        def call(*args):
            self.calls.append(name)
            if name == "Iallreduce":
                self.digests.append(int(args[1][0]))
            return Request() if name.startswith("I") else None

        return call


def _engine(comm, options=None) -> Collectives:
    c = Collectives(comm, options)
    c.session.assume_topology(
        Topology(nodes=2, largest_node=1, window=None, leaders=None, node_rank=0)
    )
    return c


def test_without_any_timeout_calls_stay_blocking_with_no_board(default_timeout):
    set_default_timeout(None)
    comm = RecordingComm()
    c = _engine(comm)
    c.allreduce([np.ones(3, np.float32)], "MAX")
    c.allreduce([np.ones(3, np.float32)], "MAX")
    assert comm.calls == ["Iallreduce", "Reduce", "Bcast"] * 2
    assert comm.digests[0] == comm.digests[1]  # the call's digest alone, no sequence number
    assert c.session.board is None


@pytest.mark.parametrize("where", ["default", "engine", "call"])
def test_a_timeout_from_anywhere_makes_calls_checked(where, default_timeout):
    set_default_timeout(30 if where == "default" else None)
    comm = RecordingComm()
    timeout = CommunicationOptions(timeout_seconds=30)
    c = _engine(comm, timeout if where == "engine" else None)
    call_opts = timeout if where == "call" else None
    c.allreduce([np.ones(3, np.float32)], "MAX", call_opts)
    c.allreduce([np.ones(3, np.float32)], "MAX", call_opts)
    c.barrier(call_opts)
    assert comm.calls == ["Iallreduce", "Ireduce", "Ibcast"] * 2 + ["Iallreduce"]
    # The sequence number is part of what the ranks compare: the same call differs.
    assert len(set(comm.digests)) == 3
    assert all(0 <= d < 2**63 for d in comm.digests)


def test_changing_the_default_takes_effect_on_existing_engines(default_timeout):
    set_default_timeout(None)
    comm = RecordingComm()
    c = _engine(comm)
    c.barrier()
    set_default_timeout(10)
    c.barrier()
    set_default_timeout(None)
    c.barrier()
    assert comm.calls == ["Iallreduce", "Iallreduce", "Iallreduce"]
    # Only the checked barrier is marked as such (its text says "timeout set").
    assert comm.digests[0] == comm.digests[2] != comm.digests[1]


def test_checked_call_on_one_rank_makes_no_mpi_call(default_timeout):
    set_default_timeout(5)
    c = Collectives(mpi().COMM_SELF)
    (out,) = c.allreduce([np.arange(3.0)], "SUM")
    np.testing.assert_array_equal(out, [0.0, 1.0, 2.0])
    assert c.session.board is None
    c.close()  # nothing to free


class HeldRequest:
    def __init__(self, comm):
        self.comm = comm

    def Test(self):
        return self.comm.released

    def Wait(self):
        assert self.comm.released, "Wait() on a request that can never complete"


class HoldingComm(RecordingComm):
    """Like RecordingComm, but nonblocking calls complete only once ``released``."""

    def __init__(self):
        super().__init__()
        self.released = False

    def __getattr__(self, name):
        call = super().__getattr__(name)

        def held(*args):
            result = call(*args)
            return HeldRequest(self) if name.startswith("I") else result

        return held


def test_a_stall_warning_raised_as_an_error_leaves_the_call_pending(monkeypatch):
    monkeypatch.setenv("HPCDIST_STALL_WARNING_SECONDS", "0.05")
    comm = HoldingComm()
    c = _engine(comm, CommunicationOptions(timeout_seconds=30))
    x = np.arange(4, dtype=np.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("error", CollectiveStallWarning)
        with pytest.raises(CollectiveStallWarning) as info:
            c.allreduce([x], "MAX")
    pending = info.value.request
    assert pending is not None and not pending.done
    with pytest.raises(CollectiveTimeoutError, match="still pending"):
        c.barrier()  # refused: it would be matched against the pending call
    comm.released = True
    np.testing.assert_array_equal(pending.Wait()[0], x)
    c.barrier()
    assert comm.calls == ["Iallreduce", "Ireduce", "Ibcast", "Iallreduce"]
