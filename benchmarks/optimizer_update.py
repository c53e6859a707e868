"""Fused optimizer updates vs a NumPy axpy, over one flat float32 buffer, one thread.

For 2.2 M and 8.4 M parameters (float32), best of several repeats:

* the fused Numba kernels of :mod:`hpcdist.kernels.optim` (SGD, SGD with
  momentum, Adam, RMSprop), in place;
* ``axpy``: ``p += a * g`` with a preallocated temporary
  (``np.multiply(g, a, out=tmp); np.add(p, tmp, out=p)``), the cheapest
  NumPy form of the plain SGD step;
* ``naive``: ``p -= lr * g`` (allocates the temporary every call);
* ``apply_gradients``: the whole ``Adam.apply_gradients`` call (pack the
  gradients of 8 variables into the flat buffer, then the fused update),
  to show what the optimizer adds around the kernel.

Each row gives the time, the ratio to axpy, the bytes the update must move
(reads + writes of 4-byte elements: SGD 3 streams, momentum and RMSprop 5,
Adam 7, axpy and naive 5) and the ratio of time per byte to axpy's.

Writes ``benchmarks/results/optimizer_update.json`` and ``.png``.

Run: ``python benchmarks/optimizer_update.py [--repeats 9]``.
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")  # one thread: set before NumPy starts
os.environ.setdefault("NUMBA_NUM_THREADS", "1")

import argparse  # noqa: E402
import platform  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402
from common import save_line_plot, save_report  # noqa: E402  (benchmarks/ is on sys.path)

import hpcdist as hd  # noqa: E402
from hpcdist.kernels import optim  # noqa: E402
from hpcdist.optimizers import Adam  # noqa: E402

SIZES = [2_200_000, 8_400_000]
ITEM = 4  # float32
STREAMS = {
    "sgd": 3,
    "momentum": 5,
    "adam": 7,
    "rmsprop": 5,
    "axpy": 5,
    "naive": 5,
    "apply_gradients": 7 + 2,
}  # fmt: skip  (+ the gradient pack: read and write)


def best_seconds(call, repeats: int) -> float:
    """The fastest of ``repeats`` timed calls (after one warm-up call)."""
    call()
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        call()
        best = min(best, time.perf_counter() - t0)
    return best


def calls_for(n: int) -> dict:
    """The update calls to time over ``n`` float32 parameters (fresh buffers each)."""
    rng = np.random.default_rng(0)
    p = rng.standard_normal(n).astype(np.float32)
    g = (rng.standard_normal(n) * 1e-3).astype(np.float32)
    vel, m = np.zeros(n, np.float32), np.zeros(n, np.float32)
    v = np.full(n, 1e-3, np.float32)
    tmp = np.empty(n, np.float32)
    empty = np.empty(0, np.float32)
    a = np.float32(-1e-6)
    lr = np.float32(1e-6)
    h_sgd = np.array([1e-6, 0.0], np.float32)
    h_mom = np.array([1e-6, 0.9, 0.0], np.float32)
    h_adam = np.array([1e-6, 0.9, 0.999, 1e-7, 0.0], np.float32)
    h_rms = np.array([1e-6, 0.9, 0.0, 1e-7, 0.0], np.float32)

    def naive():
        nonlocal p
        p -= lr * g

    def axpy():
        np.multiply(g, a, out=tmp)
        np.add(p, tmp, out=p)

    # the whole optimizer: 8 variables (one large, several small, like a small model)
    shapes = [(n - 3 * 1024 - 4096 - 64 - 10, 1), (1024,), (1024,), (1024,), (4096,), (64,),
              (8,), (2,)]  # fmt: skip
    variables = [hd.Variable(np.zeros(s, np.float32)) for s in shapes]
    grads = [np.full(s, 1e-3, np.float32) for s in shapes]
    opt = Adam(1e-6)
    pairs = list(zip(grads, variables, strict=True))

    return {
        "sgd": lambda: optim.sgd(p, p, g, h_sgd),
        "momentum": lambda: optim.momentum(p, p, g, vel, h_mom, False),
        "adam": lambda: optim.adam(p, p, g, m, v, empty, h_adam),
        "rmsprop": lambda: optim.rmsprop(p, p, g, v, empty, empty, h_rms),
        "axpy": axpy,
        "naive": naive,
        "apply_gradients": lambda: opt.apply_gradients(pairs),
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python benchmarks/optimizer_update.py")
    parser.add_argument("--repeats", type=int, default=9, help="timed calls per row (best kept)")
    args = parser.parse_args(argv)
    rows = []
    for n in SIZES:
        calls = calls_for(n)
        times = {name: best_seconds(call, args.repeats) for name, call in calls.items()}
        axpy_per_byte = times["axpy"] / (STREAMS["axpy"] * ITEM * n)
        for name, seconds in times.items():
            nbytes = STREAMS[name] * ITEM * n
            rows.append({
                "params": n,
                "update": name,
                "seconds": seconds,
                "bytes": nbytes,
                "gb_per_s": nbytes / seconds / 1e9,
                "ratio_to_axpy": seconds / times["axpy"],
                "ratio_per_byte_to_axpy": (seconds / nbytes) / axpy_per_byte,
            })  # fmt: skip
    print("float32, one thread; best of", args.repeats, "calls")
    header = f"{'params':>9} {'update':>16} {'ms':>8} {'GB/s':>7} {'x axpy':>7} {'x axpy/B':>9}"
    print(header)
    for r in rows:
        print(f"{r['params']:>9} {r['update']:>16} {r['seconds'] * 1e3:>8.2f} "
              f"{r['gb_per_s']:>7.2f} {r['ratio_to_axpy']:>7.2f} "
              f"{r['ratio_per_byte_to_axpy']:>9.2f}")  # fmt: skip
    report = {
        "benchmark": "fused optimizer updates vs NumPy axpy (float32 flat buffer, one thread)",
        "machine": platform.platform(),
        "processor": platform.processor(),
        "numpy": np.__version__,
        "command": "python benchmarks/optimizer_update.py",
        "repeats": args.repeats,
        "bytes_per_element": {k: v * ITEM for k, v in STREAMS.items()},
        "rows": rows,
    }
    path = save_report("optimizer_update", report)
    names = list(STREAMS)
    save_line_plot(
        "optimizer_update",
        SIZES,
        {name: [r["gb_per_s"] for r in rows if r["update"] == name] for name in names},
        xlabel="parameters (float32)",
        ylabel="effective GB/s (bytes the update must move)",
        title="Fused optimizer updates vs NumPy axpy, one thread",
    )
    print(f"wrote {path} and .png")


if __name__ == "__main__":
    main()
