"""bfloat16 kernels and the compression options, one process.

The conversions are checked bit for bit against ml_dtypes (the reference
bfloat16 implementation) on every special value and random bit patterns;
the folds against float32 arithmetic in NumPy.
"""

from __future__ import annotations

import numpy as np
import pytest

from hpcdist.arrays import BFLOAT16, is_floating
from hpcdist.collectives import Collectives, CommunicationOptions
from hpcdist.collectives.mpi_backend import WAITALL, Call, drive
from hpcdist.collectives.ops import reduce_arrays
from hpcdist.collectives.wire16 import chunk_bounds, segment_bounds
from hpcdist.errors import CollectiveTimeoutError
from hpcdist.kernels import reduce_slots, scale
from hpcdist.kernels.fold16 import MAX, MEAN, MIN, SUM, fold_rows16, narrow, widen
from hpcdist.runtime import mpi

SPECIAL = np.array(
    [0x00000000, 0x80000000, 0x7F800000, 0xFF800000, 0x7FC00000, 0xFFC00001, 0x7F800001,
     0x7F7FFFFF, 0x00000001, 0x00008000, 0x00018000, 0x3F808000, 0x3F818000, 0x3F807FFF,
     0x807FFFFF, 0x7F7F8000],
    np.uint32,
)


def _patterns() -> np.ndarray:
    rng = np.random.default_rng(0)
    return np.concatenate([SPECIAL, rng.integers(0, 2**32, 100_000, np.uint64).astype(np.uint32)])


def test_narrow_matches_ml_dtypes_bit_for_bit() -> None:
    x = _patterns().view(np.float32)
    with np.errstate(invalid="ignore"):
        expected = x.astype(BFLOAT16).view(np.uint16)
    got = narrow(x, np.empty(x.shape, BFLOAT16)).view(np.uint16)
    np.testing.assert_array_equal(got, expected)


def test_widen_is_exact() -> None:
    bits = np.arange(2**16, dtype=np.uint16)
    got = widen(bits.view(BFLOAT16), np.empty(bits.shape, np.float32))
    np.testing.assert_array_equal(got.view(np.uint32), bits.astype(np.uint32) << 16)


@pytest.mark.parametrize("dtype", [BFLOAT16, np.dtype(np.float16)], ids=str)
@pytest.mark.parametrize("divisor", [2, 3, 7])
def test_widen_divided_is_widen_then_numpy_divide(dtype, divisor) -> None:
    # every 16-bit pattern (NaNs, infinities, subnormals) widened and divided in one pass
    half = np.arange(2**16, dtype=np.uint16).view(dtype)
    expected = widen(half, np.empty(half.shape, np.float32))
    with np.errstate(invalid="ignore"):
        np.divide(expected, np.float32(divisor), out=expected)
    got = widen(half, np.empty(half.shape, np.float32), divisor)
    np.testing.assert_array_equal(got.view(np.uint32), expected.view(np.uint32))


@pytest.mark.parametrize("dtype", [BFLOAT16, np.dtype(np.float16)], ids=str)
@pytest.mark.parametrize("op", [SUM, MEAN, MIN, MAX])
def test_fold_accumulates_in_float32_and_rounds_once(dtype, op) -> None:
    rng = np.random.default_rng(op)
    rows = rng.standard_normal((5, 3001)).astype(np.float32).astype(dtype)
    rows[1, 7] = np.nan
    out = np.empty(3001, dtype)
    fold_rows16(rows, out, op, 5)
    wide = rows.astype(np.float32)
    if op in (SUM, MEAN):
        acc = wide[0].copy()
        for r in wide[1:]:
            acc = acc + r
        expected = acc / np.float32(5) if op == MEAN else acc
    else:
        expected = (np.minimum if op == MIN else np.maximum).reduce(wide)
    with np.errstate(invalid="ignore"):
        np.testing.assert_array_equal(out.view(np.uint16), expected.astype(dtype).view(np.uint16))


def test_reduce_slots_and_scale_take_bfloat16() -> None:
    slots = np.array([[1.0, 2.0, 3.0], [256.0, 2.0**-8, 1.0]], np.float32).astype(BFLOAT16)
    out = np.empty(3, BFLOAT16)
    reduce_slots(slots, 0, 3, out, 0, SUM, 1)
    np.testing.assert_array_equal(out.astype(np.float32), [256.0, 2.0, 4.0])  # 257 -> 256
    reduce_slots(slots, 0, 3, slots[0], 0, MEAN, 2)  # in place, into a row
    np.testing.assert_array_equal(slots[0].astype(np.float32), [128.0, 1.0, 2.0])
    x = np.array([3.0, 5.0], np.float32).astype(BFLOAT16)
    scale(x, 2)
    np.testing.assert_array_equal(x.astype(np.float32), [1.5, 2.5])


def test_fold_errors_are_typed() -> None:
    with pytest.raises(TypeError, match="float16, bfloat16"):
        fold_rows16(np.zeros((2, 3), np.int32), np.zeros(3, BFLOAT16), SUM, 1)
    with pytest.raises(ValueError, match="expected \\(n, m\\)"):
        fold_rows16(np.zeros((2, 3), BFLOAT16), np.zeros(4, BFLOAT16), SUM, 1)
    with pytest.raises(ValueError, match="divisor"):
        fold_rows16(np.zeros((2, 3), BFLOAT16), np.zeros(3, BFLOAT16), MEAN, 0)
    with pytest.raises(ValueError, match="contiguous"):
        reduce_slots(np.zeros((2, 6), BFLOAT16)[:, ::2], 0, 3, np.zeros(3, BFLOAT16), 0, SUM, 1)


def test_one_process_engine_and_local_reduction() -> None:
    engine = Collectives(mpi().COMM_SELF)
    x = np.array([1.0, 2.0**-9], np.float32).astype(BFLOAT16)
    (got,) = engine.allreduce([x], "MEAN")
    assert got.dtype == BFLOAT16 and got is not x
    np.testing.assert_array_equal(got.view(np.uint16), x.view(np.uint16))
    a = np.array([1.0], np.float32).astype(BFLOAT16)
    b = np.array([2.0**-8], np.float32).astype(BFLOAT16)
    # bf16 adds one by one would round twice: 1 + 2**-8 -> 1, then + 2**-8 -> 1;
    # float32 accumulation rounds once: 1 + 2**-7 is a bf16 value
    total = reduce_arrays([a, b, b], "SUM")
    np.testing.assert_array_equal(total.astype(np.float32), [1.0 + 2.0**-7])
    assert is_floating(BFLOAT16) and is_floating(np.float16) and not is_floating(np.int8)


def test_compression_options() -> None:
    opts = CommunicationOptions(compression="BFloat16")
    assert opts.compression == "bf16" and CommunicationOptions(compression="fp16") != opts
    assert opts.merge(CommunicationOptions(compression="none")).compression is None
    assert CommunicationOptions(timeout_seconds=5).merge(opts).compression == "bf16"
    assert hash(opts) == hash(CommunicationOptions(compression="bf16"))
    assert not opts.splits_by_filter()
    picky = CommunicationOptions(compression="bf16", compression_filter=lambda a: a.ndim > 1)
    assert picky.splits_by_filter() and not picky.without_filter(True).splits_by_filter()
    assert picky.without_filter(False).compression is None
    with pytest.raises(ValueError, match="'bf16'.*'fp16'"):
        CommunicationOptions(compression="int8")
    with pytest.raises(TypeError, match="compression_filter"):
        CommunicationOptions(compression="bf16", compression_filter="biases")


def test_chunk_bounds_cover_everything() -> None:
    for total in (0, 1, 31, 1000, 4099):
        for size in (1, 2, 3, 4):
            bounds = chunk_bounds(total, size)
            assert bounds[0] == 0 and bounds[-1] == total and len(bounds) == size + 1
            assert all(lo <= hi for lo, hi in zip(bounds, bounds[1:], strict=False))


def test_segment_bounds_cover_a_chunk() -> None:
    assert segment_bounds(0, 64) == []
    assert segment_bounds(5, 2) == [(0, 2), (2, 4), (4, 5)]
    for length in (1, 63, 64, 65, 1000):
        parts = segment_bounds(length, 64)
        assert parts[0][0] == 0 and parts[-1][1] == length
        assert all(b - a <= 64 for a, b in parts)
        assert all(p[1] == q[0] for p, q in zip(parts, parts[1:], strict=False))


def _self_exchange(comm, received: np.ndarray):
    """A plan that starts a receive and a send to itself, and waits for both."""
    requests = [comm.Irecv(received, 0, 7), comm.Isend(np.arange(4.0), 0, 7)]
    yield Call(WAITALL, (requests,), label="the exchange")
    return received.copy()


@pytest.mark.parametrize("timeout", [None, 30.0], ids=["blocking", "deadline"])
def test_waitall_call_waits_for_the_plans_requests(timeout) -> None:
    comm = mpi().COMM_SELF
    got = drive(comm, _self_exchange(comm, np.zeros(4)), timeout, "exchange")
    np.testing.assert_array_equal(got, np.arange(4.0))


def test_waitall_call_times_out_with_a_pending_request() -> None:
    """A receive that nothing matches: the deadline gives a typed error naming the step;
    the pending collective completes once the message arrives."""
    comm = mpi().COMM_SELF
    received = np.zeros(2)

    def plan():
        yield Call(WAITALL, ([comm.Irecv(received, 0, 9)],), label="the late receive")
        return received

    with pytest.raises(CollectiveTimeoutError, match="the late receive") as info:
        drive(comm, plan(), 0.05, "late")
    comm.Send(np.ones(2), 0, 9)  # small: buffered, it does not wait for the receive
    np.testing.assert_array_equal(info.value.request.Wait(), np.ones(2))


class _SlowRequest:
    """Completes at its ``ready``-th test; counts the tests."""

    def __init__(self, ready: int) -> None:
        self.ready, self.tests = ready, 0

    def Test(self) -> bool:
        self.tests += 1
        return self.tests >= self.ready


def test_waiting_for_transfers_tests_them_and_sleeps_between(monkeypatch) -> None:
    """A blocking WAITALL keeps testing (Open MPI's TCP moves data only then) but sleeps,
    at most TRANSFER_SLEEP_S at a time, instead of spinning on the core."""
    from hpcdist.collectives import mpi_backend

    sleeps: list[float] = []
    monkeypatch.setattr(mpi_backend.time, "sleep", sleeps.append)
    requests = [_SlowRequest(3), _SlowRequest(60)]

    def plan():
        yield Call(WAITALL, (requests,))
        return "done"

    assert drive(object(), plan(), None, "transfers") == "done"
    assert requests[1].tests == 60 and requests[0].tests >= 3  # every request tested each time
    assert sleeps and max(sleeps) <= mpi_backend.TRANSFER_SLEEP_S
