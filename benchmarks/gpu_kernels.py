"""Bandwidth of hpcdist's CUDA kernels against a device-to-device copy of the same bytes.

For 1, 16 and 256 MiB of float32 on one GPU, in one run:

* ``pack_cuda``: 64 tensors (the buffer split in 64 nearly equal parts) into
  one flat buffer, one launch (the bucket's :class:`TensorTable` built once,
  as the engine caches it); moves 2 x the bytes (read + write);
* ``unpack_cuda``: the flat buffer back into the 64 tensors; 2 x the bytes;
* ``reduce_slots_cuda``: the SUM of two rows of that size into a third buffer,
  one launch; moves 3 x the bytes (two reads, one write);
* ``optim_cuda.adam``: the fused Adam update in place over parameters of that
  size (reads p, g, m, v; writes p, m, v): 7 x the bytes;
* ``copy``: ``cudaMemcpyAsync`` device to device moving the same number of
  bytes as the kernel it is compared with (half of them read, half written).

Each figure is the median over ``--repeats`` repetitions of CUDA-event time
per call, ``iters`` calls back to back per repetition (about 1 GiB moved),
after ``--warmup`` untimed calls; a spinning kernel holds the stream while the
host enqueues, so launch overhead on the host does not leave the GPU idle (the
host's own time per call is reported beside it). The kernels get Numba views
of the CuPy arrays made once with ``sync=False`` (Numba otherwise waits on
the stream named in each CuPy array's interface at every call). The ratio
kernel GB/s / copy GB/s has a target of at least 0.8 (reported PASS/FAIL).

Writes ``benchmarks/results/gpu_kernels.json`` (and ``.png`` with matplotlib).
Exits with code 2, measuring nothing, when no GPU is usable.

Run: ``python benchmarks/gpu_kernels.py [--repeats 15] [--sizes-mib 1 16 256]``.
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
    ratio_status,
    require_gpu,
    summarize,
    write_report,
)

PROG = "gpu_kernels"
TENSORS = 64
TARGET_RATIO = 0.8
#: Bytes each kernel moves per byte of its buffer.
TRAFFIC = {"pack_cuda": 2, "unpack_cuda": 2, "reduce_slots_cuda": 3, "adam": 7}


def split_sizes(n: int, parts: int) -> list[int]:
    """``n`` elements in ``parts`` nearly equal sizes (the first ones one larger).

    Example: ``split_sizes(10, 3) == [4, 3, 3]``.
    """
    base, extra = divmod(n, parts)
    return [base + (1 if i < extra else 0) for i in range(parts)]


def build_calls(cp: Any, nbytes: int, stream: Any) -> dict[str, tuple[Any, int]]:
    """``{kernel: (call, bytes moved per call)}`` plus the matching copies, for one size."""
    from numba import cuda

    from hpcdist.kernels import SUM, optim_cuda
    from hpcdist.kernels.cuda import pack_cuda, reduce_slots_cuda, tensor_table, unpack_cuda

    n = nbytes // 4
    ns = cuda.external_stream(stream.ptr)
    with stream:
        flat = cp.random.standard_normal(n, dtype=cp.float32)
        tensors = [cp.empty(k, cp.float32) for k in split_sizes(n, TENSORS)]
        p, g, m = (cp.random.standard_normal(n, dtype=cp.float32) for _ in range(3))
        v = cp.full(n, 1e-3, cp.float32)
        slots = cp.random.standard_normal((2, n), dtype=cp.float32)
        summed = cp.empty(n, cp.float32)
    stream.synchronize()
    view = lambda x: cuda.as_cuda_array(x, sync=False)  # noqa: E731 - one Numba view each
    table = tensor_table([view(t) for t in tensors], stream=ns)
    nflat = view(flat)
    np_, ng, nm, nv = view(p), view(g), view(m), view(v)
    nslots, nsummed = view(slots), view(summed)
    hyper = np.array([1e-6, 0.9, 0.999, 1e-7, 0.0], np.float32)
    calls = {
        "pack_cuda": lambda: pack_cuda(table, nflat, stream=ns),
        "unpack_cuda": lambda: unpack_cuda(nflat, table, stream=ns),
        "reduce_slots_cuda": lambda: reduce_slots_cuda(nslots, 0, n, nsummed, 0, SUM, 1,
                                                       stream=ns),
        "adam": lambda: optim_cuda.adam(np_, np_, ng, nm, nv, None, hyper, stream=ns),
    }
    out: dict[str, tuple[Any, int]] = {}
    copies: dict[int, Any] = {}
    for name, call in calls.items():
        moved = TRAFFIC[name] * nbytes
        out[name] = (call, moved)
        half = moved // 2
        if half not in copies:
            with stream:
                src, dst = cp.empty(half, cp.uint8), cp.empty(half, cp.uint8)
            copies[half] = _copy_call(cp, dst, src, half, stream)
        out[f"copy:{name}"] = (copies[half], moved)
    return out


def _copy_call(cp: Any, dst: Any, src: Any, nbytes: int, stream: Any) -> Any:
    runtime = cp.cuda.runtime
    kind = runtime.memcpyDeviceToDevice

    def call() -> None:
        runtime.memcpyAsync(dst.data.ptr, src.data.ptr, nbytes, kind, stream.ptr)

    call.keep = (dst, src)  # type: ignore[attr-defined]  # the buffers live with the call
    return call


def measure(cp: Any, call: Any, moved: int, stream: Any, args: argparse.Namespace) -> dict:
    """Median GPU seconds per call (back to back), host seconds per call, and GB/s."""
    iters = iterations_for(moved)
    with stream:
        for _ in range(args.warmup):
            call()
    stream.synchronize()
    _, host = event_seconds(cp, stream, call, iters)  # how long the host takes to enqueue
    spin = 2 * host * iters + 5e-3
    samples, hosts = [], []
    for _ in range(args.repeats):
        gpu_s, host_s = event_seconds(cp, stream, call, iters, spin_seconds=spin)
        samples.append(gpu_s)
        hosts.append(host_s)
    stats = summarize(samples)
    return {
        "iters": iters,
        "seconds": stats["median"],
        "seconds_min": stats["min"],
        "seconds_max": stats["max"],
        "gb_per_s": gb_per_s(moved, stats["median"]),
        "host_us_per_call": summarize(hosts)["median"] * 1e6,
    }


def check_results(cp: Any, stream: Any) -> None:
    """Once, before timing: pack, unpack and adam give the right values on this GPU."""
    from numba import cuda

    from hpcdist.kernels import SUM, optim, optim_cuda
    from hpcdist.kernels.cuda import pack_cuda, reduce_slots_cuda, unpack_cuda

    ns = cuda.external_stream(stream.ptr)
    rng = np.random.default_rng(0)
    hosts = [rng.standard_normal(k).astype(np.float32) for k in split_sizes(100_003, TENSORS)]
    with stream:
        tensors = [cp.asarray(h) for h in hosts]
        flat = cp.zeros(100_003, cp.float32)
    pack_cuda(tensors, flat, stream=ns)
    stream.synchronize()
    if not np.array_equal(flat.get(), np.concatenate(hosts)):
        raise SystemExit(f"{PROG}: pack_cuda gave wrong values on this GPU; not timing it")
    with stream:
        flat *= 2
    unpack_cuda(flat, tensors, stream=ns)
    stream.synchronize()
    if not all(np.array_equal(t.get(), 2 * h) for t, h in zip(tensors, hosts, strict=True)):
        raise SystemExit(f"{PROG}: unpack_cuda gave wrong values on this GPU; not timing it")
    rows = rng.standard_normal((2, 100_003)).astype(np.float32)
    with stream:
        slots, summed = cp.asarray(rows), cp.zeros(100_003, cp.float32)
    reduce_slots_cuda(slots, 0, 100_003, summed, 0, SUM, 1, stream=ns)
    stream.synchronize()
    if not np.array_equal(summed.get(), rows[0] + rows[1]):
        raise SystemExit(f"{PROG}: reduce_slots_cuda gave wrong values on this GPU; not timing it")
    p, g, m, v = (rng.standard_normal(1000).astype(np.float32) for _ in range(4))
    v = np.abs(v)
    hyper = np.array([1e-3, 0.9, 0.999, 1e-7, 0.0], np.float32)
    dev = [cp.asarray(a) for a in (p, g, m, v)]
    optim_cuda.adam(dev[0], dev[0], dev[1], dev[2], dev[3], None, hyper)
    optim.adam(p, p, g, m, v, np.empty(0, np.float32), hyper)
    cp.cuda.Device().synchronize()
    if not np.allclose(dev[0].get(), p, rtol=1e-5, atol=1e-6):
        raise SystemExit(f"{PROG}: optim_cuda.adam disagrees with the CPU kernel; not timing it")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=f"python benchmarks/{PROG}.py",
        description=(
            "Bandwidth of pack_cuda, unpack_cuda and optim_cuda.adam against a device copy"
        ),
    )
    parser.add_argument(
        "--sizes-mib",
        type=int,
        nargs="+",
        default=[1, 16, 256],
        help="buffer sizes in MiB of float32 (default: 1 16 256)",
    )
    parser.add_argument("--repeats", type=int, default=15, help="timed repetitions (median)")
    parser.add_argument("--warmup", type=int, default=3, help="untimed calls first")
    parser.add_argument("--device", type=int, default=0, help="the GPU to use")
    parser.add_argument("--out", default=str(RESULTS), help="folder for the JSON and PNG")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.repeats < 1 or args.warmup < 0 or any(s < 1 for s in args.sizes_mib):
        raise SystemExit(f"{PROG}: --repeats >= 1, --warmup >= 0 and sizes >= 1 MiB, please")
    cp = require_gpu(PROG)
    from hpcdist.kernels.optim_cuda import device_context

    rows = []
    with cp.cuda.Device(args.device), device_context(args.device):
        stream = cp.cuda.Stream(non_blocking=True)
        check_results(cp, stream)
        for mib in args.sizes_mib:
            nbytes = mib << 20
            calls = build_calls(cp, nbytes, stream)
            for name in TRAFFIC:
                call, moved = calls[name]
                kernel = measure(cp, call, moved, stream, args)
                copy = measure(cp, calls[f"copy:{name}"][0], moved, stream, args)
                ratio = kernel["gb_per_s"] / copy["gb_per_s"]
                rows.append(
                    {
                        "buffer_bytes": nbytes,
                        "kernel": name,
                        "tensors": {"adam": 4, "reduce_slots_cuda": 2}.get(name, TENSORS),
                        "bytes_moved": moved,
                        **kernel,
                        "copy_seconds": copy["seconds"],
                        "copy_gb_per_s": copy["gb_per_s"],
                        "ratio_to_copy": ratio,
                        "status": ratio_status(ratio, TARGET_RATIO),
                    }
                )
            del calls
            cp.get_default_memory_pool().free_all_blocks()
        info = machine_info(cp, args.device)
    headers = ["MiB", "kernel", "GB/s", "copy GB/s", "ratio", "target", "host us/call"]
    table = [
        [
            r["buffer_bytes"] >> 20,
            r["kernel"],
            f"{r['gb_per_s']:.1f}",
            f"{r['copy_gb_per_s']:.1f}",
            f"{r['ratio_to_copy']:.2f}",
            r["status"],
            f"{r['host_us_per_call']:.1f}",
        ]
        for r in rows
    ]
    print(
        f"{info['gpu']}: float32, median of {args.repeats} repetitions, target ratio >= "
        f"{TARGET_RATIO}"
    )
    print(format_table(headers, table))
    verdict = "PASS" if all(r["status"] == "PASS" for r in rows) else "FAIL"
    report = {
        "benchmark": "CUDA kernel bandwidth vs a device-to-device copy of the same bytes",
        "command": "python benchmarks/gpu_kernels.py " + " ".join(argv or sys.argv[1:]),
        "machine": info,
        "repeats": args.repeats,
        "warmup": args.warmup,
        "bytes_moved_per_buffer_byte": TRAFFIC,
        "target": {"ratio_to_copy_at_least": TARGET_RATIO, "status": verdict},
        "rows": rows,
    }
    path = write_report(PROG, report, args.out)
    _plot(rows, args.out)
    print(f"overall: {verdict}; wrote {path}")
    return 0


def _plot(rows: list[dict], folder: str) -> None:
    from hpcdist.bench.report import save_line_plot

    sizes = sorted({r["buffer_bytes"] for r in rows})
    series = {}
    for name in TRAFFIC:
        series[name] = [r["gb_per_s"] for r in rows if r["kernel"] == name]
        series[f"copy (vs {name})"] = [r["copy_gb_per_s"] for r in rows if r["kernel"] == name]
    save_line_plot(
        PROG,
        sizes,
        series,
        folder=folder,
        xlabel="buffer bytes (float32)",
        ylabel="GB/s (bytes read + written)",
        title="CUDA kernels vs device copy",
    )


if __name__ == "__main__":
    sys.exit(main())
