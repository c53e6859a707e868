"""reduce_scatter over the node's shared window for tensors larger than one slot.

The ``shm`` algorithm reduce-scatters a tensor that does not fit one slot in
rounds (:func:`hpcdist.collectives.shm_backend.blocked_reduce_scatter_plan`):
each rank folds only its own block. Here the engines run on a window with
64 KiB slots, so tensors of a few hundred KiB take many rounds, and every
rank's block must be bitwise the matching slice of the engine's allreduce
(and of a NumPy left fold in rank order where the node is one), for sizes
not divisible by the number of ranks, every dtype the fold knows
(bfloat16 included) and checked calls. Run under ``mpirun -n 2``, ``-n 4``
and with 2 virtual nodes (where the hierarchical algorithm slices its
allreduce: the same bits by construction).
"""

from __future__ import annotations

import functools
import os

import ml_dtypes
import numpy as np
import pytest

from hpcdist.collectives import Collectives, CommunicationOptions, ReduceOp
from hpcdist.errors import CollectiveMismatchError
from hpcdist.runtime import mpi, world

pytestmark = [pytest.mark.mpi(min_size=2), pytest.mark.timeout(300)]

SLOT = 64 * 1024
DTYPES = ["float32", "float64", "float16", "bfloat16", "int32", "int64"]
# rows (not divisible by 2, 3 or 4 where prime), per dtype up to ~1.6 MiB: many rounds
SHAPES = [(100_003,), (40_009, 3), (65_536,), (5,)]


@pytest.fixture(scope="module")
def small_slots() -> Collectives:
    """An engine on its own communicator whose node window has 64 KiB slots."""
    comm = mpi().COMM_WORLD.Dup()
    before = os.environ.get("HPCDIST_SHM_SLOT_BYTES")
    os.environ["HPCDIST_SHM_SLOT_BYTES"] = str(SLOT)
    try:
        c = Collectives(comm)
        c.implementation_for()  # finds the topology and maps the window now
    finally:
        if before is None:
            del os.environ["HPCDIST_SHM_SLOT_BYTES"]
        else:
            os.environ["HPCDIST_SHM_SLOT_BYTES"] = before
    window = c.session.topology().window
    assert window is None or window.slot_bytes == SLOT
    return c


def _dtype(name: str) -> np.dtype:
    return np.dtype(ml_dtypes.bfloat16) if name == "bfloat16" else np.dtype(name)


def _input(name: str, shape: tuple[int, ...], rank: int) -> np.ndarray:
    rng = np.random.default_rng(1000 + rank)
    if name.startswith("int"):
        return rng.integers(-1000, 1000, size=shape).astype(name)
    return rng.standard_normal(shape).astype(np.float32).astype(_dtype(name))


def _bits(a: np.ndarray) -> bytes:
    return np.ascontiguousarray(a).view(np.uint8).tobytes()


def _everywhere(fn) -> None:
    """``fn()``; a failure on any rank fails every rank (keeps the ranks in step)."""
    try:
        fn()
        problem = None
    except (Exception, pytest.fail.Exception) as err:
        problem = f"{type(err).__name__}: {err}"
    reports = mpi().COMM_WORLD.allgather(problem)
    failed = [f"[rank {r}] {p}" for r, p in enumerate(reports) if p is not None]
    if failed:
        raise AssertionError("failed on some ranks:\n" + "\n".join(failed))


def _ops(name: str) -> list[ReduceOp]:
    if name.startswith("int"):
        return [ReduceOp.SUM, ReduceOp.MAX]
    return [ReduceOp.SUM, ReduceOp.MEAN, ReduceOp.MIN]


@pytest.mark.parametrize("implementation", ["AUTO", "SHM", "HIERARCHICAL"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_blocks_are_bitwise_the_allreduce_slices(small_slots, dtype, implementation):
    c = small_slots
    opts = CommunicationOptions(implementation=implementation)
    for shape in SHAPES:
        x = _input(dtype, shape, c.rank)
        for op in _ops(dtype):
            def run(x=x, op=op, shape=shape) -> None:
                block = c.reduce_scatter(x, op, opts)
                algorithm = c.last_algorithm
                full = c.allreduce([x], op, opts)[0]
                want = np.array_split(full, c.size, axis=0)[c.rank]
                what = f"{dtype}{shape} {op.name} {implementation} on {algorithm}"
                assert block.dtype == want.dtype, what
                assert block.shape == want.shape, what
                assert _bits(block) == _bits(want), f"{what}: other bits than the allreduce's"
                if world().node_count == 1 and x.nbytes > SLOT:
                    assert algorithm == "shm", what

            _everywhere(run)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "int64"])
def test_blocks_equal_a_left_fold_in_rank_order(small_slots, dtype):
    c = small_slots
    shape = (100_003,)
    everyone = [_input(dtype, shape, r) for r in range(c.size)]
    wide = np.int64 if dtype == "int64" else np.float32

    def run() -> None:
        block = c.reduce_scatter(everyone[c.rank], "SUM")
        ref = functools.reduce(np.add, [a.astype(wide) for a in everyone]).astype(_dtype(dtype))
        want = np.array_split(ref, c.size)[c.rank]
        if world().node_count == 1 or dtype == "int64":  # rank order on one node: the bits
            assert _bits(block) == _bits(want)
        else:  # across nodes the leaders' sum order is MPI's: one rounding apart at most
            np.testing.assert_allclose(
                block.astype(np.float64), want.astype(np.float64),
                rtol=1e-2 if dtype == "bfloat16" else 1e-5, atol=1e-5,
            )

    _everywhere(run)


def test_checked_calls_and_repeats_give_the_same_bits(small_slots):
    c = small_slots
    x = _input("float32", (70_001, 2), c.rank)
    checked = CommunicationOptions(timeout_seconds=60.0)

    def run() -> None:
        first = c.reduce_scatter(x, "MEAN", checked)
        again = c.reduce_scatter(x, "MEAN")
        full = c.allreduce([x], "MEAN", checked)[0]
        assert _bits(first) == _bits(again)
        assert _bits(first) == _bits(np.array_split(full, c.size)[c.rank])

    _everywhere(run)


def test_different_shapes_raise_a_mismatch_on_every_rank(small_slots):
    c = small_slots
    x = np.ones(100_003 + (c.rank == 0), np.float32)
    with pytest.raises(CollectiveMismatchError):
        c.reduce_scatter(x, "SUM")
    ok = c.reduce_scatter(np.ones(100_003, np.float32), "SUM")  # still usable afterwards
    assert np.all(ok == c.size)



@pytest.mark.parametrize("dtype", ["float32", "float64", "int32"])
@pytest.mark.parametrize("op", ["SUM", "MEAN"])
def test_the_mpi_band_scatters_with_reduce_scatter_and_the_allreduce_bits(dtype, op):
    """Two ranks on one node, a tensor in AUTO's MPI band: ``mpi-direct`` runs its own
    ``Reduce_scatter`` (half the bytes of the allreduce) with the allreduce slice's bits."""
    from hpcdist.collectives import choice

    c = Collectives(mpi().COMM_WORLD)
    lo, hi = choice.mpi_band()
    rows = max((lo + hi) // 2 // np.dtype(dtype).itemsize, 7) | 1  # odd: uneven blocks

    def check():
        x = _input(dtype, (rows,), c.rank)
        full = c.allreduce([x], op)[0]
        block = c.reduce_scatter(x, op)
        bounds = np.cumsum([0] + [len(b) for b in np.array_split(np.arange(rows), c.size)])
        assert _bits(block) == _bits(full[bounds[c.rank] : bounds[c.rank + 1]])
        banded = c.size == 2 and world().node_count == 1 and lo < hi
        assert (c.last_algorithm == "mpi-direct") == banded, c.last_algorithm

    _everywhere(check)
    c.close()
