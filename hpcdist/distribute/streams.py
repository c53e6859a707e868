"""CUDA streams and events for several GPUs in one process: replicas, merges, input prefetch.

``MirroredStrategy`` on ``k > 1`` local GPUs runs each replica in its own
thread on its own stream (:class:`ReplicaStreams`), so the replicas' kernels
can overlap. The threads meet at merge calls, where the calling (main)
thread runs the merge function on *its* current stream of each GPU. Events
order the two sides without any host synchronisation:

* **hand-off** (:meth:`ReplicaStreams.hand_off_all`, before the main thread
  runs a merge function and when the replicas return): an event is recorded
  on each replica stream, and the main thread's current stream of *every*
  GPU of the strategy waits for it. Every GPU, not only the replica's own:
  a merge function may read one replica's arrays from another GPU (a copy
  to the first device, a peer-to-peer reduction), and that copy runs on the
  main thread's stream of the other GPU.
* **hand-back** (:meth:`ReplicaStreams.hand_back_all`, after the merge
  result is handed to the replicas and before a run starts): an event is
  recorded on the main thread's current stream of every GPU and each
  replica stream waits for them, so a replica never reads a merge result
  (or an input the main thread prepared, or a variable it updated) early.

With one local replica there is no extra stream: the replica runs on the
caller's current stream of its GPU (``MultiWorkerMirroredStrategy`` with one
GPU per rank: the collectives engine enqueues on that stream too).

:class:`PrefetchCopier` copies host batches to GPUs for the input pipeline's
prefetch thread, on a side stream per GPU, from pinned memory, and gives each
copy an event that the consumer's stream waits for when the batch is handed
out (see the class for the memory-reuse rules).

CuPy (10 or later: its current stream is per thread *and* per device) is
reached only through :func:`cupy_module`, which tests replace with a fake;
nothing here imports it for CPU devices.

Example:
    >>> from hpcdist.distribute.devices import parse_device
    >>> rs = ReplicaStreams([parse_device("/cpu:0"), parse_device("/cpu:1")])
    >>> rs.gpus, rs.stream(0)
    ((), None)
"""

from __future__ import annotations

import contextlib
import threading
from collections import deque
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from hpcdist.arrays import is_array, to_device
from hpcdist.distribute import nest
from hpcdist.runtime.device import CupyRuntime

_ALIGN = 256  # bytes: where each leaf of a batch starts in a pinned staging buffer
_PINNED_SLOTS = 3  # staging buffers per replica: copies in flight before the producer waits


def cupy_module() -> Any:
    """The ``cupy`` module (imported here, on first use; tests replace this function).

    Example: ``cp = cupy_module(); cp.cuda.Stream(non_blocking=True)``.
    """
    import cupy  # lazy: optional GPU dependency (CuPy)

    return cupy


def _is_gpu(device: Any) -> bool:
    return getattr(device, "device_type", None) == "GPU"


class ReplicaStreams:
    """One non-blocking CUDA stream per local GPU replica, and the events between them.

    ``devices`` are the strategy's local devices (:class:`~hpcdist.distribute.devices.Device`,
    one per replica). Streams are made lazily, on the replica's GPU, the first
    time :meth:`stream` or :meth:`scope` asks for them; CPU devices get none
    and every method does nothing for them.

    Example:
        ``rs = ReplicaStreams(strategy.extended._devices)``; a replica thread runs
        ``with rs.scope(i): ...``; the coordinating thread calls ``rs.hand_off_all()``
        before a merge and ``rs.hand_back_all()`` after it.
    """

    def __init__(self, devices: Sequence[Any]) -> None:
        self._devices = tuple(devices)
        self._gpu_ids = tuple(i for i, d in enumerate(self._devices) if _is_gpu(d))
        self.gpus: tuple[int, ...] = tuple(sorted({self._devices[i].index for i in self._gpu_ids}))
        self._streams: dict[int, Any] = {}
        self._lock = threading.Lock()

    def stream(self, local_id: int) -> Any | None:
        """Replica ``local_id``'s stream (a ``cupy.cuda.Stream``), ``None`` for a CPU replica.

        Example: ``rs.stream(1).ptr`` is the raw ``cudaStream_t`` of replica 1.
        """
        device = self._devices[local_id]
        if not _is_gpu(device):
            return None
        stream = self._streams.get(local_id)
        if stream is None:
            with self._lock:
                stream = self._streams.get(local_id)
                if stream is None:
                    cp = cupy_module()
                    with cp.cuda.Device(device.index):  # a stream belongs to the current GPU
                        stream = cp.cuda.Stream(non_blocking=True)
                    self._streams[local_id] = stream
        return stream

    @contextlib.contextmanager
    def scope(self, local_id: int) -> Iterator[None]:
        """Make replica ``local_id``'s GPU and stream current in this thread (CPU: nothing).

        Example: ``with rs.scope(0): y = x * 2`` enqueues the kernel on replica 0's stream.
        """
        device = self._devices[local_id]
        if not _is_gpu(device):
            yield
            return
        stream = self.stream(local_id)
        assert stream is not None  # a GPU replica has a stream
        cp = cupy_module()
        with cp.cuda.Device(device.index), stream:
            yield

    def _main_streams(self, cp: Any) -> list[tuple[int, Any]]:
        """``(gpu, stream)``: the calling thread's current stream of each GPU."""
        out = []
        for gpu in self.gpus:
            with cp.cuda.Device(gpu):
                out.append((gpu, cp.cuda.get_current_stream()))
        return out

    def hand_off_from_replica(self, local_id: int) -> None:
        """Order the calling thread's later work on every GPU after replica ``local_id``'s work.

        Records an event on the replica's stream; the caller's current stream of
        each GPU of the strategy waits for it (on the GPU, no host wait).

        Example: ``rs.hand_off_from_replica(1)`` before reading replica 1's result.
        """
        self._hand_off([local_id])

    def hand_off_all(self) -> None:
        """:meth:`hand_off_from_replica` for every replica, with one wait per event and GPU.

        Example: ``rs.hand_off_all()`` before the main thread runs a merge function.
        """
        self._hand_off(self._gpu_ids)

    def _hand_off(self, local_ids: Sequence[int]) -> None:
        ids = [i for i in local_ids if _is_gpu(self._devices[i])]
        if not ids:
            return
        cp = cupy_module()
        events = []
        for i in ids:
            stream = self.stream(i)
            with cp.cuda.Device(self._devices[i].index):  # an event is recorded on its own GPU
                event = cp.cuda.Event(block=False, disable_timing=True)
                event.record(stream)
            events.append(event)
        for gpu, main in self._main_streams(cp):
            with cp.cuda.Device(gpu):  # a default-stream handle means the current GPU's
                for event in events:
                    main.wait_event(event)

    def hand_back_to_replica(self, local_id: int) -> None:
        """Order replica ``local_id``'s later work after the calling thread's work so far.

        Records an event on the caller's current stream of each GPU of the
        strategy; the replica's stream waits for them (no host wait).

        Example: ``rs.hand_back_to_replica(0)`` after handing replica 0 a merge result.
        """
        self._hand_back([local_id])

    def hand_back_all(self) -> None:
        """:meth:`hand_back_to_replica` for every replica (one event per GPU, shared).

        Example: ``rs.hand_back_all()`` after a merge and before a run starts.
        """
        self._hand_back(self._gpu_ids)

    def _hand_back(self, local_ids: Sequence[int]) -> None:
        ids = [i for i in local_ids if _is_gpu(self._devices[i])]
        if not ids:
            return
        cp = cupy_module()
        events = []
        for gpu, main in self._main_streams(cp):
            with cp.cuda.Device(gpu):
                event = cp.cuda.Event(block=False, disable_timing=True)
                event.record(main)
            events.append(event)
        for i in ids:
            stream = self.stream(i)
            assert stream is not None  # ids are GPU replicas
            for event in events:
                stream.wait_event(event)

    def __repr__(self) -> str:
        made = sorted(self._streams)
        return f"ReplicaStreams(gpus={list(self.gpus)}, streams made for replicas {made})"


def _default_runtime() -> Any:
    """The device runtime the prefetch copies use (CuPy's; tests replace this function)."""

    return CupyRuntime()


def _c_order(x: Any) -> np.ndarray:
    """``x`` as a C-contiguous NumPy array of its own shape (0-d stays 0-d)."""
    a = np.asarray(x)
    return a if a.flags.c_contiguous else a.copy(order="C")


class _Slot:
    """A pinned staging buffer and the event of the last copy that read it."""

    __slots__ = ("buffer", "event")

    def __init__(self) -> None:
        self.buffer: np.ndarray | None = None
        self.event: Any = None


class PrefetchCopier:
    """Host batches to GPUs for a prefetch thread: pinned staging, a side stream, an event.

    Made in the consumer's thread (the iterator's), which fixes the *consumer
    stream* of each GPU: the thread's current stream there. Then, in the
    producer (prefetch) thread, :meth:`copy` for each replica's batch, per GPU:

    1. allocates the device arrays *with the copy stream current*, so CuPy's
       memory pool gives them memory that only this stream reuses;
    2. records an event on the consumer stream and makes the copy stream wait
       for it: memory the consumer freed (an earlier batch) is rewritten only
       after the consumer's kernels enqueued before the free have run;
    3. copies each leaf into a pinned buffer (host ``memcpy``) and enqueues the
       host-to-device copy on the copy stream; records the copy's event.

    :meth:`hand_out` (consumer thread, when ``get_next`` returns the step) makes
    the consumer's current stream wait for those events: the batch's kernels
    never start before its bytes arrived, and the consumer never waits on the
    host. The producer waits on the host only to reuse a pinned buffer whose
    copy (``_PINNED_SLOTS`` batches ago) has not finished, and in :meth:`close`.

    A batch is safe on the stream that was current when it was handed out and
    on streams ordered after it (replica streams, through the strategy's
    hand-back at the start of ``run``). At the end of the data (:meth:`close`)
    the caller's thread waits once for the last copies, which themselves
    wait for the consumer's work enqueued before them. Not supported: a
    consumer on CuPy's per-thread default stream
    (``CUPY_CUDA_PER_THREAD_DEFAULT_STREAM=1``), whose handle means a different
    stream in the producer thread; use the legacy default or an explicit stream.

    Example: ``c = PrefetchCopier([0]); x_gpu = c.copy(x_host, 0, 0); c.hand_out(c.take_events())``.
    """

    def __init__(self, gpus: Sequence[int], runtime: Any = None) -> None:
        self._cp = cupy_module()
        self._rt = runtime if runtime is not None else _default_runtime()
        self._consumer: dict[int, Any] = {}
        for gpu in sorted(set(gpus)):
            with self._cp.cuda.Device(gpu):
                self._consumer[gpu] = self._cp.cuda.get_current_stream()
        self._copy_streams: dict[int, Any] = {}
        self._slots: dict[int, deque[_Slot]] = {}
        self._events: list[tuple[int, Any]] = []

    def _copy_stream(self, gpu: int) -> Any:
        stream = self._copy_streams.get(gpu)
        if stream is None:
            with self._cp.cuda.Device(gpu):
                stream = self._copy_streams[gpu] = self._cp.cuda.Stream(non_blocking=True)
        return stream

    def _slot(self, replica: int, nbytes: int) -> _Slot:
        """The least recently used staging buffer of ``replica``, free and at least ``nbytes``."""
        ring = self._slots.get(replica)
        if ring is None:
            ring = self._slots[replica] = deque(_Slot() for _ in range(_PINNED_SLOTS))
        slot = ring.popleft()
        ring.append(slot)
        if slot.event is not None:
            slot.event.synchronize()  # its previous copy must have read the buffer
            slot.event = None
        if slot.buffer is None or slot.buffer.nbytes < nbytes:
            slot.buffer = self._rt.pinned(nbytes)
        return slot

    def copy(self, value: Any, replica: int, gpu: int) -> Any:
        """``value`` (a nest of arrays) with its NumPy arrays copied to ``gpu``, asynchronously.

        Runs in the producer thread. Leaves that are not NumPy arrays or scalars
        stay as they are (CuPy arrays are moved synchronously, as before).

        Example: ``x_gpu = copier.copy(np.ones(4, np.float32), replica=0, gpu=0)``.
        """

        leaves = nest.flatten(value)
        host = []
        for j, x in enumerate(leaves):
            if isinstance(x, (np.ndarray, np.generic)) and x.dtype.kind in "biufc":
                host.append(j)
            elif is_array(x):
                leaves[j] = to_device(x, "GPU", gpu, copy=False)
        if not host:
            return nest.pack_sequence_as(value, leaves)
        arrays = [_c_order(leaves[j]) for j in host]
        offsets, total = [], 0
        for a in arrays:
            offsets.append(total)
            total += -(-a.nbytes // _ALIGN) * _ALIGN
        slot = self._slot(replica, total)
        assert slot.buffer is not None  # _slot gives a slot with a large enough buffer
        cp, rt = self._cp, self._rt
        stream = self._copy_stream(gpu)
        with cp.cuda.Device(gpu):
            with stream:  # the copy stream's pool arena: see the class docstring, step 1
                flats = [rt.empty(a.size, a.dtype, gpu) for a in arrays]
            consumed = cp.cuda.Event(block=False, disable_timing=True)
            consumed.record(self._consumer[gpu])
            stream.wait_event(consumed)
            for a, flat, off in zip(arrays, flats, offsets, strict=True):
                if a.nbytes == 0:
                    continue
                staged = slot.buffer[off : off + a.nbytes].view(a.dtype)
                np.copyto(staged, a.reshape(-1))
                rt.from_host(flat, staged, int(stream.ptr))
            done = cp.cuda.Event(block=False, disable_timing=True)
            done.record(stream)
        slot.event = done
        self._events.append((gpu, done))
        for j, a, flat in zip(host, arrays, flats, strict=True):
            leaves[j] = rt.view(flat, a.dtype, a.shape)
        return nest.pack_sequence_as(value, leaves)

    def take_events(self) -> list[tuple[int, Any]]:
        """The ``(gpu, event)`` of the copies made since the last call (producer thread).

        Example: ``step_events = copier.take_events()`` after copying one step's batches.
        """
        events, self._events = self._events, []
        return events

    def hand_out(self, events: Sequence[tuple[int, Any]]) -> None:
        """Make the calling thread's current stream of each GPU wait for ``events`` (no host wait).

        Example: ``copier.hand_out(step_events)`` in ``get_next``, before returning the step.
        """
        cp = self._cp
        for gpu, event in events:
            with cp.cuda.Device(gpu):
                cp.cuda.get_current_stream().wait_event(event)

    def close(self) -> None:
        """Wait until the staging buffers are no longer read (once, when the iterator ends).

        Call it after the producer thread has stopped. Example: ``copier.close()``.
        """
        for ring in self._slots.values():
            for slot in ring:
                if slot.event is not None:
                    slot.event.synchronize()
                    slot.event = None


__all__ = ["PrefetchCopier", "ReplicaStreams", "cupy_module"]
