"""Properties of the collectives engine on real ranks, for every implementation.

Run under ``mpirun -n 2``, ``-n 4`` and ``HPCDIST_VIRTUAL_NODES=2 mpirun -n 4`` by
``make test``. Complements ``test_collectives.py`` (values of the default path, timeouts,
the mismatch message) with what must hold for every implementation (AUTO, MPI, SHM,
HIERARCHICAL) and every bucket size:

* every rank gets bitwise the same result, and a repeated call gives the same bits;
* results match a NumPy reference that every rank computes from every rank's inputs
  (each rank's inputs are a function of a seed and the rank): integers, MIN and MAX
  exactly; SUM and MEAN of floats bitwise equal to the left fold in rank order for SHM
  on one node (float16 folded in float32 and rounded once), within a tight bound
  elsewhere (MPI and the hierarchical sum order across nodes are not rank order);
* results are new arrays: inputs are left alone, and a later call does not overwrite
  an earlier result;
* ``reduce_scatter`` gives rank ``r`` block ``r`` of ``np.array_split`` of the reduction.

Every rank must run the same collectives in the same order, so the hypothesis tests are
derandomized (every rank draws the same examples), do not shrink (shrinking stops on a
clock, which differs between ranks), and a failed check on any rank fails the example
on every rank (:func:`_everywhere`).
"""

from __future__ import annotations

import functools
import hashlib
import traceback
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import numpy as np
import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from hpcdist.collectives import Collectives, CommunicationOptions, ReduceOp
from hpcdist.runtime import mpi, world

pytestmark = [pytest.mark.mpi(min_size=2), pytest.mark.timeout(300)]

IMPLEMENTATIONS = ["AUTO", "MPI", "SHM", "HIERARCHICAL"]
CORE_DTYPES = ["float16", "float32", "float64", "int32", "int64"]
DTYPES = [*CORE_DTYPES, "uint8", "bool", "complex64"]
LAYOUTS = ["C", "F", "strided", "reversed"]
PACKS = [0, 6, 64, 100, 4096]
MiB = 1 << 20

# Bound on |result - exact| as (rtol * sum of |x_r|, atol), per input dtype: a few
# roundings of a float32 / float64 sum; float16 adds one rounding to half precision.
TOLERANCE = {
    "float16": (2e-3, 1e-7),
    "float32": (1e-6, 1e-37),
    "float64": (4e-15, 1e-300),
    "complex64": (2e-6, 1e-37),
}

PROPERTY = settings(
    max_examples=25,
    deadline=None,
    derandomize=True,
    database=None,
    phases=(Phase.explicit, Phase.generate),
    suppress_health_check=[HealthCheck.too_slow],
)


class Engine(NamedTuple):
    """An engine, whether all its ranks share one node, and which communicator it is on."""

    c: Collectives
    one_node: bool
    group: int = 0  # ranks with equal ``group`` share the communicator


class Tensor(NamedTuple):
    """What one input tensor looks like (the same on every rank)."""

    dtype: str
    shape: tuple[int, ...]
    layout: str = "C"


@pytest.fixture(scope="module")
def engine() -> Engine:
    comm = mpi().COMM_WORLD
    return Engine(Collectives(comm), world().node_count == 1)


@pytest.fixture(scope="module")
def sub_engines() -> dict[str, Engine]:
    """Engines on ``Split`` communicators: ranks of one parity, and pairs of neighbours.

    With 2 virtual nodes of 2 ranks the pairs lie on one node each, the halves span both.
    The communicators stay alive for the module (the engines may hold windows on them).
    """
    comm = mpi().COMM_WORLD
    rank = comm.Get_rank()
    here = world().node_index
    engines = {}
    for name, color in (("halves", rank % 2), ("pairs", rank // 2)):
        sub = comm.Split(color, key=rank)
        engines[name] = Engine(Collectives(sub), len(set(sub.allgather(here))) == 1, color)
    return engines


# -- agreement between ranks -------------------------------------------------------------


def _everywhere(fn: Callable[[], Any], same_in: int | None = None) -> Any:
    """``fn()`` on this rank; if it failed on any rank, the same error on every rank.

    With ``same_in`` (a communicator's group) ``fn`` returns a digest of its results, and
    ranks of one group whose digests differ fail too. Keeps the ranks in step: a check
    that failed on one rank only would otherwise send that rank on alone.
    """
    try:
        value, problem = fn(), None
    except (Exception, pytest.fail.Exception) as err:
        value, problem = None, f"{type(err).__name__}: {err}{_where(err)}"
    reports = mpi().COMM_WORLD.allgather((problem, same_in, value if same_in is not None else 0))
    failed = [f"[rank {r}] {p}" for r, (p, _, _) in enumerate(reports) if p is not None]
    if same_in is not None and not failed:
        first: dict[Any, tuple[int, Any]] = {}
        for r, (_, group, digest) in enumerate(reports):
            first.setdefault(group, (r, digest))
            if digest != first[group][1]:
                failed.append(f"[rank {r}] got other bits than rank {first[group][0]}")
    if failed:
        raise AssertionError("failed on some ranks:\n" + "\n".join(failed))
    return value


def _where(err: BaseException) -> str:
    """`` (at file:line in function, ...)``: the innermost frames of an error's traceback."""
    frames = traceback.extract_tb(err.__traceback__)[-3:]
    return " (at " + " < ".join(f"{f.filename}:{f.lineno} in {f.name}" for f in frames[::-1]) + ")"


def _digest(arrays: Sequence[Any]) -> str:
    h = hashlib.blake2b(digest_size=16)
    for a in arrays:
        a = np.asarray(a)
        h.update(f"{a.dtype.str}{a.shape};".encode())
        h.update(np.ascontiguousarray(a).tobytes())
    return h.hexdigest()


# -- inputs and references -----------------------------------------------------------------


def _ops_for(dtype: str) -> tuple[ReduceOp, ...]:
    kind = np.dtype(dtype).kind
    if kind == "b":
        return (ReduceOp.MIN, ReduceOp.MAX)
    if kind == "c":
        return (ReduceOp.SUM,)
    return tuple(ReduceOp)


def _values(rng: np.random.Generator, dtype: str, shape: tuple[int, ...]) -> np.ndarray:
    dt = np.dtype(dtype)
    if dt.kind == "b":
        return np.asarray(rng.integers(0, 2, size=shape).astype(bool))
    if dt.kind == "u":
        return np.asarray(rng.integers(0, 31, size=shape).astype(dt))  # 8 ranks: no wrap
    if dt.kind == "i":
        # Beyond float32 / float64 integers, so a float path would lose bits; 8 ranks: no wrap.
        bound = 2**27 if dt.itemsize == 4 else 2**59
        return np.asarray(rng.integers(-bound, bound, size=shape, dtype=np.int64).astype(dt))
    if dt.kind == "c":
        return np.asarray((rng.standard_normal(shape) + 1j * rng.standard_normal(shape)).astype(dt))
    return np.asarray((3 * rng.standard_normal(shape)).astype(dt))


def _make(spec: Tensor, seed: int, rank: int, index: int) -> np.ndarray:
    """Rank ``rank``'s tensor ``index``: a function of these alone, laid out as asked."""
    rng = np.random.default_rng([seed, rank, index])
    shape = spec.shape
    if spec.layout == "strided" and shape:
        return _values(rng, spec.dtype, (2 * shape[0], *shape[1:]))[::2]
    x = _values(rng, spec.dtype, shape)
    if spec.layout == "F":
        return np.asfortranarray(x)
    if spec.layout == "reversed" and shape:
        return x[::-1]
    return x


def _reference(op: ReduceOp, xs: Sequence[np.ndarray], size: int) -> np.ndarray:
    """The reduction of ``xs`` (in rank order) as SHM on one node must give it, bitwise."""
    dtype = xs[0].dtype
    if op is ReduceOp.MIN:
        return np.asarray(functools.reduce(np.minimum, xs))
    if op is ReduceOp.MAX:
        return np.asarray(functools.reduce(np.maximum, xs))
    if dtype == np.float16:
        total = np.asarray(functools.reduce(np.add, [x.astype(np.float32) for x in xs]))
        if op is ReduceOp.MEAN:
            total = total / np.float32(size)
        return np.asarray(total.astype(np.float16))
    total = np.asarray(functools.reduce(np.add, xs))
    if op is ReduceOp.SUM:
        return total
    if dtype.kind in "fc":
        return np.asarray((total / np.asarray(size, dtype=dtype)).astype(dtype))
    return np.asarray(np.true_divide(total, size))


def _assert_bits_equal(got: Any, want: Any, what: str) -> None:
    a = np.ascontiguousarray(got).reshape(-1)
    b = np.ascontiguousarray(want).reshape(-1)
    assert a.dtype == b.dtype and a.size == b.size, (what, a.dtype, b.dtype, a.size, b.size)
    if a.size == 0:
        return
    differ = (a.view(np.uint8).reshape(a.size, -1) != b.view(np.uint8).reshape(b.size, -1)).any(1)
    bad = np.flatnonzero(differ)
    assert bad.size == 0, (
        f"{what}: {bad.size} of {a.size} elements differ in their bits; first at flat index "
        f"{bad[0]}: got {a[bad[0]]!r}, expected {b[bad[0]]!r}"
    )


def _assert_close(got: np.ndarray, xs: Sequence[np.ndarray], op: ReduceOp, what: str) -> None:
    """|got - exact sum (or mean)| within a few roundings of the sum of magnitudes."""
    dtype = xs[0].dtype
    wide = np.complex128 if dtype.kind == "c" else np.float64
    exact = np.asarray(functools.reduce(np.add, [x.astype(wide) for x in xs]))
    scale = np.asarray(functools.reduce(np.add, [np.abs(x.astype(wide)) for x in xs]))
    if op is ReduceOp.MEAN:
        exact, scale = exact / len(xs), scale / len(xs)
    rtol, atol = TOLERANCE[dtype.name]
    err = np.abs(got.astype(wide) - exact).reshape(-1)
    bad = np.flatnonzero(err > (rtol * scale + atol).reshape(-1))
    assert bad.size == 0, (
        f"{what}: {bad.size} of {err.size} elements off by more than {rtol} * sum|x|; first "
        f"at flat index {bad[0]}: got {got.reshape(-1)[bad[0]]!r}, exact "
        f"{exact.reshape(-1)[bad[0]]!r}"
    )


def _check_value(
    got: Any, xs: Sequence[np.ndarray], op: ReduceOp, size: int, bitwise: bool, what: str
) -> None:
    assert isinstance(got, np.ndarray), f"{what}: got a {type(got).__name__}, not an ndarray"
    want = _reference(op, xs, size)
    assert got.dtype == want.dtype, f"{what}: dtype {got.dtype}, expected {want.dtype}"
    assert got.shape == want.shape, f"{what}: shape {got.shape}, expected {want.shape}"
    if bitwise or op in (ReduceOp.MIN, ReduceOp.MAX) or xs[0].dtype.kind in "biu":
        _assert_bits_equal(got, want, what)
    else:
        _assert_close(got, xs, op, what)


def _options(implementation: str, bytes_per_pack: int = 0) -> CommunicationOptions:
    return CommunicationOptions(bytes_per_pack=bytes_per_pack, implementation=implementation)


# -- the two checks every test runs ------------------------------------------------------


def _allreduce_case(
    e: Engine,
    specs: Sequence[Tensor],
    op: ReduceOp | str,
    implementation: str,
    bytes_per_pack: int = 0,
    seed: int = 0,
    repeat: bool = True,
) -> None:
    """An allreduce of ``specs`` checked against the reference, across ranks, and repeated."""
    op = ReduceOp.from_any(op)
    c, size = e.c, e.c.size
    everyone = [[_make(s, seed, r, i) for i, s in enumerate(specs)] for r in range(size)]
    mine = everyone[c.rank]
    kept = [x.copy() for x in mine]
    opts = _options(implementation, bytes_per_pack)
    bitwise = implementation == "SHM" and e.one_node

    def run() -> str:
        out = c.allreduce(mine, op, opts)
        again = c.allreduce(mine, op, opts) if repeat else out
        assert isinstance(out, list) and len(out) == len(mine), out
        for i, got in enumerate(out):
            what = f"tensor {i} ({mine[i].dtype}{mine[i].shape}, {op.name}, {implementation})"
            _check_value(got, [x[i] for x in everyone], op, size, bitwise, what)
            assert not np.shares_memory(got, mine[i]), f"{what}: the result is the input"
            _assert_bits_equal(mine[i], kept[i], f"{what}: input after the call")
            _assert_bits_equal(again[i], got, f"{what}: a repeated call")
        return _digest(out)

    _everywhere(run, same_in=e.group)


def _reduce_scatter_case(
    e: Engine,
    spec: Tensor,
    op: ReduceOp | str,
    implementation: str,
    bytes_per_pack: int = 0,
    seed: int = 0,
    repeat: bool = True,
) -> None:
    """A reduce_scatter checked against block ``rank`` of the reference, and repeated."""
    op = ReduceOp.from_any(op)
    c, size, rank = e.c, e.c.size, e.c.rank
    everyone = [_make(spec, seed, r, 0) for r in range(size)]
    mine = everyone[rank]
    kept = mine.copy()
    opts = _options(implementation, bytes_per_pack)
    bitwise = implementation == "SHM" and e.one_node

    def run() -> None:
        out = c.reduce_scatter(mine, op, opts)
        again = c.reduce_scatter(mine, op, opts) if repeat else out
        what = f"reduce_scatter block {rank} of {spec} ({op.name}, {implementation})"
        blocks = [np.array_split(x, size, axis=0)[rank] for x in everyone]
        _check_value(out, blocks, op, size, bitwise, what)
        assert not np.shares_memory(out, mine), f"{what}: the result is a view of the input"
        _assert_bits_equal(mine, kept, f"{what}: input after the call")
        _assert_bits_equal(again, out, f"{what}: a repeated call")

    _everywhere(run)


# -- allreduce: explicit cases -------------------------------------------------------------

SIZES = [(), (0,), (1,), (7,), (13,), (1021,), (65537,), (0, 3), (4, 0, 2), (3, 5, 2)]
MAX_BUCKETS = 64  # per call in the generated cases: tiny packs only on small tensors


@pytest.mark.parametrize("op", list(ReduceOp), ids=str)
@pytest.mark.parametrize("implementation", IMPLEMENTATIONS)
def test_every_dtype_and_size_in_one_call(engine, implementation, op):
    specs = [
        Tensor(dtype, shape)
        for dtype in DTYPES
        if op in _ops_for(dtype)
        for shape in SIZES
        if shape != (65537,)
    ]
    _allreduce_case(engine, specs, op, implementation, seed=1)


@pytest.mark.parametrize("shape", SIZES, ids=str)
@pytest.mark.parametrize("implementation", IMPLEMENTATIONS)
def test_one_tensor_of_each_size(engine, implementation, shape):
    for dtype, op in (("float32", "SUM"), ("float16", "MEAN"), ("int64", "MAX")):
        _allreduce_case(engine, [Tensor(dtype, shape)], op, implementation, seed=2, repeat=False)


@pytest.mark.parametrize(
    ("dtype", "op"), [("bool", "SUM"), ("bool", "MEAN"), ("complex64", "MIN"), ("complex64", "MAX")]
)
@pytest.mark.parametrize("implementation", IMPLEMENTATIONS)
def test_undefined_dtype_and_op_raise_type_error_on_every_rank(engine, implementation, dtype, op):
    x = np.zeros(3, dtype)

    def call() -> None:
        with pytest.raises(TypeError):
            engine.c.allreduce([np.ones(2, np.float32), x], op, _options(implementation))

    _everywhere(call)
    _allreduce_case(engine, [Tensor("int64", (5,))], "SUM", implementation)  # still works


MIXED = [
    Tensor("float16", (257,)),
    Tensor("float32", (13,)),
    Tensor("int64", (5,)),
    Tensor("float64", (7, 3)),
    Tensor("float32", (0,)),
    Tensor("float16", ()),
    Tensor("uint8", (9,)),
    Tensor("float32", (6, 4), "F"),
    Tensor("int32", (1021,), "strided"),
    Tensor("float64", (1,)),
]


@pytest.mark.parametrize(
    ("bytes_per_pack", "op"), [(0, "MEAN"), (64, "SUM"), (64, "MEAN"), (4096, "SUM")]
)
@pytest.mark.parametrize("implementation", IMPLEMENTATIONS)
def test_mixed_dtypes_and_sizes_fused_into_buckets(engine, implementation, bytes_per_pack, op):
    _allreduce_case(engine, MIXED, op, implementation, bytes_per_pack, seed=5)


@pytest.mark.parametrize("layout", ["F", "strided", "reversed"])
@pytest.mark.parametrize("implementation", IMPLEMENTATIONS)
def test_non_contiguous_and_fortran_inputs(engine, implementation, layout):
    specs = [
        Tensor("float32", (6, 5), layout),
        Tensor("float64", (4, 3, 2), layout),
        Tensor("int64", (1021,), layout),
        Tensor("float16", (9, 2), layout),
    ]
    for op in ("SUM", "MIN"):
        _allreduce_case(engine, specs, op, implementation, bytes_per_pack=512, seed=6)


@pytest.mark.parametrize("implementation", IMPLEMENTATIONS)
def test_large_buffers_go_through_several_buckets(engine, implementation):
    specs = [
        Tensor("float32", (3 * MiB // 4,)),  # 3 MiB
        Tensor("float16", (300_001,)),
        Tensor("int64", (1021,)),
    ]
    _allreduce_case(engine, specs, "SUM", implementation, bytes_per_pack=MiB, seed=7)


@pytest.mark.parametrize("implementation", IMPLEMENTATIONS)
def test_results_are_new_arrays_that_later_calls_leave_alone(engine, implementation):
    c = engine.c
    specs = [Tensor("float32", (1021,)), Tensor("int64", (7, 3)), Tensor("float16", (13,))]
    opts = _options(implementation, 64)
    first_in = [_make(s, 8, c.rank, i) for i, s in enumerate(specs)]
    second_in = [_make(s, 9, c.rank, i) for i, s in enumerate(specs)]

    def run() -> str:
        first = c.allreduce(first_in, "SUM", opts)
        saved = [a.copy() for a in first]
        second = c.allreduce(second_in, "SUM", opts)  # the same layout, other values
        digest = _digest(second)
        for i in range(len(specs)):
            # A later call with the same layout does not reuse the earlier result's memory.
            _assert_bits_equal(first[i], saved[i], f"result {i} after a second call")
            assert not np.shares_memory(first[i], second[i])
            # Writing to inputs or results changes nothing else.
            kept_in, kept_second = second_in[i].copy(), second[i].copy()
            first_in[i][...] = 1
            first[i][...] = 2
            _assert_bits_equal(second_in[i], kept_in, f"input {i} after writing to others")
            _assert_bits_equal(second[i], kept_second, f"result {i} after writing to others")
        return digest

    _everywhere(run, same_in=engine.group)


@pytest.mark.parametrize("implementation", IMPLEMENTATIONS)
@pytest.mark.parametrize("which", ["halves", "pairs"])
def test_split_communicators(sub_engines, which, implementation):
    e = sub_engines[which]
    specs = [Tensor("float32", (1021,)), Tensor("float16", (7, 2)), Tensor("int64", (13,))]
    for op in ("SUM", "MEAN", "MAX"):
        _allreduce_case(e, specs, op, implementation, bytes_per_pack=256, seed=10)
    _reduce_scatter_case(e, Tensor("float32", (13, 2)), "SUM", implementation, seed=11)


# -- allreduce: properties ------------------------------------------------------------------


def _pack(bytes_per_pack: int, specs: Sequence[Tensor]) -> int:
    """``bytes_per_pack``, raised where it would cut the call into over MAX_BUCKETS buckets."""
    total = sum(np.dtype(s.dtype).itemsize * int(np.prod(s.shape)) for s in specs)
    return bytes_per_pack and max(bytes_per_pack, -(-total // MAX_BUCKETS))


def _shapes() -> st.SearchStrategy[tuple[int, ...]]:
    small = st.lists(st.sampled_from([0, 1, 2, 3, 5, 7]), max_size=3).map(tuple)
    long = st.sampled_from([0, 1, 7, 13, 1021, 4099, 65537]).map(lambda n: (n,))
    return st.one_of(small, long)


def _tensors(dtypes: Sequence[str]) -> st.SearchStrategy[Tensor]:
    return st.builds(Tensor, st.sampled_from(dtypes), _shapes(), st.sampled_from(LAYOUTS))


@st.composite
def _allreduce_calls(draw: st.DrawFn) -> tuple:
    op = draw(st.sampled_from(list(ReduceOp)))
    dtypes = [d for d in DTYPES if op in _ops_for(d)]
    specs = draw(st.lists(_tensors(dtypes), min_size=1, max_size=6))
    implementation = draw(st.sampled_from(IMPLEMENTATIONS))
    bytes_per_pack = _pack(draw(st.sampled_from(PACKS)), specs)
    return specs, op, implementation, bytes_per_pack, draw(st.integers(0, 999))


@PROPERTY
@given(call=_allreduce_calls())
def test_any_fused_allreduce_matches_the_reference(engine, call):
    specs, op, implementation, bytes_per_pack, seed = call
    _allreduce_case(engine, specs, op, implementation, bytes_per_pack, seed)


# -- reduce_scatter --------------------------------------------------------------------------

# Lengths along axis 0: 0 (every block empty), 1 and 3 (fewer rows than ranks: empty
# blocks on 2 or on 4 ranks), 8 (divisible by 2 and 4), primes (uneven blocks).
RS_CASES = [
    *(Tensor("float32", shape) for shape in [(0,), (1,), (3,), (8, 3), (7, 2, 2), (1021,)]),
    *(Tensor("int64", shape) for shape in [(0,), (3,), (8,), (13, 2)]),
    Tensor("float16", (13,)),
    Tensor("float64", (5, 3)),
]


@pytest.mark.parametrize("op", list(ReduceOp), ids=str)
@pytest.mark.parametrize("implementation", IMPLEMENTATIONS)
def test_reduce_scatter_every_op_and_uneven_blocks(engine, implementation, op):
    for spec in RS_CASES:
        _reduce_scatter_case(engine, spec, op, implementation, seed=12, repeat=False)


@pytest.mark.parametrize("layout", ["F", "strided", "reversed"])
@pytest.mark.parametrize("implementation", IMPLEMENTATIONS)
def test_reduce_scatter_of_non_contiguous_input_with_small_packs(engine, implementation, layout):
    for op in ("SUM", "MEAN"):
        spec = Tensor("float32", (1021, 3), layout)
        _reduce_scatter_case(engine, spec, op, implementation, bytes_per_pack=512, seed=13)


@pytest.mark.parametrize("implementation", IMPLEMENTATIONS)
def test_reduce_scatter_of_a_large_tensor(engine, implementation):
    spec = Tensor("float32", (3 * MiB // 16, 4))  # 3 MiB
    _reduce_scatter_case(engine, spec, "SUM", implementation, bytes_per_pack=MiB, seed=14)


@pytest.mark.parametrize("implementation", IMPLEMENTATIONS)
def test_reduce_scatter_results_are_new_arrays_that_later_calls_leave_alone(engine, implementation):
    c = engine.c
    opts = _options(implementation, 512)
    first_in = _make(Tensor("float32", (1021, 2)), 15, c.rank, 0)
    second_in = _make(Tensor("float32", (1021, 2)), 16, c.rank, 0)

    def run() -> None:
        first = c.reduce_scatter(first_in, "SUM", opts)
        saved = first.copy()
        second = c.reduce_scatter(second_in, "SUM", opts)  # the same layout, other values
        _assert_bits_equal(first, saved, "a result after a second call")
        assert not np.shares_memory(first, second)
        kept_in, kept_second = second_in.copy(), second.copy()
        first_in[...] = 1
        first[...] = 2
        _assert_bits_equal(second_in, kept_in, "an input after writing to others")
        _assert_bits_equal(second, kept_second, "a result after writing to others")

    _everywhere(run)


@pytest.mark.parametrize("implementation", IMPLEMENTATIONS)
def test_reduce_scatter_of_a_scalar_is_an_error_on_every_rank(engine, implementation):
    def call() -> None:
        with pytest.raises((TypeError, ValueError)):
            engine.c.reduce_scatter(np.float32(1.0), "SUM", _options(implementation))
        with pytest.raises((TypeError, ValueError)):
            engine.c.reduce_scatter(np.zeros((), np.int64), "MAX", _options(implementation))

    _everywhere(call)
    _reduce_scatter_case(engine, Tensor("int64", (5,)), "SUM", implementation)  # still works


@st.composite
def _reduce_scatter_calls(draw: st.DrawFn) -> tuple:
    op = draw(st.sampled_from(list(ReduceOp)))
    dtype = draw(st.sampled_from([d for d in DTYPES if op in _ops_for(d)]))
    rows = draw(st.sampled_from([0, 1, 2, 3, 4, 5, 7, 8, 13, 1021, 4099]))
    rest = draw(st.lists(st.sampled_from([0, 1, 2, 3]), max_size=2).map(tuple))
    spec = Tensor(dtype, (rows, *rest), draw(st.sampled_from(LAYOUTS)))
    implementation = draw(st.sampled_from(IMPLEMENTATIONS))
    bytes_per_pack = _pack(draw(st.sampled_from(PACKS)), [spec])
    return spec, op, implementation, bytes_per_pack, draw(st.integers(0, 999))


@PROPERTY
@given(call=_reduce_scatter_calls())
def test_any_reduce_scatter_matches_the_reference(engine, call):
    spec, op, implementation, bytes_per_pack, seed = call
    _reduce_scatter_case(engine, spec, op, implementation, bytes_per_pack, seed)
