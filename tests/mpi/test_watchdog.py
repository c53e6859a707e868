"""Checked collectives on real ranks: stall warnings, timeouts that name the late ranks,
mismatches in timeout mode, sequence numbers, sleeping waits.

Run under ``mpirun -n 2``, ``-n 4`` and ``HPCDIST_VIRTUAL_NODES=2 mpirun -n 4`` by
``make test``. The late rank is always the last one; it joins every collective in
the end, and every rank that timed out finishes the pending call, so no rank is left
waiting. Each test uses its own engine over a duplicate of the world, freed at the end.
"""

from __future__ import annotations

import re
import time
import warnings

import numpy as np
import pytest

from hpcdist.collectives import Collectives, CommunicationOptions
from hpcdist.collectives.options import get_default_timeout, set_default_timeout
from hpcdist.errors import CollectiveMismatchError, CollectiveStallWarning, CollectiveTimeoutError
from hpcdist.runtime import mpi

pytestmark = [pytest.mark.mpi(min_size=2), pytest.mark.timeout(120)]

LONG = 60.0  # a timeout no healthy call reaches
IMPLEMENTATIONS = ["MPI", "SHM"]


@pytest.fixture
def c():
    before = get_default_timeout()
    set_default_timeout(None)
    comm = mpi().COMM_WORLD.Dup()
    engine = Collectives(comm)
    yield engine
    engine.close()
    comm.Free()
    set_default_timeout(before)


def _named(message: str, phrase: str) -> set[int]:
    """The ranks of ``rank 3 <phrase>`` or ``ranks 1-2, 5 <phrase>`` in ``message``."""
    found = re.search(r"\branks? (\d+(?:\s*[-,]\s*\d+)*) " + re.escape(phrase), message)
    if found is None:
        return set()
    ranks: set[int] = set()
    for part in found.group(1).split(","):
        low, _, high = part.strip().partition("-")
        ranks.update(range(int(low), int(high or low) + 1))
    return ranks


def _run(c: Collectives, operation: str, x: np.ndarray, opts, root: int):
    if operation == "allreduce":
        return c.allreduce([x], "SUM", opts)[0]
    if operation == "broadcast":
        return c.broadcast([x], root=root, options=opts)[0]
    return c.allgather(x, options=opts)


def _expected(operation: str, size: int, root: int) -> np.ndarray:
    parts = [np.arange(5, dtype=np.float32) + r for r in range(size)]
    if operation == "allreduce":
        return sum(parts)
    if operation == "broadcast":
        return parts[root]
    return np.concatenate(parts)


STALL_CASES = [
    *[(op, i, "call") for op in ("allreduce", "broadcast", "allgather") for i in IMPLEMENTATIONS],
    *[("allreduce", impl, "default") for impl in IMPLEMENTATIONS],
]


@pytest.mark.parametrize(("operation", "implementation", "timeout_from"), STALL_CASES)
def test_a_late_rank_triggers_a_stall_warning_naming_it(
    c, monkeypatch, operation, implementation, timeout_from
):
    monkeypatch.setenv("HPCDIST_STALL_WARNING_SECONDS", "0.2")
    late = c.size - 1
    if timeout_from == "default":
        set_default_timeout(LONG)
        opts = CommunicationOptions(implementation=implementation)
    else:
        opts = CommunicationOptions(timeout_seconds=LONG, implementation=implementation)
    x = np.arange(5, dtype=np.float32) + c.rank
    want = _expected(operation, c.size, late)
    np.testing.assert_array_equal(_run(c, operation, x, opts, late), want)  # collective #1
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        if c.rank == late:
            time.sleep(1.0)
        got = _run(c, operation, x, opts, late)  # collective #2
    np.testing.assert_array_equal(got, want)
    stalls = [w for w in caught if issubclass(w.category, CollectiveStallWarning)]
    if c.rank != late:
        assert len(stalls) == 1, [str(w.message) for w in caught]
        message = str(stalls[0].message)
        assert message.startswith(operation) and "(collective #2 " in message, message
        assert _named(message, "has not arrived") == {late}, message
        assert f"it last left collective #1 {operation}" in message, message
        assert "float32(5,)" in message


@pytest.mark.parametrize("implementation", IMPLEMENTATIONS)
def test_a_timeout_names_the_missing_rank_then_the_late_call_completes(c, implementation):
    late = c.size - 1
    x = np.arange(5, dtype=np.float32) + c.rank
    want = _expected("allreduce", c.size, late)
    patient = CommunicationOptions(timeout_seconds=LONG, implementation=implementation)
    c.allreduce([x], "SUM", patient)
    if c.rank == late:
        time.sleep(1.2)
        (got,) = c.allreduce([x], "SUM", patient)
    else:
        hasty = CommunicationOptions(timeout_seconds=0.4, implementation=implementation)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", CollectiveStallWarning)
            with pytest.raises(CollectiveTimeoutError) as info:
                c.allreduce([x], "SUM", hasty)
        message = str(info.value)
        assert message.startswith("allreduce(op=SUM, [float32(5,)]"), message
        assert "within 0.4 s" in message and "(collective #2 " in message, message
        assert _named(message, "has not arrived") == {late}, message
        (got,) = info.value.request.Wait()  # the late rank joins: the call completes
    np.testing.assert_array_equal(got, want)
    # Every rank has run the same calls: checked calls still agree.
    (again,) = c.allreduce([np.ones(2)], "SUM", patient)
    np.testing.assert_array_equal(again, [c.size, c.size])


@pytest.mark.parametrize("implementation", ["AUTO", *IMPLEMENTATIONS])
@pytest.mark.parametrize("operation", ["allreduce", "broadcast", "allgather"])
def test_different_shapes_in_timeout_mode_raise_on_every_rank(c, operation, implementation):
    opts = CommunicationOptions(timeout_seconds=LONG, implementation=implementation)
    c.barrier(opts)
    shape = (2, 4) if c.rank == 0 else (2, 3)
    x = np.ones(shape, np.float32)
    with pytest.raises(CollectiveMismatchError) as info:
        if operation == "allgather":
            c.allgather(x, axis=0, options=opts)
        else:
            _run(c, operation, x, opts, 0)
    message = str(info.value)
    assert message.startswith(f"{operation}: the ranks called this collective"), message
    others = set(range(1, c.size))
    assert _named(message, "passed") == {0} or _named(message, "passed") == others, message
    # (allgather shows the gathered axis as *)
    assert re.search(r"\brank 0 passed [^;]*float32\((2|\*), 4\)", message), message
    assert re.search(r"\branks? 1[-\d]* passed [^;]*float32\((2|\*), 3\)", message), message
    # The engine works afterwards, checked and not.
    (out,) = c.allreduce([np.full(3, c.rank, np.int64)], "SUM", opts)
    np.testing.assert_array_equal(out, [sum(range(c.size))] * 3)
    c.barrier()


def test_ranks_compare_sequence_numbers_and_agree_again_after_a_mismatch(c):
    opts = CommunicationOptions(timeout_seconds=LONG)
    c.barrier(opts)
    if c.rank == c.size - 1:
        c.session.seq += 5  # as if this rank had run five more collectives than the others
    with pytest.raises(CollectiveMismatchError) as info:
        c.allreduce([np.ones(3, np.float32)], "SUM", opts)
    message = str(info.value)
    last = c.size - 1
    odd = re.search(rf"\brank {last} passed [^;]*\[collective #(\d+)\]", message)
    usual = re.search(r"\branks? 0[-\d]* passed [^;]*\[collective #(\d+)\]", message)
    assert odd and usual, message
    assert int(odd.group(1)) == int(usual.group(1)) + 5, message
    # The mismatch report synchronised the numbers: the next checked call agrees.
    (out,) = c.allreduce([np.ones(3, np.float32)], "SUM", opts)
    np.testing.assert_array_equal(out, np.full(3, c.size, np.float32))


def test_the_board_exists_only_in_checked_mode(c):
    c.allreduce([np.ones(2)], "SUM")
    c.barrier()
    assert c.session.board is None
    c.barrier(CommunicationOptions(timeout_seconds=LONG))  # sets the board up at its end
    assert c.session.board is not None
    c.barrier(CommunicationOptions(timeout_seconds=LONG))  # recorded on the board
    entries = c.session.board.read()
    assert [e.seq for e in entries] == [c.session.seq] * c.size
    c.close()
    assert c.session.board is None
    c.barrier()


@pytest.mark.parametrize("implementation", IMPLEMENTATIONS)
def test_waiting_ranks_sleep_instead_of_spinning(c, monkeypatch, implementation):
    monkeypatch.setenv("HPCDIST_STALL_WARNING_SECONDS", "off")
    late = c.size - 1
    opts = CommunicationOptions(timeout_seconds=LONG, implementation=implementation)
    x = np.ones(1000, np.float32)
    c.allreduce([x], "SUM", opts)  # compiled kernels, board and windows ready
    if c.rank == late:
        time.sleep(1.5)
        c.allreduce([x], "SUM", opts)
        return
    wall, cpu = time.monotonic(), time.process_time()
    c.allreduce([x], "SUM", opts)
    wall, cpu = time.monotonic() - wall, time.process_time() - cpu
    assert wall > 1.0, wall
    assert cpu < 0.35 * wall, (cpu, wall)


def test_a_rank_missing_from_an_engines_first_collective_times_out():
    """The first call sets up the node layout with blocking calls; a polled barrier first."""
    comm = mpi().COMM_WORLD.Dup()
    engine = Collectives(comm)
    late = comm.Get_size() - 1
    try:
        if comm.Get_rank() != late:
            start = time.monotonic()
            with pytest.raises(CollectiveTimeoutError, match="did not start within 0.5 s") as err:
                engine.allreduce([np.ones(3)], "SUM", CommunicationOptions(timeout_seconds=0.5))
            assert time.monotonic() - start < 5
            err.value.request.Wait()  # the late rank arrives below
        else:
            time.sleep(1.5)
            comm.Ibarrier().Wait()  # what the others' pending set-up barrier waits for
    finally:
        comm.Free()
