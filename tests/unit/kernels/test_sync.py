"""Atomic flags and bounded spin waits, in one process and across two."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from numba import njit

from hpcdist.kernels import atomic_load, atomic_store, cpu_pause, wait_all, wait_equal


def test_store_then_load_and_strided_views():
    flags = np.zeros(6, np.int64)
    atomic_store(flags, 4, -3)
    assert atomic_load(flags, 4) == -3
    assert flags.tolist() == [0, 0, 0, 0, -3, 0]
    view = flags[1::2]  # a strided view writes the right element
    atomic_store(view, 2, 9)
    assert flags[5] == 9 and atomic_load(view, 2) == 9
    cpu_pause()


def test_usable_from_other_numba_code():
    @njit
    def bump_all(flags):
        for i in range(flags.shape[0]):
            atomic_store(flags, i, atomic_load(flags, i) + 1)
        return wait_all(flags, 0, flags.shape[0], 1, 1, 1)

    flags = np.zeros(3, np.int64)
    assert bump_all(flags)
    assert flags.tolist() == [1, 1, 1]


def test_wait_all_false_until_every_flag_reaches_target():
    flags = np.zeros(8, np.int64)
    # flags 1, 4, 7 (first=1, stride=3)
    assert not wait_all(flags, 1, 3, 3, 2, 50)
    flags[1] = 2
    flags[4] = 5
    assert not wait_all(flags, 1, 3, 3, 2, 50)
    flags[7] = 1
    assert not wait_all(flags, 1, 3, 3, 2, 50)
    flags[7] = 2
    assert wait_all(flags, 1, 3, 3, 2, 50)
    assert wait_all(flags, 1, 3, 3, 2, 0)  # zero rounds still checks once
    assert wait_all(flags, 0, 0, 1, 99, 1)  # no flags: nothing to wait for


def test_wait_equal_needs_equality():
    flags = np.array([3, 0, 3, 4], np.int64)
    assert not wait_equal(flags, 0, 2, 2, 4, 10)
    assert wait_equal(flags, 0, 2, 2, 3, 10)
    assert not wait_equal(flags, 2, 2, 1, 3, 10)


def test_wait_all_sees_a_store_from_another_thread():
    flags = np.zeros(2, np.int64)

    def later():
        time.sleep(0.02)
        atomic_store(flags, 1, 1)

    thread = threading.Thread(target=later)
    thread.start()
    deadline = time.monotonic() + 10
    while not wait_all(flags, 1, 1, 1, 1, 10_000):
        assert time.monotonic() < deadline, "the store was never seen"
    thread.join()


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda f: atomic_load(f, 4), r"outside the flag array.*=', 4, 4\)"),
        (lambda f: atomic_store(f, -1, 0), r"outside the flag array.*=', -1, 4\)"),
        (lambda f: wait_all(f, 1, 2, 3, 0, 1), r"leave the flag array.*=', 1, 2, 3, 4\)"),
        (lambda f: wait_equal(f, -1, 1, 1, 0, 1), r"leave the flag array.*=', -1, 1, 1, 4\)"),
    ],
)
def test_out_of_range_flags_raise_index_error(call, match):
    with pytest.raises(IndexError, match=match):
        call(np.zeros(4, np.int64))


def test_negative_count_raises_value_error():
    with pytest.raises(ValueError, match=r"count is negative.*found', -1\)"):
        wait_all(np.zeros(4, np.int64), 0, -1, 1, 0, 1)


_PEER = textwrap.dedent(
    """
    import os
    import sys
    import numpy as np
    from hpcdist.kernels import atomic_store, wait_all

    shared = np.memmap(sys.argv[1], np.uint8, mode="r+", shape=(128,))
    flags = shared[:64].view(np.int64)
    data = shared[64:96].view(np.float64)
    for i in range(1, int(sys.argv[2]) + 1):
        while not wait_all(flags, 0, 1, 1, i, 1000):
            os.sched_yield()
        data[1] = data[0] * 2  # data[0] was written before the ping's release store
        atomic_store(flags, 4, i)  # pong
    """
)


def _shared_file(tmp_path) -> str:
    shm = Path("/dev/shm")
    folder = shm if shm.is_dir() and os.access(shm, os.W_OK) else tmp_path
    fd, name = tempfile.mkstemp(prefix="hpcdist-kernels-test-", dir=folder)
    os.close(fd)
    return name


def test_ping_pong_between_two_processes_through_shared_memory(tmp_path):
    rounds = 50
    name = _shared_file(tmp_path)
    try:
        shared = np.memmap(name, np.uint8, mode="w+", shape=(128,))
        flags = shared[:64].view(np.int64)
        data = shared[64:96].view(np.float64)
        peer = subprocess.Popen([sys.executable, "-c", _PEER, name, str(rounds)])
        try:
            deadline = time.monotonic() + 60
            for i in range(1, rounds + 1):
                data[0] = float(i)
                atomic_store(flags, 0, i)  # ping, publishes data[0]
                while not wait_all(flags, 4, 1, 1, i, 1000):
                    assert time.monotonic() < deadline, f"no pong for round {i}"
                    assert peer.poll() is None, "the peer process exited early"
                    os.sched_yield()
                assert data[1] == 2.0 * i  # written before the pong's release store
            assert peer.wait(timeout=30) == 0
        finally:
            if peer.poll() is None:
                peer.kill()
                peer.wait()
        del flags, data, shared
    finally:
        os.unlink(name)
