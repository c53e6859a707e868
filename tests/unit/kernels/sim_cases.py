"""CUDA kernel cases for Numba's CUDA simulator.

Not collected by the normal run: ``test_cuda.py`` runs this file with pytest in
a subprocess whose environment sets ``NUMBA_ENABLE_CUDASIM=1`` before
``numba.cuda`` is imported. Sizes are small: every simulated GPU thread is a
Python thread.
"""

from __future__ import annotations

import functools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from numba import cuda

from hpcdist.kernels import MAX, MEAN, MIN, SUM
from hpcdist.kernels.cuda import (
    pack_cuda,
    reduce_slots_cuda,
    simulator_enabled,
    tensor_table,
    unpack_cuda,
)

DTYPES = ["float16", "float32", "float64", "int8", "uint16", "int32", "uint64"]
_NUMPY_OP = {SUM: np.add, MEAN: np.add, MIN: np.minimum, MAX: np.maximum}


def setup_module() -> None:
    assert simulator_enabled(), "run with NUMBA_ENABLE_CUDASIM=1"


def _values(dtype: np.dtype, size, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    if dtype.kind == "f":
        return (rng.standard_normal(size) * 100).astype(dtype)
    info = np.iinfo(dtype)
    return rng.integers(info.min, info.max, size=size, endpoint=True, dtype=dtype)


def _scaled(x: np.ndarray, factor: float | None) -> np.ndarray:
    if factor is None:
        return x
    work = np.float32 if x.dtype == np.float16 else x.dtype
    return (x.astype(work) * np.dtype(work).type(factor)).astype(x.dtype)


@settings(deadline=None, max_examples=15)
@given(
    dtype=st.sampled_from(DTYPES),
    sizes=st.lists(st.sampled_from([0, 1, 2, 3, 5, 17]), min_size=1, max_size=6),
    factor=st.sampled_from([None, 0.5, 3.0]),
    extra=st.integers(0, 3),
)
def test_pack_then_unpack_many_tensors(dtype, sizes, factor, extra):
    dtype = np.dtype(dtype)
    if dtype.kind != "f":
        factor = None
    hosts = [_values(dtype, n, seed=i) for i, n in enumerate(sizes)]
    devices = [cuda.to_device(h.reshape(-1, 1) if h.size == 3 else h) for h in hosts]
    total = sum(sizes)
    flat = cuda.to_device(np.zeros(total + extra, dtype))
    assert pack_cuda(devices, flat, scale=factor) is flat
    got = flat.copy_to_host()
    expected = np.concatenate([_scaled(h, factor) for h in hosts])
    np.testing.assert_array_equal(got[:total], expected)
    assert not got[total:].any()  # past the tensors: untouched

    table = tensor_table(devices)  # the reusable form of the same bucket
    new_flat = cuda.to_device(_values(dtype, total + extra, seed=99))
    unpack_cuda(new_flat, table, scale=factor)
    source = _scaled(new_flat.copy_to_host()[:total], factor)
    start = 0
    for device, n in zip(devices, sizes, strict=True):
        np.testing.assert_array_equal(device.copy_to_host().reshape(-1), source[start : start + n])
        start += n


@settings(deadline=None, max_examples=20)
@given(
    dtype=st.sampled_from(DTYPES),
    op=st.sampled_from([SUM, MEAN, MIN, MAX]),
    n=st.integers(1, 4),
    m=st.sampled_from([0, 1, 2, 5, 13]),
    step=st.sampled_from([1, 2]),
    data=st.data(),
)
def test_reduce_matches_numpy_fold(dtype, op, n, m, step, data):
    dtype = np.dtype(dtype)
    if op == MEAN and dtype.kind != "f":
        op = SUM
    lo = data.draw(st.integers(0, m))
    hi = data.draw(st.integers(lo, m))
    in_place = data.draw(st.booleans())
    window = _values(dtype, (n, m * step + 3), seed=m + n)
    host_slots = window[:, : m * step : step]
    rows = [host_slots[k, lo:hi].copy() for k in range(n)]
    if dtype == np.float16:
        rows = [r.astype(np.float32) for r in rows]
    with np.errstate(all="ignore"):
        expected = functools.reduce(_NUMPY_OP[op], rows)
        if op == MEAN:
            expected = expected / expected.dtype.type(3)
        expected = expected.astype(dtype)
    device_window = cuda.to_device(window)
    slots = device_window[:, : m * step : step]
    if in_place:
        reduce_slots_cuda(slots, lo, hi, slots[n - 1], lo, op, 3)
        got = device_window.copy_to_host()[:, : m * step : step][n - 1, lo:hi]
    else:
        out = cuda.to_device(np.zeros(hi - lo + 2, dtype))
        reduce_slots_cuda(slots, lo, hi, out, 1, op, 3)
        got = out.copy_to_host()[1 : 1 + hi - lo]
    np.testing.assert_array_equal(got, expected)


def test_float16_reduce_accumulates_in_float32():
    slots = cuda.to_device(np.array([[2048.0], [1.0], [1.0]], np.float16))
    out = cuda.to_device(np.zeros(1, np.float16))
    reduce_slots_cuda(slots, 0, 1, out, 0, SUM, 1)
    assert out.copy_to_host()[0] == 2050.0


def test_host_arrays_and_mixed_buckets_are_rejected():
    a = cuda.to_device(np.ones(4, np.float32))
    b = cuda.to_device(np.ones(4, np.float64))
    flat = cuda.to_device(np.zeros(8, np.float32))
    with pytest.raises(TypeError, match="expected a device array"):
        pack_cuda([np.ones(4, np.float32)], flat)
    with pytest.raises(TypeError, match="tensor 1 is float64 but tensor 0 is float32"):
        pack_cuda([a, b], flat)
    with pytest.raises(ValueError, match="not C-contiguous"):
        pack_cuda([cuda.to_device(np.ones((4, 4), np.float32))[:, ::2]], flat)
    with pytest.raises(ValueError, match="flat has 8 elements but the tensors hold 12"):
        pack_cuda([a, a, a], flat)
    with pytest.raises(TypeError, match="scale=2 needs a float dtype"):
        pack_cuda([cuda.to_device(np.ones(2, np.int32))], cuda.to_device(np.zeros(2, np.int32)), 2)
    with pytest.raises(ValueError, match="no tensors"):
        tensor_table([])
    with pytest.raises(ValueError, match="lo=0, hi=5"):
        reduce_slots_cuda(cuda.to_device(np.ones((2, 4), np.float32)), 0, 5, flat, 0, SUM, 1)
    with pytest.raises(ValueError, match="MEAN with divisor 2 on int32"):
        ints = cuda.to_device(np.ones((2, 4), np.int32))
        reduce_slots_cuda(ints, 0, 4, cuda.to_device(np.zeros(4, np.int32)), 0, MEAN, 2)


def test_pack_builds_a_bucket_table_once_per_layout(monkeypatch):
    # A table per call meant a host-to-device copy and a Numba allocation on every pack.
    from hpcdist.kernels import cuda as kernels

    uploads = []
    real = kernels._upload
    monkeypatch.setattr(kernels, "_upload", lambda *a: uploads.append(a) or real(*a))
    monkeypatch.setattr(kernels, "_TABLES", kernels.OrderedDict())
    tensors = [cuda.to_device(np.arange(n, dtype=np.float32)) for n in (3, 5)]
    flat = cuda.to_device(np.zeros(8, np.float32))
    for _ in range(3):
        pack_cuda(tensors, flat)
        unpack_cuda(flat, tensors, scale=2.0)
    assert len(uploads) == 2  # addrs and offsets, once
    assert kernels.cached_table(tensors) is kernels.cached_table(tensors)
    assert kernels.cached_table(tensors).tensors == ()  # the cache keeps no tensor alive
    np.testing.assert_array_equal(tensors[1].copy_to_host(), np.arange(5) * 8)
    other = [tensors[1], tensors[0]]  # another layout: its own table
    pack_cuda(other, flat)
    np.testing.assert_array_equal(flat.copy_to_host(), [0, 8, 16, 24, 32, 0, 8, 16])
    assert len(uploads) == 4
    monkeypatch.setattr(kernels, "TABLE_CACHE_SIZE", 1)
    pack_cuda(tensors[:1], flat)  # a third layout evicts the least recently used
    assert len(kernels._TABLES) == 1
