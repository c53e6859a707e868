"""The checks a waiting rank makes on its node peers, and the first-failure claim."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

from hpcdist.errors import RankFailedError
from hpcdist.runtime.abort import claim_first_failure
from hpcdist.runtime.peers import LEFT_WORD, PeerWatch, process_state


def _flags(n: int) -> np.ndarray:
    return np.zeros(n * 8, dtype=np.int64)


def test_a_live_peer_passes_and_a_dead_one_is_named():
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        watch = PeerWatch([os.getpid(), child.pid], [4, 5], 0, _flags(2), 8)
        watch.check_now()  # both alive
        child.kill()
        child.wait()
        assert process_state(child.pid) is None
        with pytest.raises(RankFailedError, match=rf"rank 5 \(process {child.pid} on this host\)"):
            watch.check_now()
    finally:
        child.kill()


def test_a_zombie_peer_counts_as_dead():
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    try:
        for _ in range(200):  # not reaped: a zombie until wait()
            if process_state(child.pid) == "Z":
                break
            import time

            time.sleep(0.01)
        watch = PeerWatch([os.getpid(), child.pid], [0, 1], 0, _flags(2), 8)
        assert process_state(child.pid) == "Z"
        assert not watch._pids_usable  # a peer already dead at start disables the pid check
        watch._pids_usable = True
        with pytest.raises(RankFailedError) as info:
            watch.check_now()
        assert info.value.rank == 1
    finally:
        child.wait()


def test_a_peer_that_left_is_named_and_leave_marks_this_rank():
    flags = _flags(3)
    me, other = os.getpid(), os.getppid()
    mine = PeerWatch([me, me, other], [0, 1, 2], 1, flags, 8)
    theirs = PeerWatch([me, me, other], [0, 1, 2], 0, flags, 8)
    theirs.check_now()
    mine.leave()
    assert flags[1 * 8 + LEFT_WORD] == 1
    mine.check_now()  # its own mark does not count
    with pytest.raises(RankFailedError, match="rank 1 left a shared-memory collective"):
        theirs.check_now()


def test_check_is_rate_limited():
    flags = _flags(2)
    watch = PeerWatch([os.getpid(), os.getpid()], [0, 1], 0, flags, 8)
    watch.check(now=100.0)
    flags[8 + LEFT_WORD] = 1
    watch.check(now=100.1)  # within the interval: not looked at
    with pytest.raises(RankFailedError):
        watch.check(now=100.3)


def test_the_first_claim_wins_and_later_ones_learn_its_rank(tmp_path):
    path = str(tmp_path / "claim")
    assert claim_first_failure(path, 3) is None
    assert claim_first_failure(path, 1) == 3
    assert claim_first_failure(str(tmp_path / "missing" / "claim"), 1) is None  # unusable: report


def test_stale_claims_are_removed_and_fresh_ones_kept(tmp_path):
    from hpcdist.runtime.abort import CLAIM_PREFIX, STALE_CLAIM_S, _remove_stale_claims

    old, fresh, other = (tmp_path / f"{CLAIM_PREFIX}old", tmp_path / f"{CLAIM_PREFIX}new",
                         tmp_path / "unrelated")  # fmt: skip
    for path in (old, fresh, other):
        path.write_text("0\n")
    past = os.path.getmtime(old) - STALE_CLAIM_S - 5
    os.utime(old, (past, past))
    os.utime(other, (past, past))
    _remove_stale_claims(str(tmp_path))
    assert not old.exists() and fresh.exists() and other.exists()
