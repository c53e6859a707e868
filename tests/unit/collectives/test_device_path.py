"""The engine's device path in a world of one, on the fake GPU array (no GPU needed)."""

from __future__ import annotations

import numpy as np
import pytest

from hpcdist.collectives import Collectives, CommunicationOptions
from hpcdist.collectives.device_path import has_device_arrays
from hpcdist.collectives.options import CommunicationImplementation as CI
from hpcdist.collectives.registry import choose_route
from hpcdist.runtime import mpi
from hpcdist.runtime.device import DeviceArrayError, is_c_contiguous, is_device_array
from tests.support.fake_gpu import RUNTIME, FakeGpuArray, fake


@pytest.fixture
def engine():
    return Collectives(mpi().COMM_SELF)


@pytest.mark.parametrize(
    ("asked", "size", "nccl_ok", "aware", "route"),
    [
        (CI.AUTO, 1, True, True, "copy"),
        (CI.AUTO, 4, True, False, "nccl"),
        (CI.AUTO, 4, False, True, "mpi-device"),
        (CI.AUTO, 4, False, False, "staged"),
        (CI.NCCL, 1, False, False, "nccl"),
        (CI.NCCL, 4, False, True, "nccl"),
        (CI.MPI, 4, True, True, "mpi-device"),
        (CI.RING, 4, True, False, "staged"),
        (CI.SHM, 4, True, True, "staged"),
        (CI.HIERARCHICAL, 4, True, True, "hierarchical"),
        (CI.HIERARCHICAL, 4, False, True, "staged"),
        (CI.HIERARCHICAL, 1, True, True, "copy"),
    ],
)
def test_route_table(asked, size, nccl_ok, aware, route, monkeypatch):
    monkeypatch.delenv("HPCDIST_COLLECTIVES", raising=False)
    assert choose_route(asked, size, nccl_ok, aware) == route


def test_route_follows_the_environment_for_auto(monkeypatch):
    monkeypatch.setenv("HPCDIST_COLLECTIVES", "nccl")
    assert choose_route(CI.AUTO, 4, False, True) == "nccl"
    monkeypatch.setenv("HPCDIST_COLLECTIVES", "mpi")
    assert choose_route(CI.AUTO, 4, True, False) == "staged"


def test_device_arrays_are_recognised():
    x = fake(np.ones(3))
    assert is_device_array(x) and not is_device_array(np.ones(3))
    assert has_device_arrays([np.ones(2), x]) and not has_device_arrays([np.ones(2)])
    assert not has_device_arrays(x)  # a bare array is not a list of tensors
    assert is_c_contiguous(x) and not is_c_contiguous(fake(np.ones((3, 2))).T)
    with pytest.raises(TypeError, match="implicit conversion"):
        np.asarray(x)


def _mixed_inputs():
    rng = np.random.default_rng(5)
    return [
        rng.normal(size=(3, 4)).astype(np.float32),
        rng.integers(-9, 9, size=5).astype(np.int16),
        (rng.normal(size=2) + 1j * rng.normal(size=2)).astype(np.complex64),
        rng.normal(size=(2, 2)).astype(np.float16),
        np.arange(7, dtype=np.int64),
    ]


@pytest.mark.parametrize("op", ["SUM", "MEAN"])
def test_allreduce_world_of_one_copies_on_the_device(engine, op):
    hosts = [*_mixed_inputs(), np.ones(3, np.float32)]
    before = dict(RUNTIME.calls)
    out = engine.allreduce([fake(h) for h in hosts], op)
    assert engine.last_device_route == "copy"
    assert RUNTIME.calls["pack"] - before.get("pack", 0) == 1  # the two float32 tensors
    assert RUNTIME.calls["copy"] - before.get("copy", 0) == 4  # the groups of one tensor
    for h, o in zip(hosts, out, strict=True):
        assert isinstance(o, FakeGpuArray) and o.shape == h.shape
        want = h.astype(np.float64) if (op == "MEAN" and h.dtype.kind == "i") else h
        assert o.dtype == want.dtype
        np.testing.assert_array_equal(o.get(), want)


def test_allreduce_booleans_min_max_and_results_are_new_memory(engine):
    flags = np.array([True, False, True])
    x = fake(flags)
    (lo,) = engine.allreduce([x], "MIN")
    (hi,) = engine.allreduce([x], "MAX")
    assert lo.dtype == np.bool_ and hi.dtype == np.bool_
    np.testing.assert_array_equal(lo.get(), flags)
    x[0] = False
    assert lo.get()[0]  # the result does not share the input's memory


def test_mixed_host_and_device_lists_go_to_the_device(engine):
    out = engine.allreduce([np.ones(2, np.float32), fake(np.full(3, 2.0, np.float32))], "SUM")
    assert all(isinstance(o, FakeGpuArray) for o in out)
    np.testing.assert_array_equal(out[0].get(), np.ones(2, np.float32))


def test_allreduce_into_device_out(engine):
    target = fake(np.zeros(4))
    got = engine.allreduce([fake(np.arange(4.0))], "SUM", out=[target])
    assert got[0] is target
    np.testing.assert_array_equal(target.get(), np.arange(4.0))
    with pytest.raises(ValueError, match="out\\[0\\] must be a device array"):
        engine.allreduce([fake(np.arange(4.0))], "SUM", out=[fake(np.zeros(3))])


def test_work_goes_to_the_callers_stream(engine):
    RUNTIME.streams.clear()
    engine.allreduce([fake(np.ones(3))], "SUM")
    assert set(RUNTIME.streams) == {RUNTIME.stream_handle}


def test_broadcast_allgather_reduce_scatter_world_of_one(engine):
    a, b = np.arange(6.0).reshape(2, 3), np.array([1, 2], np.int8)
    out = engine.broadcast([fake(a), fake(b)], root=0)
    np.testing.assert_array_equal(out[0].get(), a)
    assert out[1].dtype == np.int8 and out[1].get().tolist() == [1, 2]
    g = engine.allgather(fake(a), axis=1)
    np.testing.assert_array_equal(g.get(), a)
    g0 = engine.allgather(fake(np.float32(3.0)))
    assert g0.shape == (1,) and g0.get()[0] == 3.0
    rs = engine.reduce_scatter(fake(np.arange(5, dtype=np.int32)), "MEAN")
    assert rs.dtype == np.float64
    np.testing.assert_array_equal(rs.get(), np.arange(5.0))


def test_bad_device_inputs_are_clear_errors(engine):
    with pytest.raises(DeviceArrayError, match="on GPU 1 but tensor 0 is on GPU 0"):
        engine.allreduce([fake(np.ones(2)), fake(np.ones(2), device=1)], "SUM")
    with pytest.raises(DeviceArrayError, match="not C-contiguous"):
        engine.allreduce([fake(np.ones((2, 3))).T], "SUM")
    with pytest.raises(TypeError, match="dtype object"):
        engine.allreduce([FakeGpuArray(np.array([None, 1]))], "SUM")

    class Foreign:
        __cuda_array_interface__ = {"shape": (1,), "typestr": "<f4", "data": (0, False)}

    with pytest.raises(DeviceArrayError, match="no device runtime"):
        engine.allreduce([Foreign()], "SUM")


def test_nccl_asked_without_nccl_says_why(engine):
    from hpcdist.collectives.nccl import NcclUnavailableError

    with pytest.raises(NcclUnavailableError):
        engine.allreduce(
            [fake(np.ones(2, np.float32))], "SUM", CommunicationOptions(implementation="NCCL")
        )


def test_a_pinned_buffer_grows_only_after_the_copy_out_of_the_old_one():
    from types import SimpleNamespace

    from hpcdist.collectives.device_path import DevicePath
    from tests.support.fake_gpu import FakeRuntime

    rt = FakeRuntime()
    path = DevicePath(SimpleNamespace(size=1))
    first = path._pinned_for("k", 64, rt, 7)
    assert first.nbytes == 64 and rt.calls["pinned"] == 1 and rt.calls["wait"] == 0
    path._released("k", rt, 7)  # a copy out of it is in flight
    again = path._pinned_for("k", 32, rt, 7)
    assert again.base is first.base and rt.calls["pinned"] == 1  # reused, smaller view
    assert rt.calls["wait"] == 1 and rt.calls["synchronize"] == 0  # the stream waits, not the host
    path._released("k", rt, 7)
    grown = path._pinned_for("k", 128, rt, 7)
    assert grown.nbytes == 128 and rt.calls["pinned"] == 2
    # the old buffer is dropped only after its pending copy finished (host waits once)
    assert rt.calls["wait"] == 2 and rt.calls["synchronize"] == 1
    path._pinned_for("k", 128, rt, 7)  # nothing pending on the new buffer
    assert rt.calls["wait"] == 2 and rt.calls["synchronize"] == 1


class _TinyDevice:
    """A test-only device algorithm: calls of at most 16 bytes, results plus one."""

    name = "tiny-device"

    def __init__(self):
        self.ran = 0

    def applies(self, where):
        return where.device and where.layout is not None and where.layout.nbytes <= 16

    def allreduce(self, engine, items, layout, opts):
        self.ran += 1
        call = engine.device_path().prepare(items, layout)
        for src, flat in zip(call.srcs, call.flats, strict=True):
            if src is not flat:
                call.rt.copy(flat, src, call.stream)
        for flat in call.flats:
            flat[:] = flat.get() + 1
        return call.flats


def test_a_registered_device_algorithm_is_picked_only_where_it_applies(engine):
    from hpcdist.collectives import registry

    tiny = _TinyDevice()
    registry.register(tiny)
    try:
        out = engine.allreduce([fake(np.array([1.0, 2.0], np.float32))], "SUM")
        assert (engine.last_algorithm, engine.last_device_route, tiny.ran) == (
            "tiny-device", "tiny-device", 1
        )
        np.testing.assert_array_equal(out[0].get(), [2.0, 3.0])
        big = np.arange(64, dtype=np.float32)
        out = engine.allreduce([fake(big)], "SUM")  # 256 bytes: not tiny's
        assert (engine.last_algorithm, engine.last_device_route, tiny.ran) == (
            "copy", "copy", 1
        )
        np.testing.assert_array_equal(out[0].get(), big)
        host = registry.Where(None, CommunicationOptions(), CI.MPI, 2)  # a host call: never tiny
        assert registry.pick(host).name == "mpi"
    finally:
        registry.unregister("tiny-device")
    engine.allreduce([fake(np.ones(2, np.float32))], "SUM")
    assert engine.last_algorithm == "copy" and tiny.ran == 1
