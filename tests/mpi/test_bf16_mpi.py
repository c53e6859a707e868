"""bfloat16 reductions and compressed transport on real ranks.

Run under `mpirun -n 2` and `-n 4` (and with HPCDIST_VIRTUAL_NODES=2) by `make test`.
Every rank builds every rank's inputs from a seed, so it can check its result
against a NumPy reference: bfloat16 values widened to float32, summed in
float32, rounded once to nearest-even.
"""

from __future__ import annotations

import numpy as np
import pytest

from hpcdist.arrays import BFLOAT16
from hpcdist.collectives import Collectives, CommunicationOptions, ReduceOp, wire16
from hpcdist.collectives.mpi_backend import drive
from hpcdist.errors import CollectiveMismatchError
from hpcdist.runtime import mpi

pytestmark = pytest.mark.mpi(min_size=2)

IMPLEMENTATIONS = ["AUTO", "MPI", "SHM", "HIERARCHICAL"]
SIZES = [1, 7, 1031, 70_001]  # the small path, one bucket, several chunks of the window
OPS = [ReduceOp.SUM, ReduceOp.MEAN, ReduceOp.MIN, ReduceOp.MAX]


@pytest.fixture(scope="module")
def c() -> Collectives:
    return Collectives()


def _everyone(value):
    return mpi().COMM_WORLD.allgather(value)


def _assert_same_bits_everywhere(arrays) -> None:
    blobs = [(str(a.dtype), a.shape, a.tobytes()) for a in arrays]
    everyone = _everyone(blobs)
    assert all(b == everyone[0] for b in everyone), "ranks got different bits"


def _exact_inputs(size: int, n: int, seed: int) -> list[np.ndarray]:
    """bf16 values whose float32 sums are exact in any order (integers up to 255 times
    2**-4..2**4), so the reference does not depend on the order of the additions, while
    their rounding to bf16 is not exact: any second rounding shows."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(size):
        mant = rng.integers(-255, 256, n).astype(np.float64)
        scale = 2.0 ** rng.integers(-4, 5, n)
        out.append((mant * scale).astype(np.float32).astype(BFLOAT16))
    return out


def _reference(inputs: list[np.ndarray], op: ReduceOp) -> np.ndarray:
    """float32 accumulation in rank order, one rounding (MEAN: divided in float32)."""
    wide = [a.astype(np.float32) for a in inputs]
    if op is ReduceOp.MIN:
        return np.minimum.reduce(wide).astype(BFLOAT16)
    if op is ReduceOp.MAX:
        return np.maximum.reduce(wide).astype(BFLOAT16)
    acc = wide[0].copy()
    for w in wide[1:]:
        acc = acc + w
    if op is ReduceOp.MEAN:
        acc = acc / np.float32(len(inputs))
    return acc.astype(BFLOAT16)


def _bits(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a).view(np.uint16)


@pytest.mark.parametrize("implementation", IMPLEMENTATIONS)
@pytest.mark.parametrize("op", OPS, ids=lambda o: o.name)
@pytest.mark.parametrize("n", SIZES)
def test_bf16_allreduce_is_float32_sum_rounded_once(c, implementation, op, n) -> None:
    inputs = _exact_inputs(c.size, n, seed=n)
    opts = CommunicationOptions(implementation=implementation)
    (got,) = c.allreduce([inputs[c.rank]], op, opts)
    assert got.dtype == BFLOAT16 and got.shape == (n,)
    np.testing.assert_array_equal(_bits(got), _bits(_reference(inputs, op)))
    _assert_same_bits_everywhere([got])


def _node_order_reference(c: Collectives, inputs: list[np.ndarray], op: ReduceOp) -> np.ndarray:
    """The hierarchical order: float32 sums in rank order inside each node, then the node
    sums in node order, one rounding (flat routes: one node holding every rank)."""
    top = c.session.topology()
    node = top.node if top.nodes > 1 else mpi().COMM_WORLD
    first = _everyone(node.allreduce(c.rank, op=mpi().MIN))
    acc = None
    for leader in sorted(set(first)):
        members = [r for r in range(c.size) if first[r] == leader]
        part = inputs[members[0]].astype(np.float32)
        for r in members[1:]:
            part = part + inputs[r].astype(np.float32)
        acc = part if acc is None else acc + part
    if op is ReduceOp.MEAN:
        acc = acc / np.float32(c.size)
    return acc.astype(BFLOAT16)


@pytest.mark.parametrize("implementation", IMPLEMENTATIONS)
@pytest.mark.parametrize("op", [ReduceOp.SUM, ReduceOp.MEAN], ids=lambda o: o.name)
def test_bf16_any_values_in_a_fixed_order(c, implementation, op) -> None:
    """Any values (sums not exact): flat routes fold in rank order, the hierarchical one
    node by node; either way float32 sums rounded once, bit for bit."""
    rng = np.random.default_rng(7)
    inputs = [rng.standard_normal(20_000).astype(np.float32).astype(BFLOAT16)
              for _ in range(c.size)]
    opts = CommunicationOptions(implementation=implementation)
    (got,) = c.allreduce([inputs[c.rank]], op, opts)
    if c.last_algorithm == "hierarchical":
        expected = _node_order_reference(c, inputs, op)
    else:
        expected = _reference(inputs, op)
    np.testing.assert_array_equal(_bits(got), _bits(expected))


def test_bf16_many_tensors_buckets_and_timeout(c) -> None:
    """Several tensors fused with float32 ones, small buckets, checked mode."""
    shapes = [(3, 5), (1000,), (), (64, 33)]
    per_tensor = [_exact_inputs(c.size, int(np.prod(s)), seed=i) for i, s in enumerate(shapes)]
    mine = [p[c.rank].reshape(s) for p, s in zip(per_tensor, shapes, strict=True)]
    floats = np.full(10, c.rank + 1.0, np.float32)
    for implementation in IMPLEMENTATIONS:
        opts = CommunicationOptions(
            bytes_per_pack=4096, timeout_seconds=60, implementation=implementation
        )
        *got, total = c.allreduce([*mine, floats], "SUM", opts)
        for g, p, s in zip(got, per_tensor, shapes, strict=True):
            assert g.shape == s
            np.testing.assert_array_equal(_bits(g).ravel(), _bits(_reference(p, ReduceOp.SUM)))
        np.testing.assert_array_equal(total, np.full(10, c.size * (c.size + 1) / 2))


def test_bf16_runs_repeat_bits(c) -> None:
    rng = np.random.default_rng(c.rank)
    x = rng.standard_normal(50_000).astype(np.float32).astype(BFLOAT16)
    first = c.allreduce([x], "SUM")[0].copy()
    for _ in range(3):
        np.testing.assert_array_equal(_bits(c.allreduce([x], "SUM")[0]), _bits(first))
    _assert_same_bits_everywhere([first])


def test_bf16_reduce_scatter_is_the_allreduce_block(c) -> None:
    inputs = _exact_inputs(c.size, 4099, seed=3)
    block = c.reduce_scatter(inputs[c.rank], "SUM")
    full = _reference(inputs, ReduceOp.SUM)
    expected = np.array_split(full, c.size)[c.rank]
    np.testing.assert_array_equal(_bits(block), _bits(expected))


# ------------------------------------------------------------------------- compression


def _compressed_reference(inputs: list[np.ndarray], wire: np.dtype) -> np.ndarray:
    wide = [a.astype(wire).astype(np.float32) for a in inputs]
    acc = wide[0].copy()
    for w in wide[1:]:
        acc = acc + w
    return acc.astype(wire).astype(np.float32)


@pytest.mark.parametrize("compression", ["bf16", "fp16"])
def test_compressed_mpi_allreduce(c, compression) -> None:
    """Over MPI: each rank's float32 values rounded for transport, summed in float32 in
    rank order, rounded once, widened back; the same bits everywhere."""
    rng = np.random.default_rng(11)
    inputs = [rng.standard_normal(30_000).astype(np.float32) for _ in range(c.size)]
    opts = CommunicationOptions(implementation="MPI", compression=compression)
    (got,) = c.allreduce([inputs[c.rank]], "SUM", opts)
    wire = wire16.compression_dtype(compression)
    assert got.dtype == np.float32
    np.testing.assert_array_equal(got, _compressed_reference(inputs, wire))
    exact = np.sum(inputs, axis=0, dtype=np.float64)
    assert not np.array_equal(got, exact.astype(np.float32))  # it really was rounded
    _assert_same_bits_everywhere([got])
    (mean,) = c.allreduce([inputs[c.rank]], "MEAN", opts)
    np.testing.assert_array_equal(mean, got / np.float32(c.size))


def test_compressed_one_tensor_is_read_in_place_and_divided_segment_by_segment(c) -> None:
    """A compressed one-tensor call reads the caller's array (never writing it unless it
    is ``out``) and divides a MEAN as each pipeline segment is widened: the bits of the
    whole sum divided afterwards, over several segments."""
    rng = np.random.default_rng(12)
    n = 2 * c.size * wire16.SEGMENT + 1001  # several segments per chunk, a short last one
    inputs = [rng.standard_normal(n).astype(np.float32) for _ in range(c.size)]
    opts = CommunicationOptions(implementation="MPI", compression="bf16")
    mine = inputs[c.rank].copy()
    (summed,) = c.allreduce([mine], "SUM", opts)
    np.testing.assert_array_equal(mine, inputs[c.rank])  # read, not written
    np.testing.assert_array_equal(summed, _compressed_reference(inputs, BFLOAT16))
    (mean,) = c.allreduce([mine], "MEAN", opts)
    np.testing.assert_array_equal(mine, inputs[c.rank])
    np.testing.assert_array_equal(mean, summed / np.float32(c.size))
    c.allreduce([mine], "MEAN", opts, out=[mine])  # in place
    np.testing.assert_array_equal(mine, mean)
    _assert_same_bits_everywhere([mean])


@pytest.mark.parametrize("implementation", IMPLEMENTATIONS)
def test_compressed_close_to_exact_everywhere(c, implementation) -> None:
    """Every route: within bf16's rounding of the float32 result, the same bits on every rank."""
    rng = np.random.default_rng(5)
    inputs = [rng.uniform(1.0, 2.0, 100_000).astype(np.float32) for _ in range(c.size)]
    opts = CommunicationOptions(implementation=implementation, compression="bf16")
    (got,) = c.allreduce([inputs[c.rank]], "SUM", opts)
    exact = np.sum(inputs, axis=0, dtype=np.float64)
    np.testing.assert_allclose(got, exact, rtol=2.0**-7)
    _assert_same_bits_everywhere([got])


def test_compression_filter_keeps_picked_tensors_exact(c) -> None:
    rng = np.random.default_rng(9)
    weights = [rng.standard_normal((64, 32)).astype(np.float32) for _ in range(c.size)]
    biases = [rng.standard_normal(32).astype(np.float32) for _ in range(c.size)]
    opts = CommunicationOptions(
        implementation="MPI", compression="bf16", compression_filter=lambda a: a.ndim > 1
    )
    w, b = c.allreduce([weights[c.rank], biases[c.rank]], "SUM", opts)
    (b_exact,) = c.allreduce([biases[c.rank]], "SUM", CommunicationOptions(implementation="MPI"))
    np.testing.assert_array_equal(b, b_exact)
    np.testing.assert_array_equal(w, _compressed_reference(weights, BFLOAT16).reshape(64, 32))


def test_compression_none_overrides_the_engine_default(c) -> None:
    engine = Collectives(options=CommunicationOptions(compression="bf16", implementation="MPI"))
    x = np.full(100, 1.0 + 2.0**-10, np.float32)
    (rounded,) = engine.allreduce([x], "SUM")
    (kept,) = engine.allreduce([x], "SUM", CommunicationOptions(compression="none"))
    np.testing.assert_array_equal(rounded, np.full(100, float(c.size), np.float32))
    np.testing.assert_array_equal(kept, np.full(100, c.size * (1.0 + 2.0**-10), np.float32))


class _CountingComm:
    """The world communicator, counting the bytes its point-to-point sends carry."""

    def __init__(self, comm) -> None:
        self._comm = comm
        self.sent = 0

    def __getattr__(self, name):
        return getattr(self._comm, name)

    def Sendrecv(self, sendbuf, dest, sendtag, recvbuf, source, recvtag):
        self.sent += np.asarray(sendbuf).nbytes
        return self._comm.Sendrecv(sendbuf, dest, sendtag, recvbuf, source, recvtag)

    def Isend(self, buf, dest, tag):
        self.sent += np.asarray(buf).nbytes
        return self._comm.Isend(buf, dest, tag)


def test_compressed_transport_sends_half_the_bytes(c) -> None:
    n = 1 << 16
    comm = _CountingComm(mpi().COMM_WORLD)
    buf = np.ones(n, np.float32)
    drive(comm, wire16.reduce_plan(comm, buf, ReduceOp.SUM, BFLOAT16, BFLOAT16), None, "test")
    np.testing.assert_array_equal(buf, np.full(n, float(c.size)))
    # a reduce-scatter and all-gather of float32 send 2 (size - 1) * n * 4 bytes in all
    # (each rank 1/size of it when the chunks are equal: not at 3 ranks, where they are aligned)
    sent = mpi().COMM_WORLD.allreduce(comm.sent)
    assert sent == 2 * (c.size - 1) * n * 4 // 2


def test_compressed_reduce_scatter_is_the_allreduce_block_for_half_the_bytes(c) -> None:
    """MPI's compressed reduce_scatter runs only the exchange's first half: this rank's
    block of the compressed allreduce, bit for bit, over several pipeline segments."""
    rng = np.random.default_rng(21)
    n = 2 * c.size * wire16.SEGMENT + 777
    inputs = [rng.standard_normal(n).astype(np.float32) for _ in range(c.size)]
    mine = inputs[c.rank]
    opts = CommunicationOptions(implementation="MPI", compression="bf16")
    for op in ("SUM", "MEAN"):
        block = c.reduce_scatter(mine, op, opts)
        assert c.last_algorithm == "mpi"
        (whole,) = c.allreduce([mine], op, opts)
        np.testing.assert_array_equal(block, np.array_split(whole, c.size)[c.rank])
    np.testing.assert_array_equal(mine, inputs[c.rank])  # read, not written
    comm = _CountingComm(mpi().COMM_WORLD)
    bounds = np.cumsum([0] + [len(b) for b in np.array_split(mine, c.size)]).tolist()
    out = np.empty(bounds[c.rank + 1] - bounds[c.rank], np.float32)
    plan = wire16.reduce_plan(comm, mine, ReduceOp.SUM, BFLOAT16, BFLOAT16, out=out,
                              bounds=bounds)
    drive(comm, plan, None, "test")
    np.testing.assert_array_equal(out, c.reduce_scatter(mine, "SUM", opts))
    # every element goes once from each rank that does not own it: (size - 1) n 16-bit values
    assert mpi().COMM_WORLD.allreduce(comm.sent) == (c.size - 1) * n * 2


def test_ranks_disagreeing_on_compression_raise(c) -> None:
    opts = CommunicationOptions(implementation="MPI", compression="bf16" if c.rank else None)
    with pytest.raises(CollectiveMismatchError, match="compression"):
        c.allreduce([np.ones(8, np.float32)], "SUM", opts)


# ------------------------------------------------------------------------- the pipeline


def _plan_result(buf, op, send, round_, segment, timeout=None, out=None, divisor=0):
    comm = mpi().COMM_WORLD
    plan = wire16.reduce_plan(comm, buf, op, send, round_, divisor, out=out, segment=segment)
    return drive(comm, plan, timeout, "test")


# element counts: empty, tiny (fewer than one per rank), uneven chunks, several segments
# with a short last one on every rank, and a last chunk shorter than the others
PIPELINE_SIZES = [0, 1, 3, 97, 1000, 4099, 70_001]


@pytest.mark.parametrize("n", PIPELINE_SIZES)
@pytest.mark.parametrize("segment", [32, 96, wire16.SEGMENT])
@pytest.mark.parametrize("timeout", [None, 60.0], ids=["blocking", "deadline"])
def test_pipelined_bf16_is_float32_sum_rounded_once(c, n, segment, timeout) -> None:
    """16-bit inputs reduced in place, segment by segment: the bits are the reference's
    whatever the segment (one segment, many, a short last one) and the drive mode."""
    inputs = _exact_inputs(c.size, n, seed=n + 1)
    for op in (ReduceOp.SUM, ReduceOp.MEAN):
        buf = inputs[c.rank].copy()
        got = _plan_result(buf, op, BFLOAT16, BFLOAT16, segment, timeout, divisor=c.size)
        assert got is buf
        np.testing.assert_array_equal(_bits(got), _bits(_reference(inputs, op)))
        _assert_same_bits_everywhere([got])


@pytest.mark.parametrize("n", PIPELINE_SIZES)
@pytest.mark.parametrize("wire", [BFLOAT16, np.dtype(np.float16)], ids=["bf16", "fp16"])
def test_pipelined_compression_of_float32(c, n, wire) -> None:
    """float32 in, 16 bits on the wire, float32 out (widened segment by segment), in place
    and into a separate result; many segments give the bits of one."""
    rng = np.random.default_rng(n)
    inputs = [rng.standard_normal(n).astype(np.float32) for _ in range(c.size)]
    expected = _compressed_reference(inputs, wire)
    one = _plan_result(inputs[c.rank].copy(), ReduceOp.SUM, wire, wire, 1 << 30)
    np.testing.assert_array_equal(one, expected)
    many = _plan_result(inputs[c.rank].copy(), ReduceOp.SUM, wire, wire, 32)
    np.testing.assert_array_equal(many, expected)
    src = inputs[c.rank].copy()
    out = np.empty(n, np.float32)
    got = _plan_result(src, ReduceOp.SUM, wire, wire, 64, timeout=60.0, out=out)
    assert got is out
    np.testing.assert_array_equal(out, expected)
    np.testing.assert_array_equal(src, inputs[c.rank])  # the source is only read
    _assert_same_bits_everywhere([one, many, out])


def test_pipelined_float32_node_sums_rounded_by_the_leaders(c) -> None:
    """The hierarchical leaders' call: float32 on the wire (uncompressed node sums),
    rounded once to bf16 into a separate result."""
    n = 5000
    rng = np.random.default_rng(3)
    inputs = [rng.standard_normal(n).astype(np.float32) for _ in range(c.size)]
    out = np.empty(n, BFLOAT16)
    got = _plan_result(inputs[c.rank].copy(), ReduceOp.SUM, np.float32, BFLOAT16, 64, out=out)
    acc = inputs[0].copy()
    for x in inputs[1:]:
        acc = acc + x
    np.testing.assert_array_equal(_bits(got), _bits(acc.astype(BFLOAT16)))


def test_pipelined_segments_each_carry_their_part(c) -> None:
    """Many segments send the same bytes in all as one: half of float32's, and every
    message is at most one segment long."""

    class Sizes(_CountingComm):
        def __init__(self, comm) -> None:
            super().__init__(comm)
            self.largest = 0

        def Isend(self, buf, dest, tag):
            self.largest = max(self.largest, np.asarray(buf).nbytes)
            return super().Isend(buf, dest, tag)

    n = 10_000
    comm = Sizes(mpi().COMM_WORLD)
    buf = np.ones(n, np.float32)
    plan = wire16.reduce_plan(comm, buf, ReduceOp.SUM, BFLOAT16, BFLOAT16, segment=256)
    drive(comm, plan, None, "test")
    np.testing.assert_array_equal(buf, np.full(n, float(c.size)))
    lengths = np.diff(wire16.chunk_bounds(n, c.size))
    others = int(lengths.sum() - lengths[c.rank])  # its part of the others' chunks, and
    assert comm.sent == 2 * (others + (c.size - 1) * int(lengths[c.rank]))  # its own chunk
    assert comm.largest == 256 * 2
