"""gather_bytes / scatter_bytes: the fusion pack and unpack over raw addresses."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hpcdist.kernels import gather_bytes, scatter_bytes


def _table(arrays: list[np.ndarray], gap: int = 0) -> tuple[np.ndarray, ...]:
    addrs = np.array([a.__array_interface__["data"][0] for a in arrays], np.int64)
    nbytes = np.array([a.nbytes for a in arrays], np.int64)
    offsets = np.zeros(len(arrays), np.int64)
    if len(arrays) > 1:
        offsets[1:] = np.cumsum(nbytes[:-1] + gap)
    return addrs, nbytes, offsets


def _arrays(sizes: list[int], dtypes: list[str], seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.integers(0, 100, size=n).astype(dt) for n, dt in zip(sizes, dtypes, strict=True)]


@settings(deadline=None, max_examples=60)
@given(
    sizes=st.lists(st.sampled_from([0, 0, 1, 2, 3, 7, 31, 257, 4099]), min_size=0, max_size=40),
    data=st.data(),
    gap=st.sampled_from([0, 0, 5]),
)
def test_gather_then_scatter_round_trips_many_tensors(sizes, data, gap):
    dtypes = data.draw(
        st.lists(
            st.sampled_from(["uint8", "int16", "float32", "float64", "complex128"]),
            min_size=len(sizes),
            max_size=len(sizes),
        )
    )
    arrays = _arrays(sizes, dtypes, seed=len(sizes))
    addrs, nbytes, offsets = _table(arrays, gap)
    total = int(offsets[-1] + nbytes[-1]) if arrays else 0
    flat = np.full(total + 3, 0xEE, np.uint8)
    gather_bytes(flat, addrs, nbytes, offsets)
    for a, off in zip(arrays, offsets, strict=True):
        assert flat[off : off + a.nbytes].tobytes() == a.tobytes()
    if gap:  # bytes between tensors are untouched
        for a, off in zip(arrays[:-1], offsets[:-1], strict=True):
            assert (flat[off + a.nbytes : off + a.nbytes + gap] == 0xEE).all()
    assert (flat[total:] == 0xEE).all()

    backs = [np.zeros_like(a) for a in arrays]
    back_addrs, _, _ = _table(backs)
    scatter_bytes(flat, back_addrs, nbytes, offsets)
    for a, b in zip(arrays, backs, strict=True):
        np.testing.assert_array_equal(a, b)


def test_gather_into_the_middle_of_a_buffer_and_empty_table():
    a = np.arange(5, dtype=np.int32)
    flat = np.zeros(64, np.uint8)
    addrs, nbytes, _ = _table([a])
    gather_bytes(flat, addrs, nbytes, np.array([40], np.int64))
    assert flat[40:60].view(np.int32).tolist() == [0, 1, 2, 3, 4]
    assert not flat[:40].any() and not flat[60:].any()
    empty = np.zeros(0, np.int64)
    gather_bytes(flat, empty, empty, empty)  # nothing to copy is fine
    scatter_bytes(flat, empty, empty, empty)


def test_out_of_range_entry_raises_and_copies_nothing():
    a, b = np.ones(4, np.uint8), np.ones(4, np.uint8)
    addrs, nbytes, _ = _table([a, b])
    flat = np.zeros(6, np.uint8)
    with pytest.raises(ValueError, match=r"tensor 1 spans bytes \[4, 8\) of a flat buffer of 6"):
        gather_bytes(flat, addrs, nbytes, np.array([0, 4], np.int64))
    assert not flat.any()  # checked before the first copy
    with pytest.raises(ValueError, match="tensor 0 spans"):
        scatter_bytes(flat, addrs, nbytes, np.array([-1, 0], np.int64))
    with pytest.raises(ValueError, match="tensor 0 spans"):
        gather_bytes(flat, addrs, np.array([-1, 1], np.int64), np.array([0, 1], np.int64))


def test_bad_tables_and_buffers_raise_type_errors():
    a = np.ones(4, np.uint8)
    addrs, nbytes, offsets = _table([a])
    with pytest.raises(ValueError, match="1, 1 and 2 entries"):
        gather_bytes(np.zeros(8, np.uint8), addrs, nbytes, np.zeros(2, np.int64))
    with pytest.raises(TypeError, match="contiguous 1-D uint8"):
        gather_bytes(np.zeros(8, np.float32), addrs, nbytes, offsets)
    with pytest.raises(TypeError, match="contiguous 1-D uint8"):
        gather_bytes(np.zeros(16, np.uint8)[::2], addrs, nbytes, offsets)
    with pytest.raises(TypeError, match="offsets must be a 1-D integer NumPy array"):
        scatter_bytes(np.zeros(8, np.uint8), addrs, nbytes, [0])
