"""Streams and events of the GPU path, checked on CPU with a fake ``cupy`` that records calls.

The fake models what hpcdist relies on in CuPy >= 10: a current device and a
current stream per thread *and* per device, streams and events that belong
to the GPU current when they were made, and ``Event.record`` refusing a
stream of another GPU (as CUDA does). Every call that orders work is logged,
so the tests check which event is recorded on which stream and which stream
waits for it, in order. Also here, with the fake GPU array and the fake NCCL
provider: the prefetch copier of distributed datasets and ``NcclAllReduce``'s
NCCL route.
"""

from __future__ import annotations

import itertools
import threading
from types import SimpleNamespace

import numpy as np
import pytest

import hpcdist as hd
from hpcdist.collectives import nccl
from hpcdist.data.dataset import Dataset
from hpcdist.data.distributed import distribute_dataset
from hpcdist.distribute import devices as devices_module
from hpcdist.distribute import streams
from hpcdist.distribute.cross_device_ops import NcclAllReduce, ReductionToOneDevice
from hpcdist.distribute.devices import parse_device
from hpcdist.distribute.streams import PrefetchCopier, ReplicaStreams
from hpcdist.distribute.values import Mirrored, PerReplica
from tests.support import fake_nccl
from tests.support.fake_gpu import FakeGpuArray, FakeRuntime, fake

MAIN_NULL = 1000  # the fake's default stream of GPU d has ptr MAIN_NULL + d


class FakeStream:
    def __init__(self, cuda: FakeCuda, ptr: int, device: int, non_blocking: bool) -> None:
        self.cuda, self.ptr, self.device, self.non_blocking = cuda, ptr, device, non_blocking

    def __enter__(self) -> FakeStream:
        self.cuda._stack(self.device).append(self)
        return self

    def __exit__(self, *exc: object) -> None:
        assert self.cuda._stack(self.device).pop() is self

    def wait_event(self, event: FakeEvent) -> None:
        if self.ptr >= MAIN_NULL and self.cuda.current_device() != self.device:
            # handle 0 (or the per-thread default stream) names the current GPU's stream
            raise RuntimeError("waited on the default stream of another GPU")
        self.cuda.log.append(("wait", self.ptr, event.id))


class FakeEvent:
    def __init__(self, cuda: FakeCuda, device: int, block: bool, disable_timing: bool) -> None:
        self.cuda, self.device, self.id = cuda, device, next(cuda._ids)
        self.block, self.disable_timing = block, disable_timing

    def record(self, stream: FakeStream) -> None:
        if stream.device != self.device:
            raise RuntimeError("cudaEventRecord: event and stream are on different devices")
        self.cuda.log.append(("record", self.id, stream.ptr))

    def synchronize(self) -> None:
        self.cuda.log.append(("sync", self.id))


class FakeDevice:
    def __init__(self, cuda: FakeCuda, index: int) -> None:
        self.cuda, self.index = cuda, index

    def __enter__(self) -> FakeDevice:
        self.cuda._tls_devices().append(self.index)
        return self

    def __exit__(self, *exc: object) -> None:
        self.cuda._tls_devices().pop()


class FakeCuda:
    """``cupy.cuda`` as far as hpcdist.distribute.streams uses it."""

    def __init__(self) -> None:
        self.log: list[tuple] = []
        self.made: list[FakeStream] = []
        self._ids = itertools.count(1)
        self._ptrs = itertools.count(1)
        self._tls = threading.local()
        self.null = {d: FakeStream(self, MAIN_NULL + d, d, False) for d in range(8)}

    def _tls_devices(self) -> list[int]:
        if not hasattr(self._tls, "devices"):
            self._tls.devices = [0]
        return self._tls.devices

    def _stack(self, device: int) -> list[FakeStream]:
        if not hasattr(self._tls, "streams"):
            self._tls.streams = {}
        return self._tls.streams.setdefault(device, [])

    def current_device(self) -> int:
        return self._tls_devices()[-1]

    def Device(self, index: int) -> FakeDevice:  # noqa: N802 - CuPy's name
        return FakeDevice(self, index)

    def Stream(self, non_blocking: bool = False) -> FakeStream:  # noqa: N802
        stream = FakeStream(self, next(self._ptrs), self.current_device(), non_blocking)
        self.made.append(stream)
        self.log.append(("stream", stream.ptr, stream.device))
        return stream

    def Event(self, block: bool = False, disable_timing: bool = False) -> FakeEvent:  # noqa: N802
        return FakeEvent(self, self.current_device(), block, disable_timing)

    def get_current_stream(self) -> FakeStream:
        device = self.current_device()
        stack = self._stack(device)
        return stack[-1] if stack else self.null[device]


@pytest.fixture
def cuda(monkeypatch: pytest.MonkeyPatch) -> FakeCuda:
    fake_cuda = FakeCuda()
    monkeypatch.setattr(streams, "cupy_module", lambda: SimpleNamespace(cuda=fake_cuda))
    return fake_cuda


@pytest.fixture
def no_cupy(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse() -> None:
        raise AssertionError("CPU devices must not touch CuPy")

    monkeypatch.setattr(streams, "cupy_module", refuse)


def devs(*names: str) -> list:
    return [parse_device(n) for n in names]


# -- ReplicaStreams -----------------------------------------------------------------------------


def test_cpu_devices_touch_nothing(no_cupy):
    rs = ReplicaStreams(devs("/cpu:0", "/cpu:1"))
    assert rs.gpus == () and rs.stream(0) is None and rs.stream(1) is None
    with rs.scope(1):
        pass
    rs.hand_off_from_replica(0)
    rs.hand_back_to_replica(1)
    rs.hand_off_all()
    rs.hand_back_all()


def test_each_replica_gets_its_own_non_blocking_stream_on_its_gpu_lazily(cuda):
    rs = ReplicaStreams(devs("/gpu:0", "/gpu:1", "/cpu:0"))
    assert cuda.made == []  # nothing before first use
    s0, s1 = rs.stream(0), rs.stream(1)
    assert (s0.device, s1.device) == (0, 1)
    assert s0.ptr != s1.ptr and s0.non_blocking and s1.non_blocking
    assert rs.stream(0) is s0 and rs.stream(2) is None
    assert len(cuda.made) == 2
    assert rs.gpus == (0, 1)


def test_scope_makes_the_replica_device_and_stream_current_then_restores(cuda):
    rs = ReplicaStreams(devs("/gpu:0", "/gpu:1"))
    assert cuda.current_device() == 0
    with rs.scope(1):
        assert cuda.current_device() == 1
        assert cuda.get_current_stream() is rs.stream(1)
    assert cuda.current_device() == 0
    with cuda.Device(1):
        assert cuda.get_current_stream() is cuda.null[1]


def test_scope_streams_are_per_thread(cuda):
    rs = ReplicaStreams(devs("/gpu:0", "/gpu:1"))
    seen = {}

    def replica(i: int) -> None:
        with rs.scope(i):
            seen[i] = cuda.get_current_stream().ptr

    threads = [threading.Thread(target=replica, args=(i,)) for i in range(2)]
    with rs.scope(0):  # the main thread's current stream is not the threads'
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert seen == {0: rs.stream(0).ptr, 1: rs.stream(1).ptr}
    assert cuda.get_current_stream() is cuda.null[0]


def test_hand_off_records_on_the_replica_stream_and_every_gpu_main_stream_waits(cuda):
    rs = ReplicaStreams(devs("/gpu:0", "/gpu:1"))
    replica = rs.stream(1).ptr
    with cuda.Device(1):
        main1 = cuda.Stream()  # the main thread's current stream of GPU 1 is its own
    cuda.log.clear()
    with main1:
        rs.hand_off_from_replica(1)
    (kind, event, on), *waits = cuda.log
    assert (kind, on) == ("record", replica)
    assert waits == [("wait", MAIN_NULL + 0, event), ("wait", main1.ptr, event)]


def test_hand_back_records_on_every_gpu_main_stream_and_the_replica_waits(cuda):
    rs = ReplicaStreams(devs("/gpu:0", "/gpu:1"))
    replica = rs.stream(0).ptr
    cuda.log.clear()
    rs.hand_back_to_replica(0)
    records, waits = cuda.log[:2], cuda.log[2:]
    assert [(k, on) for k, _, on in records] == [("record", MAIN_NULL), ("record", MAIN_NULL + 1)]
    assert waits == [("wait", replica, records[0][1]), ("wait", replica, records[1][1])]


def test_all_variants_order_every_replica(cuda):
    rs = ReplicaStreams(devs("/gpu:0", "/gpu:1", "/gpu:2"))
    ptrs = [rs.stream(i).ptr for i in range(3)]
    cuda.log.clear()
    rs.hand_off_all()
    recorded = {on: ev for k, ev, on in cuda.log if k == "record"}
    assert sorted(recorded) == sorted(ptrs)
    waits = [e for e in cuda.log if e[0] == "wait"]
    expected = {("wait", MAIN_NULL + g, recorded[p]) for g in range(3) for p in ptrs}
    assert set(waits) == expected and len(waits) == 9
    assert cuda.log.index(waits[0]) > max(cuda.log.index(e) for e in cuda.log if e[0] == "record")
    cuda.log.clear()
    rs.hand_back_all()
    events = {on: ev for k, ev, on in cuda.log if k == "record"}
    assert sorted(events) == [MAIN_NULL, MAIN_NULL + 1, MAIN_NULL + 2]
    waits = {e for e in cuda.log if e[0] == "wait"}
    assert waits == {("wait", p, ev) for p in ptrs for ev in events.values()}


def test_events_are_recorded_with_their_stream_gpu_current(cuda):
    rs = ReplicaStreams(devs("/gpu:0", "/gpu:3"))  # FakeEvent.record refuses a mismatch
    with cuda.Device(3):  # whatever device the caller has current
        rs.hand_off_all()
        rs.hand_back_all()
    assert all(e[0] != "record" or e[2] in {rs.stream(0).ptr, rs.stream(1).ptr,
                                            MAIN_NULL, MAIN_NULL + 3} for e in cuda.log)


# -- the strategy: replica threads, merge calls, updates ----------------------------------------


@pytest.fixture
def gpu_strategy(cuda, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(devices_module, "visible_gpu_count", lambda: 2)
    return hd.MirroredStrategy(["/gpu:0", "/gpu:1"])


def test_cpu_strategies_have_no_streams(s):
    assert s.extended._streams is None


def test_single_gpu_replica_keeps_the_current_stream(cuda, monkeypatch):
    monkeypatch.setattr(devices_module, "visible_gpu_count", lambda: 1)
    strategy = hd.MirroredStrategy(["/gpu:0"])
    assert strategy.extended._streams is None
    ptr = strategy.run(lambda: cuda.get_current_stream().ptr)
    assert ptr == MAIN_NULL and cuda.made == []


def test_replicas_run_on_their_streams_and_hand_over_at_merges(gpu_strategy, cuda):
    ext = gpu_strategy.extended
    main_ptrs = {MAIN_NULL, MAIN_NULL + 1}

    def replica_fn():
        i = hd.get_replica_context().replica_id_in_sync_group
        cuda.log.append(("work", i, cuda.get_current_stream().ptr, cuda.current_device()))
        hd.get_replica_context().merge_call(
            lambda s: cuda.log.append(("merge", cuda.get_current_stream().ptr))
        )
        cuda.log.append(("work", i, cuda.get_current_stream().ptr, cuda.current_device()))
        return i

    result = gpu_strategy.run(replica_fn)
    assert gpu_strategy.experimental_local_results(result) == (0, 1)
    replica_ptrs = [ext._streams.stream(0).ptr, ext._streams.stream(1).ptr]
    log = [e for e in cuda.log if e[0] != "stream"]
    works = [e for e in log if e[0] == "work"]
    assert sorted(works) == sorted(
        [("work", i, replica_ptrs[i], i) for i in (0, 1)] * 2
    )  # each replica on its own GPU and stream
    merge = log.index(next(e for e in log if e[0] == "merge"))
    assert log[merge][1] == MAIN_NULL  # the merge runs on the main thread's stream

    def phase(lo: int, hi: int) -> tuple[set, set]:
        part = log[lo:hi]
        return ({e[2] for e in part if e[0] == "record"}, {e[1] for e in part if e[0] == "wait"})

    first_work = min(log.index(w) for w in works)
    # before the run: main streams recorded, replica streams wait
    assert phase(0, first_work) == (main_ptrs, set(replica_ptrs))
    # between the first works and the merge: replica streams recorded, main streams wait
    works_before = [i for i, e in enumerate(log[:merge]) if e[0] == "work"]
    assert len(works_before) == 2
    assert phase(max(works_before) + 1, merge) == (set(replica_ptrs), main_ptrs)
    # after the merge: hand-back before any replica continues, then the final hand-off
    works_after = [i for i, e in enumerate(log) if e[0] == "work" and i > merge]
    assert phase(merge + 1, min(works_after)) == (main_ptrs, set(replica_ptrs))
    assert phase(max(works_after) + 1, len(log)) == (set(replica_ptrs), main_ptrs)


def test_variable_updates_in_a_merge_stay_on_the_main_thread_stream(gpu_strategy, cuda):
    ext = gpu_strategy.extended
    seen = []
    with ext._main_device_scope(1):
        seen.append((cuda.current_device(), cuda.get_current_stream().ptr))
    with ext._device_scope(1):
        seen.append((cuda.current_device(), cuda.get_current_stream().ptr))
    assert seen == [(1, MAIN_NULL + 1), (1, ext._streams.stream(1).ptr)]


# -- PrefetchCopier -----------------------------------------------------------------------------


class StreamSpyRuntime(FakeRuntime):
    """The fake GPU runtime, also logging which stream was current at each allocation."""

    def __init__(self, cuda: FakeCuda) -> None:
        super().__init__()
        self.cuda = cuda

    def empty(self, count, dtype, device):
        self.cuda.log.append(("alloc", self.cuda.get_current_stream().ptr, device))
        return super().empty(count, dtype, device)

    def from_host(self, dst, src, stream):
        self.cuda.log.append(("h2d", stream, dst.device_index))
        super().from_host(dst, src, stream)

    def pinned(self, nbytes):
        self.cuda.log.append(("pinned", nbytes))
        return super().pinned(nbytes)


@pytest.fixture
def runtime(cuda, monkeypatch: pytest.MonkeyPatch) -> StreamSpyRuntime:
    rt = StreamSpyRuntime(cuda)
    monkeypatch.setattr(streams, "_default_runtime", lambda: rt)
    return rt


def test_copier_copies_a_nest_and_keeps_shapes_and_non_arrays(cuda, runtime):
    copier = PrefetchCopier([1])
    x = np.arange(12, dtype=np.float32).reshape(4, 3)[:, ::2]  # not contiguous
    value = {"x": x, "y": np.arange(4), "s": np.float32(2.5), "tag": "batch", "n": 3}
    out = copier.copy(value, replica=0, gpu=1)
    assert out["tag"] == "batch" and out["n"] == 3
    for key in ("x", "y", "s"):
        assert isinstance(out[key], FakeGpuArray) and out[key].device_index == 1
        assert out[key].shape == np.shape(value[key])
        np.testing.assert_array_equal(out[key].get(), np.asarray(value[key]))
    assert out["y"].dtype == np.arange(4).dtype and out["s"].dtype == np.float32


def test_copier_orders_alloc_consumer_event_copy_and_hand_out(cuda, runtime):
    with cuda.Device(0):
        consumer = cuda.Stream()
    with consumer:  # the iterator is made while this stream is current
        copier = PrefetchCopier([0])
    cuda.log.clear()
    result: dict = {}

    def producer() -> None:  # the prefetch thread: its own current stream is the null one
        result["x"] = copier.copy((np.ones(3), np.zeros(2, np.int32)), 0, 0)
        result["events"] = copier.take_events()

    t = threading.Thread(target=producer)
    t.start()
    t.join()
    made = [e for e in cuda.log if e[0] == "stream"]
    assert len(made) == 1 and made[0][2] == 0  # one copy stream, on GPU 0
    copy_stream = made[0][1]
    log = [e for e in cuda.log if e[0] != "stream"]
    assert log[0] == ("pinned", 256 + 256)
    allocs = [e for e in log if e[0] == "alloc"]
    assert allocs == [("alloc", copy_stream, 0)] * 2  # in the copy stream's pool arena
    kinds = [e[0] for e in log]
    consumed = log[kinds.index("record")]
    assert consumed[2] == consumer.ptr  # recorded on the consumer stream...
    assert log[kinds.index("record") + 1] == ("wait", copy_stream, consumed[1])  # ...awaited
    h2d = [e for e in log if e[0] == "h2d"]
    assert h2d == [("h2d", copy_stream, 0)] * 2
    done = log[-1]
    assert done[0] == "record" and done[2] == copy_stream
    assert kinds.index("alloc") < kinds.index("record") < kinds.index("h2d")
    assert result["events"][0][0] == 0 and result["events"][0][1].id == done[1]
    assert copier.take_events() == []
    cuda.log.clear()
    with consumer:
        copier.hand_out(result["events"])
    assert cuda.log == [("wait", consumer.ptr, done[1])]
    assert not any(e[0] == "sync" for e in cuda.log)


def test_copier_reuses_a_pinned_buffer_only_after_its_copy(cuda, runtime):
    copier = PrefetchCopier([0])
    ids = []
    for step in range(streams._PINNED_SLOTS + 2):
        cuda.log.clear()
        out = copier.copy(np.full(8, step, np.float64), 0, 0)
        np.testing.assert_array_equal(out.get(), np.full(8, step))
        syncs = [e[1] for e in cuda.log if e[0] == "sync"]
        expected = [ids[step - streams._PINNED_SLOTS]] if step >= streams._PINNED_SLOTS else []
        assert syncs == expected
        ids.append(copier.take_events()[0][1].id)
    pinned = [e for e in cuda.log if e[0] == "pinned"]
    assert pinned == []  # the buffers were made in the first round and reused
    cuda.log.clear()
    copier.close()
    assert sorted(e[1] for e in cuda.log if e[0] == "sync") == sorted(ids[-streams._PINNED_SLOTS:])


def test_copier_grows_a_buffer_for_a_bigger_batch(cuda, runtime):
    copier = PrefetchCopier([0])
    copier.copy(np.zeros(4), 0, 0)
    copier.copy(np.zeros(4), 0, 0)
    copier.copy(np.zeros(4), 0, 0)
    cuda.log.clear()
    out = copier.copy(np.arange(1000.0), 0, 0)  # slot 0 again: wait for its copy, then grow
    kinds = [e[0] for e in cuda.log]
    assert kinds.index("sync") < kinds.index("pinned")
    np.testing.assert_array_equal(out.get(), np.arange(1000.0))


def test_distributed_dataset_prefetches_to_gpus_and_the_consumer_waits(cuda, runtime):
    x = np.arange(32, dtype=np.float32).reshape(16, 2)
    dist = distribute_dataset(
        Dataset.from_tensor_slices(x).batch(8), devices=["/gpu:0", "/gpu:1"]
    )
    it = iter(dist)
    assert it.reads_ahead
    steps = []
    waits_per_step = []
    for step in it:
        waits = [e for e in cuda.log if e[0] == "wait" and e[1] in (MAIN_NULL, MAIN_NULL + 1)]
        waits_per_step.append(sorted(w[1] for w in waits))
        cuda.log.clear()
        steps.append(step)
    assert len(steps) == 2
    for s, step in enumerate(steps):
        assert isinstance(step, PerReplica)
        for i, v in enumerate(step.values):
            assert isinstance(v, FakeGpuArray) and v.device_index == i
            np.testing.assert_array_equal(v.get(), x[8 * s + 4 * i : 8 * s + 4 * i + 4])
    # each step, the consumer's stream of each GPU waited for that GPU's copy
    assert waits_per_step == [[MAIN_NULL, MAIN_NULL + 1]] * 2


# -- NcclAllReduce -----------------------------------------------------------------------------


@pytest.fixture
def fake_nccl_provider():
    nccl.set_nccl_provider(fake_nccl)
    yield fake_nccl
    nccl.set_nccl_provider(None)


def pair(a: np.ndarray, b: np.ndarray) -> PerReplica:
    return PerReplica((fake(a, 0), fake(b, 1)))


@pytest.mark.parametrize("op", ["SUM", "MEAN", "MAX", "MIN"])
@pytest.mark.parametrize("dtype", [np.float32, np.int32, np.float16])
def test_nccl_route_matches_numpy(fake_nccl_provider, op, dtype):
    rng = np.random.default_rng(3)
    a, b = (rng.integers(-50, 50, size=(3, 4)).astype(dtype) for _ in range(2))
    ops = NcclAllReduce()
    before = fake_nccl.calls["allReduce"]
    out = ops.reduce(op, pair(a, b), ["/gpu:0", "/gpu:1"])
    assert ops.last_route == "nccl"
    assert fake_nccl.calls["allReduce"] == before + 2  # one call per GPU, in one group
    assert isinstance(out, Mirrored)
    expected = {
        "SUM": a + b,
        "MAX": np.maximum(a, b),
        "MIN": np.minimum(a, b),
        "MEAN": (a + b) / dtype(2) if np.dtype(dtype).kind == "f" else (a + b) / 2,
    }[op]
    for i, v in enumerate(out.values):
        assert v.device_index == i and v.shape == (3, 4)
        assert v.dtype == expected.dtype
        np.testing.assert_array_equal(v.get(), expected)


def test_nccl_route_follows_destination_order_and_reuses_its_group(fake_nccl_provider):
    ops = NcclAllReduce()
    before = fake_nccl.calls["initAll"]
    out = ops.reduce("SUM", pair(np.ones(2), np.full(2, 2.0)), ["/gpu:1", "/gpu:0"])
    assert [v.device_index for v in out.values] == [1, 0]
    assert [d.index for d in out._devices] == [1, 0]
    ops.batch_reduce("SUM", [(pair(np.ones(2), np.ones(2)), ["/gpu:0", "/gpu:1"])] * 2)
    assert fake_nccl.calls["initAll"] == before + 1
    ops.close()


@pytest.mark.parametrize(
    "values, dests",
    [
        ((fake(np.ones(2), 0), fake(np.ones(2), 1)), ["/gpu:0"]),  # not the values' GPUs
        ((fake(np.ones(2), 0), fake(np.ones(2), 1)), ["/gpu:0", "/gpu:2"]),
        ((fake(np.ones(2), 0), fake(np.ones(2), 1)), ["/cpu:0", "/cpu:1"]),
        ((fake(np.ones(2), 0), fake(np.ones(2), 0)), ["/gpu:0", "/gpu:1"]),  # one GPU twice
        ((fake(np.ones(2), 0), fake(np.ones(3), 1)), ["/gpu:0", "/gpu:1"]),  # shapes differ
        ((fake(np.ones(2), 0), fake(np.ones(2, np.float32), 1)), ["/gpu:0", "/gpu:1"]),
        ((fake(np.ones(2, bool), 0), fake(np.ones(2, bool), 1)), ["/gpu:0", "/gpu:1"]),
        ((fake(np.ones((2, 2)), 0), fake(np.ones((2, 2)), 1).T), ["/gpu:0", "/gpu:1"]),
    ],
)
def test_nccl_route_is_not_taken_where_it_does_not_apply(fake_nccl_provider, values, dests):
    from hpcdist.distribute.cross_device_ops import destination_devices

    assert NcclAllReduce()._nccl_reduce(hd.ReduceOp.SUM, values, destination_devices(dests)) is None


def test_nccl_route_needs_nccl():
    nccl.set_nccl_provider(None)  # the real one: no CuPy here
    if nccl.nccl_available()[0]:
        pytest.skip("NCCL is usable here")
    values = (fake(np.ones(2), 0), fake(np.ones(2), 1))
    dests = (parse_device("/gpu:0"), parse_device("/gpu:1"))
    assert NcclAllReduce()._nccl_reduce(hd.ReduceOp.SUM, values, dests) is None


def test_host_values_take_the_arithmetic_route_bitwise_like_reduction_to_one_device():
    rng = np.random.default_rng(0)
    per_replica = PerReplica(tuple(rng.normal(size=5).astype(np.float32) for _ in range(3)))
    ops = NcclAllReduce()
    out = ops.reduce("MEAN", per_replica, "/cpu:0")
    assert ops.last_route == "arithmetic"
    reference = ReductionToOneDevice().reduce("MEAN", per_replica, "/cpu:0")
    assert out.tobytes() == reference.tobytes()


def test_local_gpu_all_reduce_gives_each_replica_the_nccl_sum_on_its_gpu(
    gpu_strategy, fake_nccl_provider
):
    ext = gpu_strategy.extended
    a, b = np.arange(6, dtype=np.float32), np.full(6, 10, np.float32)
    c, d = np.ones(2, np.float64), np.full(2, 3.0)
    before = fake_nccl.calls["allReduce"]
    out = ext.local_gpu_all_reduce(hd.ReduceOp.SUM, [pair(a, b), pair(c, d)])
    assert ext._cross_device_ops.last_route == "nccl"
    assert fake_nccl.calls["allReduce"] == before + 4  # two leaves, one call per GPU each
    assert len(out) == 2
    for r, leaves in enumerate(out):
        assert [x.device_index for x in leaves] == [r, r]
        np.testing.assert_array_equal(leaves[0].get(), a + b)
        np.testing.assert_array_equal(leaves[1].get(), c + d)
    host = PerReplica((np.ones(2), np.ones(2)))
    assert ext.local_gpu_all_reduce(hd.ReduceOp.SUM, [pair(a, b), host]) is None
