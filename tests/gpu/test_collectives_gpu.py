"""The collectives engine on CuPy arrays, in a world of one process, for every implementation.

For each ``CommunicationOptions.implementation`` and ``HPCDIST_CUDA_AWARE_MPI``
set to 0 and 1, a fresh ``Collectives(COMM_WORLD)`` runs allreduce,
reduce_scatter, allgather and broadcast on CuPy arrays. The results must be
new CuPy arrays on the inputs' GPU, with the host path's shapes and dtypes
(MEAN of integers: float64) and NumPy's values; ``engine.last_device_route``
must name the route the engine documents for one rank:

* NCCL asks for ``nccl`` (NCCL runs even on one rank);
* every other implementation makes device copies only (``copy``), since one
  rank has nothing to exchange, and CUDA-aware MPI is never used by one rank;
* reduce_scatter without NCCL goes through the host path (``staged``), as do
  allgather along another axis than 0 and dtypes NCCL lacks (int16).

Work is enqueued on the caller's current stream: on a busy non-default stream
the inputs are written after a long-running kernel, the call returns while the
stream is still busy (the copy and NCCL routes never wait on the host), and the
results are right once the stream is synchronised.
"""

from __future__ import annotations

import numpy as np
import pytest

from hpcdist.collectives.engine import Collectives
from hpcdist.collectives.options import CommunicationOptions
from hpcdist.runtime import mpi

IMPLEMENTATIONS = ["AUTO", "NCCL", "MPI", "SHM", "HIERARCHICAL"]

#: The route on a world of one rank, per operation and implementation (see the module docstring).
ONE_RANK_ROUTE = {
    operation: {
        impl: ("nccl" if impl == "NCCL" else "staged" if operation == "reduce_scatter" else "copy")
        for impl in IMPLEMENTATIONS
    }
    for operation in ("allreduce", "broadcast", "allgather", "reduce_scatter")
}

#: One call's tensors: several dtype groups (fused per dtype), one large enough to wrap the
#: pack kernel's grid, a 0-d array and an empty one.
SPECS = [
    ("float32", (3, 4)),
    ("float64", (5,)),
    ("int32", (7,)),
    ("float16", (2, 3)),
    ("float32", (1_100_003,)),
    ("int64", ()),
    ("float32", (0,)),
    ("uint8", (9,)),
]


@pytest.fixture(autouse=True, scope="module")
def _one_rank() -> None:
    size = mpi().COMM_WORLD.Get_size()
    if size != 1:
        pytest.skip(
            f"these tests expect a world of one process, found {size}: run them without mpirun "
            "(test_collectives_gpu_mpi.py starts its own multi-rank jobs)"
        )


@pytest.fixture(params=["0", "1"], ids=["staging", "cuda_aware"])
def aware(request, monkeypatch) -> str:
    """``HPCDIST_CUDA_AWARE_MPI`` for the test (and no ``HPCDIST_COLLECTIVES`` override)."""
    monkeypatch.setenv("HPCDIST_CUDA_AWARE_MPI", request.param)
    monkeypatch.delenv("HPCDIST_COLLECTIVES", raising=False)
    return request.param


@pytest.fixture(params=IMPLEMENTATIONS)
def impl(request) -> str:
    if request.param == "NCCL":
        request.getfixturevalue("nccl_ok")  # skips, with the reason, without NCCL
    return request.param


@pytest.fixture
def engine(cp, aware):
    """A fresh engine (the CUDA-aware setting is read when its device path is made)."""
    c = Collectives(mpi().COMM_WORLD)
    yield c
    c.close()


def _host_inputs(seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    out = []
    for dtype, shape in SPECS:
        dtype = np.dtype(dtype)
        if dtype.kind == "f":
            out.append((rng.standard_normal(shape) * 10).astype(dtype))
        else:
            out.append(rng.integers(0, 100, size=shape).astype(dtype))
    return out


def _check_result(cp, got, expected: np.ndarray, device: int = 0) -> None:
    assert type(got) is cp.ndarray, f"expected a CuPy array, got {type(got).__name__}"
    assert got.device.id == device
    assert got.shape == expected.shape and got.dtype == expected.dtype, (
        f"{got.dtype}{got.shape} != {expected.dtype}{expected.shape}"
    )
    np.testing.assert_array_equal(got.get(), expected)


def _one_rank_allreduce(x: np.ndarray, op: str) -> np.ndarray:
    """What allreduce gives on one rank: the values, MEAN of integers as float64."""
    if op == "MEAN" and x.dtype.kind in "iu":
        return x.astype(np.float64)
    return x.copy()


@pytest.mark.parametrize("op", ["SUM", "MEAN", "MIN", "MAX"])
def test_allreduce_of_cupy_arrays(cp, engine, impl, op):
    hosts = _host_inputs(seed=1)
    xs = [cp.asarray(h) for h in hosts]
    got = engine.allreduce(xs, op, CommunicationOptions(implementation=impl))
    assert engine.last_device_route == ONE_RANK_ROUTE["allreduce"][impl]
    assert len(got) == len(xs)
    for x in xs:  # the results are new arrays: changing the inputs leaves them alone
        x.fill(0)
    cp.cuda.get_current_stream().synchronize()
    for g, h in zip(got, hosts, strict=True):
        _check_result(cp, g, _one_rank_allreduce(h, op))


def test_allreduce_moves_host_arrays_to_the_gpu(cp, engine, impl):
    host, dev = np.arange(6.0).reshape(2, 3), cp.full(4, 7, cp.int32)
    got = engine.allreduce([host, dev], "SUM", CommunicationOptions(implementation=impl))
    assert engine.last_device_route == ONE_RANK_ROUTE["allreduce"][impl]
    _check_result(cp, got[0], host)
    _check_result(cp, got[1], np.full(4, 7, np.int32))


def test_a_dtype_nccl_lacks_is_staged(cp, engine, nccl_ok):
    x = cp.arange(-5, 5, dtype=cp.int16)
    (got,) = engine.allreduce([x], "MAX", CommunicationOptions(implementation="NCCL"))
    assert engine.last_device_route == "staged"
    _check_result(cp, got, np.arange(-5, 5, dtype=np.int16))


@pytest.mark.parametrize(("dtype", "op"), [("float32", "SUM"), ("float64", "MEAN"),
                                           ("int32", "MEAN"), ("float16", "MAX")])  # fmt: skip
def test_reduce_scatter_of_a_cupy_array(cp, engine, impl, dtype, op):
    host = _host_inputs(seed=2)[0].astype(dtype).reshape(6, 2)
    got = engine.reduce_scatter(cp.asarray(host), op, CommunicationOptions(implementation=impl))
    assert engine.last_device_route == ONE_RANK_ROUTE["reduce_scatter"][impl]
    _check_result(cp, got, _one_rank_allreduce(host, op))  # one rank: block 0 is everything


@pytest.mark.parametrize("axis", [0, 1, -1])
def test_allgather_of_a_cupy_array(cp, engine, impl, axis):
    host = np.arange(12, dtype=np.float32).reshape(4, 3)
    got = engine.allgather(cp.asarray(host), axis, CommunicationOptions(implementation=impl))
    expected_route = ONE_RANK_ROUTE["allgather"][impl]
    if expected_route == "nccl" and axis % host.ndim != 0:
        expected_route = "staged"  # NCCL gathers along axis 0 only
    assert engine.last_device_route == expected_route
    _check_result(cp, got, host)


def test_allgather_of_a_cupy_scalar_gives_a_vector(cp, engine, impl):
    got = engine.allgather(cp.asarray(np.float64(2.5)), 0, CommunicationOptions(
        implementation=impl))  # fmt: skip
    _check_result(cp, got, np.array([2.5]))


def test_broadcast_of_cupy_arrays(cp, engine, impl):
    hosts = _host_inputs(seed=3)
    xs = [cp.asarray(h) for h in hosts]
    got = engine.broadcast(xs, 0, CommunicationOptions(implementation=impl))
    assert engine.last_device_route == ONE_RANK_ROUTE["broadcast"][impl]
    for x in xs:
        x.fill(0)
    cp.cuda.get_current_stream().synchronize()
    for g, h in zip(got, hosts, strict=True):
        _check_result(cp, g, h)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("operation", ["allreduce", "broadcast"])
def test_work_is_enqueued_on_the_callers_stream(cp, engine, impl, spin, operation):
    opts = CommunicationOptions(implementation=impl)
    hosts = _host_inputs(seed=4)
    targets = [_one_rank_allreduce(h, "MEAN") for h in hosts]

    def call(xs):
        if operation == "allreduce":
            return engine.allreduce(xs, "MEAN", opts)
        return engine.broadcast(xs, 0, opts)

    stream = cp.cuda.Stream(non_blocking=True)
    with stream:
        call([cp.asarray(h) for h in hosts])  # warm-up: kernels compiled, NCCL set up
        stream.synchronize()
        sources = [cp.asarray(h) for h in hosts]
        xs = [cp.zeros(h.shape, h.dtype) for h in hosts]
        stream.synchronize()
        spin(stream, 2.0)  # the stream is busy for 2 s ...
        for x, source in zip(xs, sources, strict=True):
            x[...] = source  # ... and the inputs are written only after that (device copies)
        got = call(xs)
        route = engine.last_device_route
        if route in ("copy", "nccl"):  # these routes never wait on the host
            assert not stream.done, f"the {route} route waited for the caller's stream"
    stream.synchronize()
    expected = targets if operation == "allreduce" else hosts
    for g, e in zip(got, expected, strict=True):
        _check_result(cp, g, e)


def test_results_stay_on_the_second_gpu(cp, gpus, engine, impl):
    if gpus < 2:
        pytest.skip(f"needs 2 GPUs, this process sees {gpus}")
    hosts = _host_inputs(seed=5)[:4]
    with cp.cuda.Device(1):
        xs = [cp.asarray(h) for h in hosts]
        got = engine.allreduce(xs, "SUM", CommunicationOptions(implementation=impl))
        gathered = engine.allgather(xs[0], 0, CommunicationOptions(implementation=impl))
        cp.cuda.Device(1).synchronize()
    for g, h in zip(got, hosts, strict=True):
        _check_result(cp, g, h, device=1)
    _check_result(cp, gathered, hosts[0], device=1)


def test_nccl_asked_without_nccl_raises_a_clear_error(cp, engine):
    from hpcdist.collectives.nccl import NcclUnavailableError, nccl_available

    ok, _ = nccl_available()
    if ok:
        pytest.skip("NCCL is available here: nothing to refuse")
    with pytest.raises(NcclUnavailableError, match="NCCL cannot be used"):
        engine.allreduce([cp.ones(3)], "SUM", CommunicationOptions(implementation="NCCL"))
