"""Strategy-path collectives benchmark: what users call against the engine and raw MPI.

Run: ``mpirun -n 2 hpcdist bench strategy`` (or ``python benchmarks/strategy_collectives.py``).

In one run, on the same buffers and ranks, float32 SUM, 4 B .. 64 MiB:

* ``mpi4py``: raw ``comm.Allreduce(x, recv, MPI.SUM)`` (the baseline);
* ``engine``: ``Collectives.allreduce([x], "SUM")`` (AUTO) on the strategy's engine;
* ``engine-shm`` and ``engine-mpi``: the engine with SHM and MPI forced (where
  AUTO's MPI band comes from: :data:`hpcdist.collectives.choice.MPI_BAND`);
* ``strategy-reduce``: ``MultiWorkerMirroredStrategy.reduce("SUM", per_replica, axis=None)``;
* ``run-all-reduce``: ``strategy.run(lambda g: get_replica_context().all_reduce("SUM", g))``;
* ``gloo``: ``torch.distributed.all_reduce`` when torch is installed.

Series are timed in turn (in a new order every repetition), up to 20
calls (one from 2 MiB up) between a barrier and the clock, the slowest rank's
time; each series keeps the best of ``--repeats`` (default 15, three times as
many from 1 MiB up; best-of-N: the machine is shared and a long repetition is
almost always interrupted by another job). Then the
ResNet-50 gradient list (161 tensors): ``run`` + ``all_reduce`` of the list
against a per-tensor loop of raw ``Allreduce``. Every series' result is
checked against raw MPI's once per size first. Finally the small path's
fixed costs: the compiled barrier call that publishes and compares the
call's digest (the whole always-on agreement check: an upper bound of its
cost), and a 4 KiB call unchecked against checked (a timeout: sequence
numbers, the arrival board).

Rank 0 prints the tables, judges the issue's targets and writes
``<out>/strategy_collectives.json`` and ``.png``.

Example:
    >>> judge_targets([], None, None)[0]["status"]
    'SKIPPED'
"""

from __future__ import annotations

import argparse
import functools
import platform
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

import hpcdist as hd
from hpcdist.bench.allreduce import (
    GLOO,
    RAW,
    BenchmarkError,
    Gloo,
    agree_or_raise,
    format_bytes,
    parse_bytes,
    time_call,
)
from hpcdist.bench.report import save_line_plot, save_report
from hpcdist.bench.resnet50 import resnet50_gradients
from hpcdist.collectives import CommunicationOptions, ReduceOp
from hpcdist.kernels import arrive_and_wait
from hpcdist.runtime import library_version, mpi, world

ENGINE = "engine"
STRATEGY_REDUCE = "strategy-reduce"
RUN_ALL_REDUCE = "run-all-reduce"
PUBLIC = (STRATEGY_REDUCE, RUN_ALL_REDUCE)
FORCED = {"engine-shm": "SHM", "engine-mpi": "MPI"}
NAME = "strategy_collectives"
SMALL = 4 << 10
LARGE = 1 << 20
BIGGEST = 64 << 20


def size_list(min_bytes: int, max_bytes: int) -> list[int]:
    """Sizes ×4 up to 1 MiB, then ×2 (the crossover band needs the finer steps).

    Example:
        >>> [format_bytes(n) for n in size_list(4, 4 << 20)][-4:]
        ['256 KiB', '1 MiB', '2 MiB', '4 MiB']
    """
    out, n = [], min_bytes
    while n <= max_bytes:
        out.append(n)
        n *= 4 if n < LARGE else 2
    return out


def _target(key: str, name: str, threshold: str, values: dict[str, float],
            ok: Callable[[float], bool], worst: Callable[[Sequence[float]], float]) -> dict:
    if not values:
        return {"id": key, "name": name, "threshold": threshold, "values": {},
                "worst": None, "status": "SKIPPED"}
    passed = all(ok(v) for v in values.values())
    return {
        "id": key,
        "name": name,
        "threshold": threshold,
        "values": values,
        "worst": worst(list(values.values())),
        "status": "MET" if passed else "MISSED",
    }


def judge_targets(
    rows: list[dict[str, Any]], resnet: dict[str, Any] | None, ranks: int | None
) -> list[dict[str, Any]]:
    """The issue's targets (2 ranks) from the rows' best times: MET, MISSED or SKIPPED.

    Example: ``judge_targets(report["rows"], report["resnet50"], 2)``.
    """
    best = {r["bytes"]: r["seconds"] for r in rows}
    ratio_large: dict[str, float] = {}
    extra_small: dict[str, float] = {}
    for nbytes, s in best.items():
        for name in PUBLIC:
            if name not in s:
                continue
            key = f"{name} {format_bytes(nbytes)}"
            if nbytes >= LARGE:
                ratio_large[key] = s[name] / s[ENGINE]
            if nbytes <= SMALL:
                extra_small[key] = (s[name] - s[ENGINE]) * 1e6
    engine_small = {
        format_bytes(n): s[ENGINE] / s[RAW] for n, s in best.items() if n <= SMALL
    }
    auto_large = {format_bytes(n): s[RAW] / s[ENGINE] for n, s in best.items() if n >= LARGE}
    auto_biggest = {format_bytes(n): s[RAW] / s[ENGINE] for n, s in best.items() if n == BIGGEST}
    fused = {"resnet50": resnet["loop_over_run"]} if resnet else {}
    return [
        _target("public_large", "public path / engine time at >= 1 MiB", "<= 1.1", ratio_large,
                lambda v: v <= 1.1, max),
        _target("public_small", "public path - engine time at <= 4 KiB (us)", "<= 10", extra_small,
                lambda v: v <= 10.0, max),
        _target("engine_small", "engine / raw MPI latency at <= 4 KiB", "<= 3", engine_small,
                lambda v: v <= 3.0, max),
        _target("auto_large", "raw MPI / AUTO engine time at >= 1 MiB (speed-up)", ">= 1.0",
                auto_large, lambda v: v >= 1.0, min),
        _target("auto_64mib", "raw MPI / AUTO engine time at 64 MiB", ">= 1.5", auto_biggest,
                lambda v: v >= 1.5, min),
        _target("resnet", "ResNet-50 list: raw per-tensor loop / run + all_reduce", ">= 1.5", fused,
                lambda v: v >= 1.5, min),
    ]


def mpi_band_from_rows(runs: Sequence[Sequence[dict[str, Any]]]) -> tuple[int, int]:
    """AUTO's MPI band (``[lo, hi)`` bytes) derived from benchmark rows of one or more runs.

    Per size, each of ``engine-shm`` and ``engine-mpi`` keeps its best time over
    all runs; the band runs from the smallest size where MPI is faster to the
    next measured size (above it) where the window is faster again (or the
    largest size measured, doubled). ``(0, 0)``: MPI never wins. Where MPI wins
    at several separate sizes, the band spans from the first to the end of the
    last. This is how :data:`hpcdist.collectives.choice.MPI_BAND` is made:
    ``python benchmarks/mpi_band.py`` prints it from ``benchmarks/results``.

    Example:
        >>> row = lambda n, shm, mpi: {"bytes": n, "seconds": {"engine-shm": shm,
        ...                                                     "engine-mpi": mpi}}
        >>> mpi_band_from_rows([[row(1, 1.0, 2.0), row(2, 3.0, 2.0), row(4, 1.0, 2.0)]])
        (2, 4)
    """
    best: dict[int, dict[str, float]] = {}
    for rows in runs:
        for row in rows:
            seconds = row["seconds"]
            if "engine-shm" not in seconds or "engine-mpi" not in seconds:
                continue
            got = best.setdefault(int(row["bytes"]), {})
            for name in ("engine-shm", "engine-mpi"):
                got[name] = min(got.get(name, float("inf")), float(seconds[name]))
    sizes = sorted(best)
    wins = [n for n in sizes if best[n]["engine-mpi"] < best[n]["engine-shm"]]
    if not wins:
        return (0, 0)
    above = [n for n in sizes if n > wins[-1]]
    return (wins[0], above[0] if above else 2 * wins[-1])


def _iters(nbytes: int, quick: bool) -> int:
    """Calls per repetition: short repetitions (about 2 MiB, at most 20 calls, one call
    from 2 MiB up), so that the best of many is one no other job interrupted."""
    return max(1, min(20, (2 << 20) // max(nbytes, 1)))


def _repeats(nbytes: int, repeats: int) -> int:
    """Repetitions at ``nbytes``: three times as many from 1 MiB up (single calls of a
    few milliseconds, which other jobs on a shared machine interrupt most often)."""
    return repeats * 3 if nbytes >= LARGE else repeats


def measure_size(nbytes: int, *, comm: Any, strategy: Any, gloo: Gloo, repeats: int,
                 quick: bool) -> tuple[dict[str, list[float]], dict[str, str]]:
    """Check, then time every series on one set of buffers of ``nbytes``.

    Returns the repetitions' seconds per series and the algorithm AUTO picked.
    """

    MPI = mpi()
    rank = comm.Get_rank()
    x = ((np.arange(nbytes // 4) % 17 + rank) * 0.25).astype(np.float32)
    recv = np.empty_like(x)
    engine = strategy.extended.collectives
    per_replica = strategy.experimental_distribute_values_from_function(lambda ctx: x)

    def step(g: Any) -> Any:
        ctx = hd.get_replica_context()
        assert ctx is not None  # called by strategy.run
        return ctx.all_reduce("SUM", g)

    calls: dict[str, Callable[[], Any]] = {
        RAW: functools.partial(comm.Allreduce, x, recv, MPI.SUM),
        ENGINE: functools.partial(engine.allreduce, [x], ReduceOp.SUM),
        STRATEGY_REDUCE: functools.partial(strategy.reduce, "SUM", per_replica, None),
        RUN_ALL_REDUCE: functools.partial(strategy.run, step, (x,)),
    }
    for name, impl in FORCED.items():
        opts = CommunicationOptions(implementation=impl)
        calls[name] = functools.partial(engine.allreduce, [x], ReduceOp.SUM, opts)
    if gloo.dist is not None:
        tensor = gloo.torch.zeros(x.size, dtype=gloo.torch.float32)
        calls[GLOO] = functools.partial(gloo.dist.all_reduce, tensor)
    calls[RAW]()
    problems = []
    picked = {}
    for name, call in calls.items():
        if name in (RAW, GLOO):
            continue
        got = call()
        got = got[0] if isinstance(got, list) else got
        if name == ENGINE:
            picked["auto"] = engine.last_algorithm
        if np.asarray(got).view(np.uint8).tobytes() != recv.view(np.uint8).tobytes():
            problems.append(f"{name} of {format_bytes(nbytes)} differs from raw MPI's bits")
        del got
    agree_or_raise(comm, problems, "strategy-path results differ")
    times = time_shuffled(comm, calls, _iters(nbytes, quick), _repeats(nbytes, repeats), warmup=2)
    return times, picked


def time_shuffled(comm: Any, calls: dict[str, Callable[[], Any]], iters: int, repeats: int,
                  warmup: int) -> dict[str, list[float]]:
    """Each series' per-call seconds over ``repeats`` rounds, in a new order every round
    (the same on every rank), so that no series always follows the same neighbour.

    Example: ``time_shuffled(comm, {"raw": f, "engine": g}, iters=10, repeats=5, warmup=2)``.
    """

    names = list(calls)
    for name in names:
        for _ in range(warmup):
            calls[name]()
    times: dict[str, list[float]] = {name: [] for name in names}
    for r in range(repeats):
        for k in np.random.default_rng(r).permutation(len(names)):
            times[names[k]].append(time_call(comm, calls[names[k]], iters))
    return times


def measure_resnet(*, comm: Any, strategy: Any, repeats: int) -> dict[str, Any]:
    """ResNet-50's 161 gradients: ``run`` + ``all_reduce`` of the list vs a per-tensor raw loop."""

    MPI = mpi()
    rank = comm.Get_rank()
    grads = resnet50_gradients(np.dtype(np.float32), fill=rank + 1)
    pairs = [(g, np.empty_like(g)) for g in grads]
    engine = strategy.extended.collectives

    def loop() -> None:
        for g, r in pairs:
            comm.Allreduce(g, r, MPI.SUM)

    def step(gs: Any) -> Any:
        ctx = hd.get_replica_context()
        assert ctx is not None  # called by strategy.run
        return ctx.all_reduce("SUM", gs)

    calls: dict[str, Callable[[], Any]] = {
        "loop": loop,
        "engine": functools.partial(engine.allreduce, grads, ReduceOp.SUM),
        "run": functools.partial(strategy.run, step, (grads,)),
    }
    loop()
    got = calls["run"]()
    problems = []
    if not all(np.array_equal(a, r) for a, (_, r) in zip(got, pairs, strict=True)):
        problems.append("run + all_reduce of the ResNet-50 list differs from raw MPI")
    agree_or_raise(comm, problems, "ResNet-50 results differ")
    del got
    times = time_shuffled(comm, calls, iters=1, repeats=repeats, warmup=1)
    best = {name: min(t) for name, t in times.items()}
    return {
        "tensors": len(grads),
        "bytes": sum(g.nbytes for g in grads),
        "seconds": best,
        "repeats": times,
        "loop_over_run": best["loop"] / best["run"],
        "loop_over_engine": best["loop"] / best["engine"],
    }


def measure_small_costs(*, comm: Any, strategy: Any, repeats: int) -> dict[str, float]:
    """Microseconds: the compiled barrier call that publishes and compares the digest
    (the always-on check; one rank's own cost, no peer waited for), and a 4 KiB call
    unchecked vs checked (sequence numbers, arrival board)."""

    flags = np.zeros(8, np.int64)
    n = 20000
    best = float("inf")
    for _ in range(repeats):
        flags[:] = 0
        t0 = time.perf_counter()
        for seq in range(1, n + 1):
            arrive_and_wait(flags, 0, 1, 8, seq, 12345, 100)
        best = min(best, (time.perf_counter() - t0) / n)
    engine = strategy.extended.collectives
    x = np.ones(1024, np.float32)
    checked = CommunicationOptions(timeout_seconds=600)
    calls: dict[str, Callable[[], Any]] = {
        "unchecked": functools.partial(engine.allreduce, [x], ReduceOp.SUM),
        "checked": functools.partial(engine.allreduce, [x], ReduceOp.SUM, checked),
    }
    times = time_shuffled(comm, calls, iters=20, repeats=repeats, warmup=5)
    return {
        "barrier_with_digest_us": best * 1e6,
        "small_unchecked_us": min(times["unchecked"]) * 1e6,
        "small_checked_us": min(times["checked"]) * 1e6,
    }


def format_rows(rows: list[dict[str, Any]], names: Sequence[str]) -> str:
    """The per-size table of best times in microseconds. Example: ``print(format_rows(r, n))``."""
    head = f"{'size':>8} {'auto picks':>12}" + "".join(f"{n:>17}" for n in names)
    lines = [head, "-" * len(head)]
    for row in rows:
        cells = "".join(
            f"{row['seconds'][n] * 1e6:>17.1f}" if n in row["seconds"] else f"{'-':>17}"
            for n in names
        )
        lines.append(f"{format_bytes(row['bytes']):>8} {row['auto']:>12}{cells}")
    return "\n".join(lines)


def build_parser(prog: str, out: str) -> argparse.ArgumentParser:
    """The command line. Example: ``build_parser("x", "results").parse_args(["--quick"])``."""
    p = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n\n")[0])
    p.add_argument("--min-bytes", type=parse_bytes, default=4)
    p.add_argument("--max-bytes", type=parse_bytes, default=None,
                   help="largest size (default 64 MiB; 1 MiB with --quick)")
    p.add_argument("--repeats", type=int, default=None, help="repetitions, best kept (default 15)")
    p.add_argument("--quick", action="store_true", help="sizes to 1 MiB, 3 repetitions")
    p.add_argument("--no-gloo", action="store_true", help="skip the torch gloo series")
    p.add_argument("--out", default=out, help=f"folder for the JSON and PNG (default {out})")
    p.add_argument("--name", default=None, help=f"file name (default {NAME}, {NAME}_mpiN)")
    return p


def main(argv: Sequence[str] | None = None, *, prog: str = "hpcdist bench strategy",
         out: str = "benchmarks/results") -> int:
    """Run on every rank; rank 0 prints and writes. Example: ``main(["--quick"])``."""
    args = build_parser(prog, out).parse_args(argv)

    w = world()
    if w.size < 2:
        raise BenchmarkError(f"runs on {w.size} rank; expected 2 or more: mpirun -n 2 {prog}")
    if args.repeats is not None and args.repeats < 1:
        raise BenchmarkError(f"--repeats is {args.repeats}; expected an integer >= 1")
    comm = w.comm
    strategy = hd.MultiWorkerMirroredStrategy()
    repeats = args.repeats or (3 if args.quick else 15)
    max_bytes = args.max_bytes or ((1 << 20) if args.quick else BIGGEST)
    gloo = Gloo(None, None, "--no-gloo") if args.no_gloo else Gloo.start(comm)
    started = time.perf_counter()
    rows: list[dict[str, Any]] = []
    for nbytes in size_list(args.min_bytes, max_bytes):
        times, picked = measure_size(nbytes, comm=comm, strategy=strategy, gloo=gloo,
                                     repeats=repeats, quick=args.quick)
        rows.append({
            "bytes": nbytes,
            "auto": picked.get("auto"),
            "seconds": {name: min(t) for name, t in times.items()},
            "repeats": times,
        })
    gloo.stop()
    resnet = None if args.quick else measure_resnet(comm=comm, strategy=strategy,
                                                     repeats=max(3, repeats // 2))
    small = measure_small_costs(comm=comm, strategy=strategy, repeats=repeats)
    if comm.Get_rank() != 0:
        return 0
    names = [RAW, ENGINE, *PUBLIC, *FORCED, *([GLOO] if gloo.note is None else [])]
    targets = judge_targets(rows, resnet, w.size)
    report = {
        "benchmark": NAME,
        "ranks": w.size,
        "nodes": w.node_count,
        "mpi": library_version(),
        "machine": platform.platform(),
        "statistic": f"best of {repeats}",
        "series": names,
        "gloo": gloo.note or "measured",
        "rows": rows,
        "resnet50": resnet,
        "small_path": small,
        "targets": targets,
        "wall_seconds": time.perf_counter() - started,
    }
    print(format_rows(rows, names))
    if resnet:
        s = resnet["seconds"]
        print(f"\nResNet-50 list ({resnet['tensors']} tensors): loop {s['loop'] * 1e3:.1f} ms, "
              f"engine {s['engine'] * 1e3:.1f} ms, run+all_reduce {s['run'] * 1e3:.1f} ms "
              f"(loop/run {resnet['loop_over_run']:.2f}x)")
    print("\nsmall path (us): " + ", ".join(f"{k} {v:.2f}" for k, v in small.items()))
    print("\ntargets:")
    for t in targets:
        worst = t.get("worst")
        shown = "-" if worst is None else f"{worst:.2f}"
        print(f"  {t['status']:>7}  {t['name']} {t['threshold']} (worst {shown})")
    name = args.name or (NAME if w.size == 2 else f"{NAME}_mpi{w.size}")
    path = save_report(name, report, args.out)
    xs = [float(r["bytes"]) for r in rows]
    save_line_plot(
        name, xs,
        {n: [r["seconds"][n] * 1e6 for r in rows] for n in names if n in rows[0]["seconds"]},
        folder=args.out, xlabel="bytes (float32 SUM)", ylabel="time per call (us, best)",
        title=f"allreduce through the Strategy API, {w.size} ranks", loglog=True,
    )
    print(f"\nwrote {path}")
    return 0
