"""A CUDA kernel that keeps a stream busy: for tests and benchmarks of stream order.

Work enqueued after :func:`spin` on the same stream starts only when the spin
ends, so a caller can check that a call returned while its work was still
queued, or time host overhead separately from GPU time. Needs CuPy and a GPU.

Example (needs a GPU)::

    spin(cupy, stream, 0.5)        # the stream is busy for half a second
    engine.allreduce([x], "SUM")   # returns at once; the stream is not done yet
"""

from __future__ import annotations

from typing import Any

SPIN_SOURCE = r"""
extern "C" __global__ void hpcdist_spin(unsigned long long ns) {
    unsigned long long start, now;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
    do {
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
    } while (now - start < ns);
}
"""

_KERNELS: dict[int, Any] = {}


def spin_kernel(cp: Any) -> Any:
    """The compiled spin kernel for CuPy's current GPU (compiled once per GPU)."""
    device = cp.cuda.Device().id
    kernel = _KERNELS.get(device)
    if kernel is None:
        kernel = _KERNELS[device] = cp.RawKernel(SPIN_SOURCE, "hpcdist_spin")
    return kernel


def spin(cp: Any, stream: Any, seconds: float) -> None:
    """Enqueue on ``stream`` a one-thread kernel that busy-waits ``seconds`` on the GPU."""
    with stream:
        spin_kernel(cp)((1,), (1,), (cp.uint64(int(seconds * 1e9)),))
