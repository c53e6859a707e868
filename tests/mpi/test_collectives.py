"""The collectives engine on real ranks: values, determinism, fusion, mismatch and timeout.

Run under `mpirun -n 2` and `-n 4` (and with HPCDIST_VIRTUAL_NODES=2) by `make test`.
Every rank builds the inputs of every rank from (rank, dtype, size), so each rank can
check its result against a NumPy reference of the whole job.
"""

from __future__ import annotations

import time

import numpy as np
import pytest

from hpcdist.collectives import Collectives, CommunicationOptions, ReduceOp
from hpcdist.collectives.ops import divide_mean
from hpcdist.errors import CollectiveMismatchError, CollectiveTimeoutError
from hpcdist.runtime import mpi, world

pytestmark = pytest.mark.mpi(min_size=2)

DTYPES = [
    "bool",
    "int8",
    "uint8",
    "int32",
    "int64",
    "uint64",
    "float16",
    "float32",
    "float64",
    "complex64",
    "complex128",
]
SIZES = [0, 1, 2, 7, 13, 1031]  # empty, one, primes: none a multiple of the rank count
TIMEOUT = CommunicationOptions(timeout_seconds=60.0)


@pytest.fixture(scope="module")
def c() -> Collectives:
    return Collectives()


def _same_everywhere(value) -> list:
    return mpi().COMM_WORLD.allgather(value)


def _assert_bitwise_identical(arrays) -> None:
    blobs = [(a.dtype.str, a.shape, a.tobytes()) for a in arrays]
    everyone = _same_everywhere(blobs)
    assert all(b == everyone[0] for b in everyone), "ranks got different bits"


def _valid(dtype: str, op: ReduceOp) -> bool:
    kind = np.dtype(dtype).kind
    if kind == "b":
        return op in (ReduceOp.MIN, ReduceOp.MAX)
    if kind == "c":
        return op in (ReduceOp.SUM, ReduceOp.MEAN)
    return True


def _input(rank: int, dtype: str, shape, seed: int = 0) -> np.ndarray:
    """Rank ``rank``'s deterministic input: small integers, so every sum is exact."""
    rng = np.random.default_rng([seed, rank, int(np.prod(shape, dtype=np.int64))])
    kind = np.dtype(dtype).kind
    if kind == "b":
        return rng.integers(0, 2, size=shape).astype(bool)
    low = 0 if kind == "u" else -8
    values = rng.integers(low, 9, size=shape)
    if kind == "c":
        return (values + 1j * rng.integers(-8, 9, size=shape)).astype(dtype)
    return values.astype(dtype)


def _reference(op: ReduceOp, inputs: list[np.ndarray], size: int) -> np.ndarray:
    dtype = inputs[0].dtype
    if op is ReduceOp.MIN:
        return np.minimum.reduce(inputs)
    if op is ReduceOp.MAX:
        return np.maximum.reduce(inputs)
    wide = np.complex128 if dtype.kind == "c" else np.float64 if dtype.kind == "f" else None
    total = np.add.reduce([x.astype(wide) if wide else x for x in inputs]).astype(dtype)
    if op is ReduceOp.SUM:
        return total
    if dtype.kind in "fc":
        # The exact mean rounded once (double rounding through the wide dtype is exact here),
        # each component divided on its own: NumPy's complex division multiplies by the
        # reciprocal, one ulp off the correctly rounded quotient for a size of 3.
        wide_total = np.add.reduce([x.astype(wide) for x in inputs])
        if dtype.kind == "c":
            mean = wide_total.real / size + 1j * (wide_total.imag / size)
        else:
            mean = wide_total / size
        return np.asarray(mean).astype(dtype)
    return np.asarray(divide_mean(total, size))


# -- allreduce -------------------------------------------------------------------------


@pytest.mark.parametrize("op", list(ReduceOp))
@pytest.mark.parametrize("dtype", DTYPES)
def test_allreduce_every_dtype_and_op_matches_numpy(c, dtype, op):
    size, rank = c.size, c.rank
    if not _valid(dtype, op):
        with pytest.raises(TypeError):  # raised before any MPI call, so on every rank
            c.allreduce([_input(rank, dtype, (3,))], op)
        return
    for n in SIZES:
        shape = (n,) if n != 2 else (2, 3)
        mine = _input(rank, dtype, shape)
        before = mine.copy()
        (out,) = c.allreduce([mine], op)
        expected = _reference(op, [_input(r, dtype, shape) for r in range(size)], size)
        assert out.dtype == expected.dtype and out.shape == shape
        np.testing.assert_array_equal(out, expected)
        np.testing.assert_array_equal(mine, before)
        assert not np.shares_memory(out, mine)
        _assert_bitwise_identical([out])


@pytest.mark.parametrize("op", ["SUM", "MEAN", "MIN", "MAX"])
@pytest.mark.parametrize("dtype", ["float16", "float32", "float64"])
def test_allreduce_of_random_floats_is_bitwise_identical_on_every_rank(c, dtype, op):
    for n in (1031, 100_003):
        rng = np.random.default_rng([7, c.rank, n])
        mine = rng.standard_normal(n).astype(dtype)
        (out,) = c.allreduce([mine], op)
        _assert_bitwise_identical([out])
        everyone = [
            np.random.default_rng([7, r, n]).standard_normal(n).astype(dtype) for r in range(c.size)
        ]
        wide = np.add.reduce([x.astype(np.float64) for x in everyone])
        expected = {
            "SUM": wide,
            "MEAN": wide / c.size,
            "MIN": np.minimum.reduce(everyone),
            "MAX": np.maximum.reduce(everyone),
        }[op]
        tol = {"float16": 2e-2, "float32": 1e-5, "float64": 1e-12}[dtype]
        np.testing.assert_allclose(out.astype(np.float64), expected, rtol=tol, atol=tol)


def _mixed(rank: int, seed: int = 1) -> list[np.ndarray]:
    return [
        _input(rank, "float32", (5,), seed),
        _input(rank, "int64", (3, 2), seed),
        _input(rank, "float16", (7,), seed),
        _input(rank, "float64", (0,), seed),
        _input(rank, "int32", (), seed),
        _input(rank, "float32", (4, 1), seed + 1),
        _input(rank, "uint8", (9,), seed),
        _input(rank, "complex64", (2,), seed),
    ]


@pytest.mark.parametrize(
    "options",
    [None, TIMEOUT, CommunicationOptions(bytes_per_pack=24), CommunicationOptions(1, 60.0)],
    ids=["blocking", "timeout", "packs-of-24-bytes", "packs-of-1-byte-timeout"],
)
@pytest.mark.parametrize("op", ["SUM", "MEAN"])
def test_allreduce_of_a_batch_of_mixed_dtypes(c, op, options):
    size = c.size
    mine = _mixed(c.rank)
    out = c.allreduce(mine, op, options)
    assert len(out) == len(mine)
    for i, got in enumerate(out):
        expected = _reference(ReduceOp[op], [_mixed(r)[i] for r in range(size)], size)
        assert got.dtype == expected.dtype and got.shape == mine[i].shape
        np.testing.assert_array_equal(got, expected)
        assert not any(np.shares_memory(got, x) for x in mine)
    _assert_bitwise_identical(out)


def test_allreduce_on_split_and_node_communicators():
    comm = mpi().COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    half = comm.Split(rank % 2, key=rank)
    try:
        sub = Collectives(half)
        (out,) = sub.allreduce([np.array([rank], np.int64)], "SUM")
        assert out[0] == sum(r for r in range(size) if r % 2 == rank % 2)
    finally:
        half.Free()
    w = world()
    node = Collectives(w.node_comm)
    (count,) = node.allreduce([np.ones(1, np.int32)], "SUM")
    assert count[0] == w.local_size
    (alone,) = Collectives(mpi().COMM_SELF).allreduce([np.array([rank])], "SUM")
    assert alone[0] == rank


# -- allgather -------------------------------------------------------------------------


def _rows(rank: int, zero_rank: int | None) -> int:
    return 0 if rank == zero_rank else rank + 1


@pytest.mark.parametrize("options", [None, TIMEOUT], ids=["blocking", "timeout"])
@pytest.mark.parametrize("zero_rank", [None, 1], ids=["r+1-rows", "rank1-gives-none"])
@pytest.mark.parametrize("axis", [0, 1, -1])
@pytest.mark.parametrize("dtype", ["float32", "int64", "float16", "bool", "complex128"])
def test_allgather_uneven_sizes_in_rank_order(c, dtype, axis, zero_rank, options):
    def tensor(rank: int) -> np.ndarray:
        rows = _rows(rank, zero_rank)
        shape = {0: (rows, 3, 2), 1: (2, rows, 3), -1: (2, 3, rows)}[axis]
        return _input(rank, dtype, shape, seed=5)

    mine = tensor(c.rank)
    out = c.allgather(mine, axis=axis, options=options)
    expected = np.concatenate([tensor(r) for r in range(c.size)], axis=axis)
    assert out.dtype == expected.dtype and out.shape == expected.shape
    np.testing.assert_array_equal(out, expected)
    assert out.flags.c_contiguous and not np.shares_memory(out, mine)


def test_allgather_of_scalars_gives_a_vector_in_rank_order(c):
    out = c.allgather(np.float64(c.rank * 1.5))
    np.testing.assert_array_equal(out, np.arange(c.size) * 1.5)
    empty = c.allgather(np.zeros((c.rank, 0), np.int32), axis=0)
    assert empty.shape == (sum(range(c.size)), 0)


# -- broadcast -------------------------------------------------------------------------


def _payload(rank: int) -> list[np.ndarray]:
    return [
        _input(rank, "float64", (4, 3), 9),
        _input(rank, "int8", (5,), 9),
        _input(rank, "float16", (), 9),
        _input(rank, "bool", (6,), 9),
        _input(rank, "complex64", (0, 2), 9),
        np.asfortranarray(_input(rank, "int64", (3, 2), 9)),
    ]


def _bump(a: np.ndarray) -> np.ndarray:
    """``a`` changed in every element, same dtype and shape."""
    return ~a if a.dtype == bool else (a + 1).astype(a.dtype)


@pytest.mark.parametrize(
    "options",
    [None, TIMEOUT, CommunicationOptions(bytes_per_pack=40)],
    ids=["blocking", "timeout", "packs-of-40-bytes"],
)
@pytest.mark.parametrize("root", ["first", "last"])
def test_broadcast_from_root(c, root, options):
    root_rank = 0 if root == "first" else c.size - 1
    if c.rank == root_rank:
        mine = [_bump(a) for a in _payload(root_rank)]  # the values only the root has
    else:
        mine = [np.zeros_like(a) for a in _payload(c.rank)]
    out = c.broadcast(mine, root=root_rank, options=options)
    for got, want, own in zip(out, [_bump(a) for a in _payload(root_rank)], mine, strict=True):
        assert got.dtype == want.dtype and got.shape == want.shape
        np.testing.assert_array_equal(got, want)
        assert not np.shares_memory(got, own)


# -- agreement on the call --------------------------------------------------------------


def _expect_mismatch(call, *fragments: str) -> str:
    with pytest.raises(CollectiveMismatchError) as info:
        call()
    message = str(info.value)
    for fragment in fragments:
        assert fragment in message, message
    return message


def _others(size: int) -> str:
    return "rank 1 passed" if size == 2 else f"ranks 1-{size - 1} passed"


def test_shape_mismatch_raises_on_every_rank_naming_the_ranks(c):
    n = 4 if c.rank == 0 else 3
    _expect_mismatch(
        lambda: c.allreduce([np.ones(n, np.float32)], "SUM"),
        "rank 0 passed allreduce(op=SUM, [float32(4,)]",
        _others(c.size) + " allreduce(op=SUM, [float32(3,)]",
    )
    # Nothing is left half-done: the communicator works.
    (out,) = c.allreduce([np.ones(2)], "SUM")
    np.testing.assert_array_equal(out, [c.size, c.size])


@pytest.mark.parametrize(
    "case",
    ["dtype", "op", "count", "operation", "root", "timeout-mode", "allgather-dims", "pack"],
)
def test_every_kind_of_disagreement_is_caught(c, case):
    odd = c.rank == c.size - 1
    x = np.ones(3, np.float32)
    calls = {
        "dtype": lambda: c.allreduce([x.astype(np.float64) if odd else x], "SUM"),
        "op": lambda: c.allreduce([x], "MAX" if odd else "MIN"),
        "count": lambda: c.allreduce([x] * (2 if odd else 1), "SUM"),
        "operation": lambda: c.allgather(x) if odd else c.allreduce([x], "SUM"),
        "root": lambda: c.broadcast([x], root=1 if odd else 0),
        "timeout-mode": lambda: c.allreduce([x], "SUM", TIMEOUT if odd else None),
        "allgather-dims": lambda: c.allgather(np.ones((c.rank + 1, 3 if odd else 2))),
        "pack": lambda: c.broadcast(
            [x], options=CommunicationOptions(mpi_message_bytes=4 if odd else 0)
        ),
    }
    last = c.size - 1
    _expect_mismatch(calls[case], f"rank {last} passed", f"rank{'s' if last > 1 else ''} 0")
    c.barrier()


def test_mismatch_under_a_timeout_raises_too(c):
    shape = (2,) if c.rank == 0 else (3,)
    _expect_mismatch(lambda: c.broadcast([np.zeros(shape)], options=TIMEOUT), "rank 0 passed")


# -- timeout ---------------------------------------------------------------------------


@pytest.mark.parametrize("operation", ["allreduce", "allgather", "broadcast", "barrier"])
def test_timeout_when_a_rank_is_late_then_the_late_call_completes(c, operation):
    late = c.size - 1
    x = np.arange(5, dtype=np.float32) + c.rank

    def run(options):
        if operation == "allreduce":
            return c.allreduce([x], "SUM", options)
        if operation == "allgather":
            return c.allgather(x, options=options)
        if operation == "broadcast":
            return c.broadcast([x], root=late, options=options)
        return c.barrier(options)

    expected = {
        "allreduce": [sum(np.arange(5, dtype=np.float32) + r for r in range(c.size))],
        "allgather": np.concatenate([np.arange(5, dtype=np.float32) + r for r in range(c.size)]),
        "broadcast": [np.arange(5, dtype=np.float32) + late],
        "barrier": None,
    }[operation]

    def check(result):
        if expected is None:
            assert result is None
        elif isinstance(expected, list):
            np.testing.assert_array_equal(result[0], expected[0])
        else:
            np.testing.assert_array_equal(result, expected)

    c.barrier()
    if c.rank == late:
        time.sleep(1.2)  # skip the collective for a while, then join it
        check(run(CommunicationOptions(timeout_seconds=60.0)))
    else:
        start = time.monotonic()
        with pytest.raises(CollectiveTimeoutError) as info:
            run(CommunicationOptions(timeout_seconds=0.2))
        elapsed = time.monotonic() - start
        assert 0.2 <= elapsed < 1.1, elapsed  # raised at its timeout, not when the late rank came
        message = str(info.value)
        assert message.startswith(operation) and "0.2 s" in message
        if operation != "barrier":
            assert "float32(5,)" in message
        # The engine refuses new calls while this one is pending (no MPI traffic).
        with pytest.raises(CollectiveTimeoutError, match="still pending"):
            c.allreduce([x], "SUM")
        check(info.value.request.Wait())  # the late rank joins; the call completes
    # Every rank has finished the same calls: the communicator is clean.
    (out,) = c.allreduce([np.ones(1, np.int64)], "SUM")
    assert out[0] == c.size
