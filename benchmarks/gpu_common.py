"""What the GPU benchmarks share: the GPU check, statistics, timing with CUDA events, reports.

The pure helpers (:func:`summarize`, :func:`gb_per_s`, :func:`ratio_status`,
:func:`overhead_percent`, :func:`iterations_for`, :func:`format_table`,
:func:`write_report`) need neither CuPy nor a GPU and are unit-tested on any
machine. :func:`require_gpu` ends a benchmark with exit code 2 and a message
saying why when no GPU is usable, before anything is measured or written.

Timing (:func:`event_seconds`): one repetition records a CUDA event, enqueues
``iters`` calls on the stream, records a second event and waits for it; the
GPU time between the events divided by ``iters`` is the time per call. With
``spin_seconds`` a one-thread kernel first keeps the stream busy while the
host enqueues the calls, so the calls run back to back on the GPU and the
figure is the device's own time, not the host's launch rate.

Example:
    >>> summarize([3.0, 1.0, 2.0])["median"]
    2.0
    >>> round(gb_per_s(2_000_000_000, 0.5), 3)
    4.0
"""

from __future__ import annotations

import json
import math
import os
import pathlib
import platform
import socket
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from hpcdist.bench.gpu_spin import spin_kernel
from hpcdist.bench.report import save_report

#: Where the results go by default: ``benchmarks/results``.
RESULTS = pathlib.Path(__file__).resolve().parent / "results"
#: The exit code of a benchmark that cannot run here (no usable GPU, no NCCL).
EXIT_NO_GPU = 2


__all__ = [
    "EXIT_NO_GPU",
    "RESULTS",
    "event_seconds",
    "format_table",
    "gb_per_s",
    "gpu_problem",
    "iterations_for",
    "machine_info",
    "overhead_percent",
    "ratio_status",
    "refuse",
    "require_gpu",
    "summarize",
    "write_report",
]


# ----------------------------------------------------------------------- pure helpers


def summarize(samples: Sequence[float]) -> dict[str, float]:
    """``n``, ``median``, ``min``, ``max``, ``mean`` and ``stdev`` (0 for one sample).

    Example: ``summarize([1.0, 3.0])["mean"] == 2.0``.
    """
    values = [float(v) for v in samples]
    if not values:
        raise ValueError("summarize: no samples; expected at least one timing")
    if any(not math.isfinite(v) for v in values):
        raise ValueError(f"summarize: samples must be finite numbers; got {values}")
    return {
        "n": len(values),
        "median": statistics.median(values),
        "min": min(values),
        "max": max(values),
        "mean": statistics.fmean(values),
        "stdev": statistics.stdev(values) if len(values) > 1 else 0.0,
    }


def gb_per_s(nbytes: float, seconds: float) -> float:
    """Bandwidth in GB/s (1e9 bytes per second).

    Example: ``gb_per_s(1e9, 0.25) == 4.0``.
    """
    if not seconds > 0:
        raise ValueError(f"gb_per_s: seconds is {seconds!r}; expected a positive time")
    return float(nbytes) / float(seconds) / 1e9


def ratio_status(ratio: float, target: float) -> str:
    """``"PASS"`` when ``ratio >= target``, else ``"FAIL"``.

    Example: ``ratio_status(0.85, 0.8) == "PASS"``.
    """
    return "PASS" if ratio >= target else "FAIL"


def overhead_percent(ours: float, baseline: float) -> float:
    """How much longer ``ours`` takes than ``baseline``, in percent (negative: faster).

    Example: ``overhead_percent(1.1, 1.0)`` is about ``10.0``.
    """
    if not baseline > 0:
        raise ValueError(f"overhead_percent: baseline is {baseline!r}; expected a positive time")
    return (float(ours) / float(baseline) - 1.0) * 100.0


def iterations_for(bytes_per_call: int, budget: int = 1 << 30, lo: int = 3, hi: int = 200) -> int:
    """Calls per timed repetition: about ``budget`` bytes moved, between ``lo`` and ``hi``.

    Example: ``iterations_for(256 << 20) == 4`` and ``iterations_for(4096) == 200``.
    """
    if bytes_per_call <= 0:
        raise ValueError(f"iterations_for: bytes_per_call is {bytes_per_call}; expected > 0")
    return max(lo, min(hi, budget // bytes_per_call))


def format_table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A plain text table, columns right-aligned to their widest cell.

    Example: ``format_table(["a", "b"], [[1, "xy"]])`` has a header line, a rule and one row.
    """
    cells = [[str(h) for h in headers]] + [[str(c) for c in row] for row in rows]
    for i, row in enumerate(cells):
        if len(row) != len(headers):
            raise ValueError(
                f"format_table: row {i - 1} has {len(row)} cells; expected {len(headers)}"
            )
    widths = [max(len(row[k]) for row in cells) for k in range(len(headers))]
    lines = ["  ".join(c.rjust(w) for c, w in zip(row, widths, strict=True)) for row in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def write_report(name: str, report: dict[str, Any], folder: str | os.PathLike | None = None):
    """Write ``report`` to ``<folder>/<name>.json`` (default ``benchmarks/results``).

    Refuses (``TypeError``) a report that is not plain JSON, before writing anything.
    Example: ``write_report("gpu_kernels", {"rows": rows})``.
    """
    try:
        json.dumps(report, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise TypeError(
            f"write_report: the {name} report is not plain JSON ({exc}); convert NumPy "
            "values with float()/int() and leave out NaN"
        ) from exc
    return save_report(name, report, RESULTS if folder is None else folder)


# ------------------------------------------------------------------------- the GPU check


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0][:200] if text else ''}"


def gpu_problem() -> str | None:
    """Why no GPU is usable here (``None``: CuPy imports, sees a GPU and runs a kernel).

    Example: ``gpu_problem()`` is ``"CuPy is not installed (...)"`` on a CPU-only machine.
    """
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    shown = "unset" if visible is None else repr(visible)
    try:
        import cupy
    except ImportError as exc:
        return (f"CuPy is not installed ({exc}); install cupy-cuda13x (cupy-cuda12x for CUDA 12 "
                "drivers)")
    except Exception as exc:  # noqa: BLE001 - a broken install is a reason too
        return f"CuPy fails to import ({_first_line(exc)})"
    try:
        count = int(cupy.cuda.runtime.getDeviceCount())
    except Exception as exc:  # noqa: BLE001 - no driver or no device
        return f"cudaGetDeviceCount() failed ({_first_line(exc)}; CUDA_VISIBLE_DEVICES={shown})"
    if count <= 0:
        return f"cudaGetDeviceCount() == 0 (CUDA_VISIBLE_DEVICES={shown})"
    try:
        with cupy.cuda.Device(0):
            total = float((cupy.arange(8, dtype=cupy.float32) * 2).sum())
    except Exception as exc:  # noqa: BLE001
        return f"a tiny CuPy kernel failed on GPU 0 ({_first_line(exc)})"
    if total != 56.0:
        return f"a tiny CuPy kernel on GPU 0 returned {total}, expected 56.0"
    return None


def refuse(prog: str, reason: str) -> None:
    """Print ``"<prog>: cannot run: <reason>"`` to stderr and exit with :data:`EXIT_NO_GPU`.

    Example: ``refuse("gpu_nccl", "NCCL is not available")``.
    """
    print(f"{prog}: cannot run: {reason}. Nothing was measured or written.", file=sys.stderr)
    raise SystemExit(EXIT_NO_GPU)


def require_gpu(prog: str) -> Any:
    """The CuPy module, or exit 2 with ``"<prog>: cannot run: no usable GPU: <why>"``.

    Example: ``cp = require_gpu("gpu_kernels")`` at the start of ``main``.
    """
    problem = gpu_problem()
    if problem is not None:
        refuse(prog, f"no usable GPU: {problem}")
    import cupy

    return cupy


# ---------------------------------------------------------------------- GPU-side helpers


def machine_info(cp: Any = None, device: int = 0) -> dict[str, Any]:
    """The host, Python, NumPy and (with ``cp``) GPU, CUDA, CuPy, Numba and NCCL versions.

    Example: ``machine_info()["python"]`` is the Python version; GPU fields need ``cp``.
    """
    info: dict[str, Any] = {
        "host": socket.gethostname(),
        "platform": platform.platform(),
        "processor": platform.processor(),
        "python": platform.python_version(),
        "numpy": np.__version__,
    }
    if cp is None:
        return info
    props = cp.cuda.runtime.getDeviceProperties(device)
    name = props.get("name", b"?")
    info.update(
        gpu=name.decode(errors="replace") if isinstance(name, bytes) else str(name),
        gpu_index=device,
        gpu_count=int(cp.cuda.runtime.getDeviceCount()),
        gpu_memory_bytes=int(props.get("totalGlobalMem", 0)),
        compute_capability=f"{props.get('major', '?')}.{props.get('minor', '?')}",
        cuda_runtime=int(cp.cuda.runtime.runtimeGetVersion()),
        cuda_driver=int(cp.cuda.runtime.driverGetVersion()),
        cupy=cp.__version__,
        cuda_visible_devices=os.environ.get("CUDA_VISIBLE_DEVICES"),
    )
    try:
        import numba

        info["numba"] = numba.__version__
    except ImportError:
        info["numba"] = None
    try:
        from hpcdist.collectives.nccl import nccl_available

        ok, text = nccl_available()
        info["nccl"] = text if ok else f"unavailable: {text}"
    except ImportError as exc:
        info["nccl"] = f"unavailable: {exc}"
    return info


def event_seconds(
    cp: Any, stream: Any, call: Callable[[], Any], iters: int, spin_seconds: float = 0.0
) -> tuple[float, float]:
    """``(GPU seconds per call, host seconds per call)`` of ``iters`` calls on ``stream``.

    ``call`` must enqueue its work on ``stream`` (it runs with ``stream`` current).
    With ``spin_seconds > 0`` the stream is kept busy that long first (see the module
    docstring); pick more than the host needs to enqueue the calls.

    Example: ``gpu_s, host_s = event_seconds(cp, s, lambda: x.copy(), iters=50)``.
    """
    start = cp.cuda.Event()
    end = cp.cuda.Event()
    with stream:
        if spin_seconds > 0:
            spin_kernel(cp)((1,), (1,), (np.uint64(int(spin_seconds * 1e9)),))
        start.record(stream)
        t0 = time.perf_counter()
        for _ in range(iters):
            call()
        host = time.perf_counter() - t0
        end.record(stream)
    end.synchronize()
    return cp.cuda.get_elapsed_time(start, end) / 1e3 / iters, host / iters
