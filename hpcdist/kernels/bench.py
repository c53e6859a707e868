"""Throughput of the CPU kernels against NumPy, and a two-process flag ping.

Run ``python -m hpcdist.kernels.bench`` (``--mib 64 --rounds 20000``). Every
figure is the best of several runs, kernel and NumPy timed alternately in one
process; GB/s counts the bytes of one tensor (or one slot row) per second.
The ping bounces a flag between two processes through a file in ``/dev/shm``
with :func:`atomic_store` / :func:`wait_all` and reports the round trip.

Example: ``python -m hpcdist.kernels.bench --mib 8`` prints a small table.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

import numpy as np
from numba import njit

from hpcdist.kernels.cpu import MAX, MEAN, SUM, gather_bytes, reduce_slots, scale, scatter_bytes
from hpcdist.kernels.sync import atomic_store, wait_all


def _best(fn: Callable[[], object], repeats: int) -> float:
    fn()
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def _row(name: str, nbytes: int, t_kernel: float, t_numpy: float, numpy_name: str) -> str:
    gbs, ref = nbytes / t_kernel / 1e9, nbytes / t_numpy / 1e9
    return f"{name:<34} {gbs:7.2f} GB/s   {numpy_name:<34} {ref:7.2f} GB/s   x{gbs / ref:4.2f}"


def _numpy_sum(slots: np.ndarray, out: np.ndarray) -> None:
    if slots.dtype == np.float16:
        acc = slots[0].astype(np.float32)
        for k in range(1, slots.shape[0]):
            np.add(acc, slots[k], out=acc)
        out[:] = acc
    else:
        np.add(slots[0], slots[1], out=out)
        for k in range(2, slots.shape[0]):
            np.add(out, slots[k], out=out)


def throughput(mib: int = 64, repeats: int = 7) -> list[str]:
    """Lines of a table: each kernel at ``mib`` MiB against its NumPy equivalent.

    Example: ``print("\\n".join(throughput(8)))``.
    """
    nbytes = mib << 20
    lines = []
    src = np.random.default_rng(0).integers(0, 255, nbytes, dtype=np.uint8)
    dst = np.empty_like(src)
    addrs = np.array([src.__array_interface__["data"][0]], np.int64)
    zero = np.zeros(1, np.int64)
    size = np.array([nbytes], np.int64)
    for _ in range(3):  # alternate, so that both see the same machine state
        t_k = _best(lambda: gather_bytes(dst, addrs, size, zero), repeats)
        t_n = _best(lambda: np.copyto(dst, src), repeats)
    lines.append(_row("gather_bytes (1 tensor)", nbytes, t_k, t_n, "np.copyto"))

    # a bucket of 4096 tensors of 16 KiB
    parts = np.split(src, 4096)
    addrs_many = np.array([p.__array_interface__["data"][0] for p in parts], np.int64)
    sizes = np.full(len(parts), parts[0].nbytes, np.int64)
    offsets = (np.arange(len(parts)) * parts[0].nbytes).astype(np.int64)
    t_k = _best(lambda: gather_bytes(dst, addrs_many, sizes, offsets), repeats)
    t_n = _best(lambda: np.concatenate(parts, out=dst), repeats)
    lines.append(_row("gather_bytes (4096 x 16 KiB)", nbytes, t_k, t_n, "np.concatenate"))
    back = np.empty_like(src)
    addrs_back = np.array([back.__array_interface__["data"][0]], np.int64)
    t_k = _best(lambda: scatter_bytes(dst, addrs_back, size, zero), repeats)
    t_n = _best(lambda: np.copyto(back, dst), repeats)
    lines.append(_row("scatter_bytes (1 tensor)", nbytes, t_k, t_n, "np.copyto"))

    for dtype, n in (("float32", 2), ("float32", 4), ("float64", 2), ("int32", 2), ("float16", 2)):
        m = nbytes // np.dtype(dtype).itemsize
        window = np.ones((n, m + 16), dtype)
        slots = window[:, :m]
        out = np.empty(m, dtype)
        t_k = _best(partial(reduce_slots, slots, 0, m, out, 0, SUM, 1), repeats)
        t_n = _best(partial(_numpy_sum, slots, out), repeats)
        name = "float32 adds + astype" if dtype == "float16" else "np.add chain"
        lines.append(_row(f"reduce_slots {dtype} n={n} SUM", nbytes, t_k, t_n, name))
        if dtype == "float32" and n == 2:
            t_k = _best(partial(reduce_slots, slots, 0, m, slots[1], 0, MEAN, 2), repeats)
            lines.append(_row("reduce_slots float32 n=2 MEAN in place", nbytes, t_k, t_n, name))
            t_k = _best(partial(reduce_slots, slots, 0, m, out, 0, MAX, 1), repeats)
            t_n = _best(partial(np.maximum, slots[0], slots[1], out=out), repeats)
            lines.append(_row("reduce_slots float32 n=2 MAX", nbytes, t_k, t_n, "np.maximum"))
    x = np.ones(nbytes // 4, np.float32)
    t_k = _best(lambda: scale(x, 3), repeats)
    t_n = _best(lambda: np.divide(x, np.float32(3), out=x), repeats)
    lines.append(_row("scale float32", nbytes, t_k, t_n, "np.divide(out=x)"))
    return lines


_SPINS = 1 << 24  # bounded waits: a dead peer ends a run instead of hanging it


@njit(nogil=True, cache=True)
def _ping_rounds(flags: np.ndarray, first: int, rounds: int, side: int) -> int:
    # side 0 pings (flag 0) and waits for the pong (flag 8); side 1 answers.
    # Returns the rounds done: fewer than asked when the other side went quiet.
    for i in range(first, first + rounds):
        if side == 0:
            atomic_store(flags, 0, i)
            if not wait_all(flags, 8, 1, 1, i, _SPINS):
                return i - first
        else:
            if not wait_all(flags, 0, 1, 1, i, _SPINS):
                return i - first
            atomic_store(flags, 8, i)
    return rounds


def _wait_for_peer(
    flags: np.ndarray, index: int, value: int, peer: subprocess.Popen, deadline: float
) -> None:
    while not wait_all(flags, index, 1, 1, value, _SPINS):
        if peer.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"ping: the peer process stopped answering (exit {peer.poll()})")


_PEER = (
    "import sys, time, numpy as np\n"
    "from hpcdist.kernels.bench import _ping_all\n"
    "flags = np.memmap(sys.argv[1], np.int64, mode='r+', shape=(16,))\n"
    "_ping_all(flags, 1, int(sys.argv[2]), 1, time.monotonic() + 120)\n"
)


def _ping_all(flags: np.ndarray, first: int, rounds: int, side: int, deadline: float) -> None:
    # _ping_rounds until all rounds are done; a bounded wait that ran out (this
    # process or the other one was descheduled) just resumes, until the deadline
    done = 0
    while done < rounds:
        done += _ping_rounds(flags, first + done, rounds - done, side)
        if time.monotonic() > deadline:
            raise RuntimeError("ping: the other process stopped answering")


def ping(rounds: int = 20000) -> tuple[float, float]:
    """Mean round trips in microseconds of a flag ping between two processes.

    The flags (ping at byte 0, pong at byte 64: separate cache lines) live in a
    file under ``/dev/shm``; the peer spins in compiled code. Returns the round
    trip with this side driven from a Python loop (one ``atomic_store`` and one
    ``wait_all`` call per round, as the engine does) and from compiled code.

    Example: ``ping(1000)`` is a few microseconds on an idle multi-core machine.
    """
    shm = Path("/dev/shm")
    folder = str(shm) if shm.is_dir() and os.access(shm, os.W_OK) else None
    fd, name = tempfile.mkstemp(prefix="hpcdist-ping-", dir=folder)
    os.close(fd)
    warm = 100
    try:
        flags = np.memmap(name, np.int64, mode="w+", shape=(16,))
        _ping_rounds(np.zeros(16, np.int64), 1, 0, 0)  # compile (or load) before timing
        peer = subprocess.Popen([sys.executable, "-c", _PEER, name, str(warm + 2 * rounds)])
        try:
            deadline = time.monotonic() + 120
            for i in range(1, warm + 1):  # the peer is up once these come back
                atomic_store(flags, 0, i)
                _wait_for_peer(flags, 8, i, peer, deadline)
            start = time.perf_counter()
            for i in range(warm + 1, warm + rounds + 1):
                atomic_store(flags, 0, i)
                _wait_for_peer(flags, 8, i, peer, deadline)
            from_python = (time.perf_counter() - start) / rounds * 1e6
            start = time.perf_counter()
            _ping_all(flags, warm + rounds + 1, rounds, 0, deadline)
            compiled = (time.perf_counter() - start) / rounds * 1e6
            peer.wait(timeout=60)
        finally:
            if peer.poll() is None:
                peer.kill()
                peer.wait()
        del flags
    finally:
        os.unlink(name)
    return from_python, compiled


def main(argv: list[str] | None = None) -> None:
    """Print the throughput table and the ping round trip.

    Example: ``python -m hpcdist.kernels.bench --mib 64``.
    """
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=int, default=64, help="size of each case in MiB")
    parser.add_argument("--rounds", type=int, default=20000, help="ping round trips")
    parser.add_argument("--repeats", type=int, default=7, help="runs per figure (best kept)")
    args = parser.parse_args(argv)
    print(f"CPU kernels vs NumPy, {args.mib} MiB, best of {args.repeats} (cpus: {os.cpu_count()})")
    for line in throughput(args.mib, args.repeats):
        print(line)
    runs = [ping(args.rounds) for _ in range(3)]  # spinning pairs suffer on a busy machine
    from_python = min(r[0] for r in runs)
    compiled = min(r[1] for r in runs)
    print(
        f"flag ping round trip, 2 processes, best of 3: {from_python:.2f} us from a Python "
        f"loop, {compiled:.2f} us from compiled code"
    )


if __name__ == "__main__":
    main()
