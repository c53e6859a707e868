"""Single-GPU NCCL all-reduce through hpcdist against the same call made with cupy.cuda.nccl.

For float32 buffers of 4 KiB .. 256 MiB on one GPU, one process, in one run:

* ``raw``: ``NcclCommunicator(1, uid, 0).allReduce(x, y, n, NCCL_FLOAT32,
  NCCL_SUM, stream)`` into a preallocated ``y``, as a user of CuPy writes it;
* ``hpcdist``: ``Collectives(COMM_WORLD).allreduce([x], "SUM",
  CommunicationOptions(implementation="NCCL"))`` on the same buffer and
  stream (the stream current), which returns a new array (route ``nccl``).

The two are timed in turn, ``--repeats`` times (the order alternates), each
repetition ``iters`` calls between two CUDA events with no host wait in
between, after ``--warmup`` untimed calls; the time per call is the median.
Here the host is not held back, so what the host spends per call (Python,
packing) counts when it exceeds the GPU's work, as it would in a training step.
Both results are checked against the input once per size before timing. The
overhead is ``hpcdist / raw - 1`` in percent; the target is at most 10% at
every size of 16 MiB and more (reported PASS/FAIL, with the worst size). With one
rank NCCL moves nothing between GPUs: this measures hpcdist's call path around
``ncclAllReduce`` (fusion layout, agreement, result views), not communication.

Writes ``benchmarks/results/gpu_nccl.json`` (and ``.png`` with matplotlib).
Exits with code 2, measuring nothing, without a usable GPU or without NCCL.

Run: ``python benchmarks/gpu_nccl.py [--repeats 15] [--max-bytes 256MiB]``.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

import numpy as np
from gpu_common import (  # benchmarks/ is on sys.path when run as a script
    RESULTS,
    event_seconds,
    format_table,
    gb_per_s,
    iterations_for,
    machine_info,
    overhead_percent,
    refuse,
    require_gpu,
    summarize,
    write_report,
)

from hpcdist.bench.allreduce import format_bytes, parse_bytes, sizes

PROG = "gpu_nccl"
TARGET_MIN_BYTES = 16 << 20
TARGET_OVERHEAD_PERCENT = 10.0
SERIES = ("raw", "hpcdist")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=f"python benchmarks/{PROG}.py",
        description=("Single-GPU NCCL allreduce: hpcdist vs cupy.cuda.nccl"),
    )
    parser.add_argument("--min-bytes", type=parse_bytes, default=4 << 10)
    parser.add_argument("--max-bytes", type=parse_bytes, default=256 << 20)
    parser.add_argument("--repeats", type=int, default=15, help="timed repetitions (median)")
    parser.add_argument("--warmup", type=int, default=5, help="untimed calls first")
    parser.add_argument("--device", type=int, default=0, help="the GPU to use")
    parser.add_argument("--out", default=str(RESULTS), help="folder for the JSON and PNG")
    return parser


def _require_nccl() -> None:
    from hpcdist.collectives.nccl import nccl_available

    ok, why = nccl_available()
    if not ok:
        refuse(PROG, f"NCCL is not available: {why}")


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.repeats < 1 or args.warmup < 0 or args.min_bytes > args.max_bytes:
        raise SystemExit(f"{PROG}: --repeats >= 1, --warmup >= 0, --min-bytes <= --max-bytes")
    cp = require_gpu(PROG)
    _require_nccl()
    from cupy.cuda import nccl

    from hpcdist.collectives.engine import Collectives
    from hpcdist.collectives.options import CommunicationOptions
    from hpcdist.runtime import mpi

    comm_world = mpi().COMM_WORLD
    if comm_world.Get_size() != 1:
        refuse(
            PROG,
            f"it is a single-process benchmark, found {comm_world.Get_size()} ranks; "
            "run it without mpirun",
        )
    options = CommunicationOptions(implementation="NCCL")
    rows, routes = [], set()
    with cp.cuda.Device(args.device):
        stream = cp.cuda.Stream(non_blocking=True)
        raw_comm = nccl.NcclCommunicator(1, nccl.get_unique_id(), 0)
        engine = Collectives(comm_world)
        for nbytes in sizes(args.min_bytes, args.max_bytes, 4):
            n = nbytes // 4
            with stream:
                x = cp.random.standard_normal(n, dtype=cp.float32)
                y = cp.empty_like(x)
            expected = x.get()

            def raw(x: Any = x, y: Any = y, n: int = n) -> None:
                raw_comm.allReduce(
                    x.data.ptr, y.data.ptr, n, nccl.NCCL_FLOAT32, nccl.NCCL_SUM, stream.ptr
                )

            def ours(x: Any = x) -> Any:
                return engine.allreduce([x], "SUM", options)

            with stream:
                raw()
                (got,) = ours()
                routes.add(engine.last_device_route)
            stream.synchronize()
            if not (np.array_equal(y.get(), expected) and np.array_equal(got.get(), expected)):
                raise SystemExit(f"{PROG}: a {format_bytes(nbytes)} allreduce gave wrong values")
            del got
            calls = {"raw": raw, "hpcdist": ours}
            iters = iterations_for(2 * nbytes, hi=100)
            with stream:
                for _ in range(args.warmup):
                    raw()
                    ours()
            samples: dict[str, list[float]] = {name: [] for name in SERIES}
            hosts: dict[str, list[float]] = {name: [] for name in SERIES}
            for rep in range(args.repeats):
                order = SERIES if rep % 2 == 0 else SERIES[::-1]
                for name in order:
                    gpu_s, host_s = event_seconds(cp, stream, calls[name], iters)
                    samples[name].append(gpu_s)
                    hosts[name].append(host_s)
            row: dict[str, Any] = {"bytes": nbytes, "iters": iters}
            for name in SERIES:
                seconds = summarize(samples[name])["median"]
                row[name] = {
                    "seconds": seconds,
                    "algbw_gb_per_s": gb_per_s(nbytes, seconds),
                    "host_us_per_call": summarize(hosts[name])["median"] * 1e6,
                }
            row["overhead_percent"] = overhead_percent(
                row["hpcdist"]["seconds"], row["raw"]["seconds"]
            )
            rows.append(row)
            del x, y
            cp.get_default_memory_pool().free_all_blocks()
        engine.close()
        raw_comm.destroy()
        info = machine_info(cp, args.device)
    at_target = [r for r in rows if r["bytes"] >= TARGET_MIN_BYTES]
    worst_bytes = None
    if at_target:
        worst = max(at_target, key=lambda r: r["overhead_percent"])
        measured, worst_bytes = worst["overhead_percent"], worst["bytes"]
        status = "PASS" if measured <= TARGET_OVERHEAD_PERCENT else "FAIL"
    else:
        measured, status = None, "SKIPPED"
    headers = [
        "size",
        "raw us",
        "hpcdist us",
        "raw GB/s",
        "hpcdist GB/s",
        "overhead %",
        "hpcdist host us",
    ]
    table = [
        [
            format_bytes(r["bytes"]),
            f"{r['raw']['seconds'] * 1e6:.1f}",
            f"{r['hpcdist']['seconds'] * 1e6:.1f}",
            f"{r['raw']['algbw_gb_per_s']:.1f}",
            f"{r['hpcdist']['algbw_gb_per_s']:.1f}",
            f"{r['overhead_percent']:+.1f}",
            f"{r['hpcdist']['host_us_per_call']:.1f}",
        ]
        for r in rows
    ]
    print(
        f"{info['gpu']} ({info['nccl']}): float32 SUM, one rank, median of {args.repeats}; "
        f"route {sorted(routes)}"
    )
    print(format_table(headers, table))
    report = {
        "benchmark": "single-GPU NCCL allreduce: hpcdist Collectives vs cupy.cuda.nccl directly",
        "command": "python benchmarks/gpu_nccl.py " + " ".join(argv or sys.argv[1:]),
        "machine": info,
        "repeats": args.repeats,
        "warmup": args.warmup,
        "routes": sorted(r for r in routes if r is not None),
        "target": {
            "bytes_at_least": TARGET_MIN_BYTES,
            "overhead_percent_at_most": TARGET_OVERHEAD_PERCENT,
            "measured": measured,  # the worst size's overhead
            "worst_bytes": worst_bytes,
            "status": status,
        },
        "rows": rows,
    }
    path = write_report(PROG, report, args.out)
    from hpcdist.bench.report import save_line_plot

    save_line_plot(
        PROG,
        [r["bytes"] for r in rows],
        {name: [r[name]["algbw_gb_per_s"] for r in rows] for name in SERIES},
        folder=args.out,
        xlabel="bytes (float32)",
        ylabel="algbw GB/s",
        title="One-GPU NCCL allreduce: hpcdist vs cupy.cuda.nccl",
        loglog=True,
    )
    print(
        f"target (overhead <= {TARGET_OVERHEAD_PERCENT}% at >= "
        f"{format_bytes(TARGET_MIN_BYTES)}): "
        f"{status}; wrote {path}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
