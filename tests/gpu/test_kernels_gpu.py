"""The CUDA kernels on a real GPU: the simulator's cases, then CuPy arrays, big sizes, streams.

The first group is the case tables of ``tests/unit/kernels/sim_cases.py`` and
``optim_sim_cases.py`` imported as they are (they use Numba device arrays,
which work on the real device as well as under the simulator). The second
group runs the kernels on CuPy arrays (through ``__cuda_array_interface__``)
large enough that the grid-stride loops wrap (more elements than the
4096 x 256 threads of a launch), on a non-default stream, and compares with
NumPy and with the CPU kernels of :mod:`hpcdist.kernels.optim`.
"""

from __future__ import annotations

import functools

import numpy as np
import pytest
from numba import cuda

from hpcdist.kernels import MAX, MEAN, MIN, SUM
from hpcdist.kernels import optim as cpu_optim
from hpcdist.kernels import optim_cuda as gpu_optim
from hpcdist.kernels.cuda import pack_cuda, reduce_slots_cuda, tensor_table, unpack_cuda
from tests.unit.kernels.optim_sim_cases import (  # noqa: F401 - collected here, on the GPU
    test_adagrad,
    test_adam,
    test_clipping_helpers,
    test_errors,
    test_nadam,
    test_rmsprop,
    test_sgd_and_momentum,
)
from tests.unit.kernels.sim_cases import (  # noqa: F401 - collected here, on the GPU
    _NUMPY_OP,
    _scaled,
    _values,
    test_float16_reduce_accumulates_in_float32,
    test_host_arrays_and_mixed_buckets_are_rejected,
    test_pack_then_unpack_many_tensors,
    test_reduce_matches_numpy_fold,
)

#: More elements than one launch has threads (4096 blocks x 256): the grid-stride loop wraps.
BIG = 1_300_003


def _stream(cp):
    """A new non-blocking CuPy stream and the Numba handle of the same stream."""
    s = cp.cuda.Stream(non_blocking=True)
    return s, cuda.external_stream(s.ptr)


def _tensor_sizes(seed: int) -> list[int]:
    """64 tensor sizes: small, empty, odd, and one big enough to wrap the grid."""
    rng = np.random.default_rng(seed)
    sizes = [int(n) for n in rng.integers(0, 5000, size=62)]
    return [*sizes[:10], 0, BIG, *sizes[10:]]


@pytest.mark.parametrize(
    ("dtype", "factor"),
    [("float32", None), ("float32", 0.25), ("float16", 3.0), ("float64", 0.5), ("int32", None),
     ("uint8", None)],
)  # fmt: skip
def test_pack_and_unpack_cupy_tensors_on_a_stream(cp, spin, dtype, factor):
    dtype = np.dtype(dtype)
    sizes = _tensor_sizes(seed=len(dtype.name))
    hosts = [_values(dtype, n, seed=i) for i, n in enumerate(sizes)]
    shapes = [(n // 7, 7) if n % 7 == 0 and n else (n,) for n in sizes]
    s, ns = _stream(cp)
    total = sum(sizes)
    spin(s, 0.05)  # the stream is busy: everything below must wait for it, in order
    with s:
        tensors = [cp.asarray(h.reshape(shape)) for h, shape in zip(hosts, shapes, strict=True)]
        flat = cp.zeros(total + 5, dtype)
    assert pack_cuda(tensors, flat, scale=factor, stream=ns) is flat
    s.synchronize()
    got = flat.get()
    np.testing.assert_array_equal(got[:total], np.concatenate([_scaled(h, factor) for h in hosts]))
    assert not got[total:].any()  # past the tensors: untouched

    table = tensor_table(tensors, stream=ns)  # the reusable form of the same bucket
    source = _values(dtype, total + 5, seed=99)
    with s:
        new_flat = cp.asarray(source)
    unpack_cuda(new_flat, table, scale=factor, stream=ns)
    s.synchronize()
    expected = _scaled(source[:total], factor)
    start = 0
    for t, n, shape in zip(tensors, sizes, shapes, strict=True):
        assert t.shape == shape
        np.testing.assert_array_equal(t.get().reshape(-1), expected[start : start + n])
        start += n


@pytest.mark.parametrize("dtype", ["float16", "float32", "float64", "int8", "int32", "int64",
                                   "uint64"])  # fmt: skip
@pytest.mark.parametrize("op", [SUM, MEAN, MIN, MAX])
@pytest.mark.parametrize("in_place", [False, True])
def test_reduce_slots_on_strided_cupy_rows(cp, dtype, op, in_place):
    dtype = np.dtype(dtype)
    if op == MEAN and dtype.kind != "f":
        pytest.skip("MEAN is defined for float dtypes only (the kernel refuses integers)")
    rows, m, step = 4, BIG, 2
    window = _values(dtype, (rows, m * step + 3), seed=int(op) + 7 * len(dtype.name))
    if dtype.kind == "f":
        window[1, 10:40:2] = np.nan  # NaN wins in MIN and MAX, as in NumPy
        window[0, 100] = np.inf
    lo, hi = 3, m - 11
    host_rows = [window[k, : m * step : step][lo:hi] for k in range(rows)]
    if dtype == np.float16:
        host_rows = [r.astype(np.float32) for r in host_rows]
    with np.errstate(all="ignore"):
        expected = functools.reduce(_NUMPY_OP[op], host_rows)
        if op == MEAN:
            expected = expected / expected.dtype.type(3)
        expected = expected.astype(dtype)
    s, ns = _stream(cp)
    with s:
        device_window = cp.asarray(window)
        slots = device_window[:, : m * step : step]
        if in_place:
            reduce_slots_cuda(slots, lo, hi, slots[rows - 1], lo, op, 3, stream=ns)
        else:
            out = cp.zeros(hi - lo + 2, dtype)
            reduce_slots_cuda(slots, lo, hi, out, 1, op, 3, stream=ns)
    s.synchronize()
    if in_place:
        got = device_window.get()[rows - 1, : m * step : step][lo:hi]
    else:
        whole = out.get()
        got = whole[1:-1]
        assert whole[0] == 0 and whole[-1] == 0  # outside [out_lo, out_lo + count): untouched
    np.testing.assert_array_equal(got, expected)


def _optim_case(name: str, dtype: np.dtype, variant: bool):
    """``(cpu_call, gpu_call, host arrays)`` of one update over BIG elements."""
    rng = np.random.default_rng(len(name))
    p, g, s1 = (rng.standard_normal(BIG).astype(dtype) for _ in range(3))
    s2 = (rng.random(BIG) + 0.5).astype(dtype)
    s3 = (rng.random(BIG) + 0.25).astype(dtype)
    empty = np.empty(0, dtype)
    if name == "sgd":
        h = np.array([0.1, 0.01 if variant else 0.0], dtype)
        return (lambda a, b, g: cpu_optim.sgd(a, b, g, h),
                lambda a, b, g, st: gpu_optim.sgd(a, b, g, h, stream=st), [p, g])  # fmt: skip
    if name == "momentum":
        h = np.array([0.1, 0.9, 0.01], dtype)
        return (lambda a, b, g, v: cpu_optim.momentum(a, b, g, v, h, variant),
                lambda a, b, g, v, st: gpu_optim.momentum(a, b, g, v, h, variant, stream=st),
                [p, g, s1])  # fmt: skip
    if name == "adam":
        h = np.array([0.01, 0.9, 0.999, 1e-7, 0.001], dtype)
        vhat = s3 if variant else empty
        return (lambda a, b, *st: cpu_optim.adam(a, b, *st, h),
                lambda a, b, g, m, v, vh, st: gpu_optim.adam(a, b, g, m, v, vh, h, stream=st),
                [p, g, s1, s2 * dtype.type(0.5), vhat])  # fmt: skip
    if name == "adagrad":
        h = np.array([0.05, 1e-7, 0.01 if variant else 0.0], dtype)
        return (lambda a, b, g, acc: cpu_optim.adagrad(a, b, g, acc, h),
                lambda a, b, g, acc, st: gpu_optim.adagrad(a, b, g, acc, h, stream=st),
                [p, g, s2])  # fmt: skip
    if name == "nadam":
        h = np.array([0.01, 0.9, 0.999, 1e-7, 0.6, 1.1, 1.3, 0.001 if variant else 0.0], dtype)
        return (lambda a, b, *st: cpu_optim.nadam(a, b, *st, h),
                lambda a, b, g, m, v, st: gpu_optim.nadam(a, b, g, m, v, h, stream=st),
                [p, g, s1, s2])  # fmt: skip
    h = np.array([0.01, 0.9, 0.8 if variant else 0.0, 1e-7, 0.01], dtype)
    avg = s2 * dtype.type(0.1) if variant else empty
    mom = s1 if variant else empty
    return (lambda a, b, *st: cpu_optim.rmsprop(a, b, *st, h),
            lambda a, b, g, v, av, mo, st: gpu_optim.rmsprop(a, b, g, v, av, mo, h, stream=st),
            [p, g, s3, avg, mom])  # fmt: skip


@pytest.mark.parametrize("name", ["sgd", "momentum", "adam", "rmsprop", "adagrad", "nadam"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("variant", [False, True], ids=["plain", "variant"])
@pytest.mark.parametrize("in_place", [True, False], ids=["in_place", "out_of_place"])
def test_optimizer_kernels_on_cupy_match_the_cpu_kernels(cp, name, dtype, variant, in_place):
    """``variant``: weight decay (sgd, adagrad, nadam), nesterov, amsgrad, centered RMSprop
    with momentum."""
    dtype = np.dtype(dtype)
    cpu_call, gpu_call, hosts = _optim_case(name, dtype, variant)
    cpu_arrays = [h.copy() for h in hosts]
    s, ns = _stream(cp)
    with s:
        dev = [cp.asarray(h) for h in hosts]
        out = dev[0] if in_place else cp.full(BIG, np.nan, dtype)
    gpu_call(dev[0], out, *dev[1:], ns)
    cpu_out = cpu_arrays[0] if in_place else np.full(BIG, np.nan, dtype)
    cpu_call(cpu_arrays[0], cpu_out, *cpu_arrays[1:])
    s.synchronize()
    # The GPU may fuse a multiply and an add (one rounding less): a few ulps apart.
    tol = {"rtol": 1e-5, "atol": 1e-6} if dtype == np.float32 else {"rtol": 1e-12, "atol": 1e-13}
    np.testing.assert_allclose(out.get(), cpu_out, **tol)
    if not in_place:
        np.testing.assert_array_equal(dev[0].get(), hosts[0])  # p_in untouched
    for c, d in zip(cpu_arrays[2:], dev[2:], strict=True):  # the state arrays
        if c.size:
            np.testing.assert_allclose(d.get(), c, **tol)


def test_optimizer_kernel_waits_for_earlier_work_on_its_stream(cp, spin):
    s, ns = _stream(cp)
    spin(s, 0.05)
    with s:
        p = cp.ones(BIG, cp.float32)
        g = cp.full(BIG, 2.0, cp.float32)  # written on s after the spin
    gpu_optim.sgd(p, p, g, [0.5, 0.0], stream=ns)
    s.synchronize()
    np.testing.assert_array_equal(p.get(), np.zeros(BIG, np.float32))


def test_clipping_helpers_on_cupy(cp):
    g_host = (np.random.default_rng(3).standard_normal(BIG) * 3).astype(np.float32)
    g = cp.asarray(g_host)
    expected = float(np.sum(g_host.astype(np.float64) ** 2))
    assert gpu_optim.sum_squares(g) == pytest.approx(expected, rel=1e-9)
    gpu_optim.clip_values(g, 1.5)
    gpu_optim.scale(g, 0.5)
    cp.cuda.Device().synchronize()
    np.testing.assert_array_equal(g.get(), np.clip(g_host, -1.5, 1.5) * np.float32(0.5))


def test_kernels_run_on_the_second_gpu(cp, gpus):
    if gpus < 2:
        pytest.skip(f"needs 2 GPUs, this process sees {gpus}")
    with cp.cuda.Device(1), gpu_optim.device_context(1):
        a, b = cp.arange(1000, dtype=cp.float32), cp.ones(24, cp.float32)
        flat = cp.zeros(1024, cp.float32)
        pack_cuda([a, b], flat, scale=2.0)
        cp.cuda.Device(1).synchronize()
        assert flat.device.id == 1
        np.testing.assert_array_equal(
            flat.get(), np.concatenate([np.arange(1000) * 2.0, np.full(24, 2.0)])
        )


def test_pack_of_cupy_tensors_builds_its_table_once_in_cupys_pool(cp, monkeypatch):
    from hpcdist.kernels import cuda as kernels

    monkeypatch.setattr(kernels, "_TABLES", kernels.OrderedDict())
    pool = cp.get_default_memory_pool()
    tensors = [cp.arange(n, dtype=cp.float32) for n in (3, 5)]
    flat = cp.zeros(8, cp.float32)
    before = pool.used_bytes()
    pack_cuda(tensors, flat)
    used = pool.used_bytes()
    assert used > before  # the table's two arrays came from CuPy's pool
    table = kernels.cached_table(tensors)
    for _ in range(5):
        pack_cuda(tensors, flat)
        unpack_cuda(flat, tensors)
    assert kernels.cached_table(tensors) is table and len(kernels._TABLES) == 1
    assert pool.used_bytes() == used  # nothing allocated per call
    cp.cuda.get_current_stream().synchronize()
    np.testing.assert_array_equal(flat.get(), [0, 1, 2, 0, 1, 2, 3, 4])


@pytest.mark.parametrize("dtype", ["int64", "uint64"])
def test_integer_reductions_keep_every_bit(cp, dtype):
    # through float64 (the old MEAN branch's type unification) these lost bits above 2**53
    info = np.iinfo(dtype)
    rows = np.array([[2**61 + 1, 2**53 + 1, info.max - 7], [2**61 + 3, 2**53 + 3, 5]],
                    dtype=dtype)
    slots = cp.asarray(rows)
    for op, want in [(SUM, rows[0] + rows[1]), (MAX, rows.max(axis=0)), (MIN, rows.min(axis=0))]:
        out = cp.zeros(3, dtype)
        reduce_slots_cuda(slots, 0, 3, out, 0, op, 1)
        np.testing.assert_array_equal(out.get(), want, err_msg=str(op))
