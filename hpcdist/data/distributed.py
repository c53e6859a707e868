"""Distributed datasets: feed every replica its batches, and end together on every worker.

:func:`distribute_dataset` (what ``Strategy.experimental_distribute_dataset``
calls) takes a dataset batched by the global batch size and, in this order,

1. **rebatches** each global batch into one sub-batch per replica
   (:mod:`hpcdist.data.rebatch`: sizes differ by at most one, worker ``w``'s
   list rotated by ``w * R``; a partial batch is split the same way and
   replicas left without data get empty batches),
2. **shards** across workers by the dataset's ``AutoShardPolicy``
   (:mod:`hpcdist.data.autoshard`: FILE, DATA, AUTO, OFF, HINT),
3. **reads ahead** in a background thread where that helps, copying each
   replica's batch to its device (CuPy for GPU replicas); see *Reading ahead*.

:func:`distribute_datasets_from_function` calls ``dataset_fn(InputContext)``
once per worker (or per replica) and feeds what it returns as it is: a
``Dataset`` already batched per replica, or any Python iterable (a
generator, a PyTorch ``DataLoader``).

**End of data.** Workers may have different amounts of data (FILE sharding
with uneven files, uneven ``dataset_fn`` results). At every step each worker
tells the others whether it still has data, with one small all-reduce (MAX
of four int32 flags: has data, has elements, failed, cannot pad) through the
strategy's collectives engine. While any worker has data, all continue and
replicas without data get empty batches; when none has data, every worker
raises ``StopIteration`` at the same step. A step in which every replica of
every worker would get an empty batch is skipped. So a worker with fewer batches
never leaves the others waiting in a collective, and an error in one
worker's input pipeline is raised on every worker instead of hanging them.
With one worker there is no collective at all.

**Reading ahead.** With ``InputOptions.experimental_per_replica_buffer_size``
``n > 0`` (the default is 1) a daemon thread runs the local pipeline ahead of
the caller (never any MPI in it) when something waits outside the GIL, so
that the pipeline's work fills the wait:

* several workers: the caller waits in the end-of-data all-reduce every step
  (mpi4py releases the GIL in MPI calls), and the thread reads the next step
  meanwhile; with ``benchmarks/input_pipeline.py`` under ``mpirun -n 2`` the
  step read ahead is the faster one (the *Input pipeline* section of
  ``docs/performance.md`` has both step times);
* a stage that waits: a file reader (``read_npy``, ``read_npz``,
  ``read_hdf5``), a ``map`` with ``num_parallel_calls`` (a thread pool), a
  ``from_generator`` source, a ``dataset_fn`` result that is neither a
  ``Dataset`` nor a list or tuple (a generator, a ``DataLoader``: code that
  may wait on I/O or worker processes), or a node type hpcdist does not know;
* a copy to a GPU replica. The thread then copies each batch from pinned
  host memory on a side stream of its GPU, and the stream that is current
  in the caller's thread when ``get_next`` hands the batch out waits for
  that copy on the GPU (an event, no host wait): the copy overlaps the
  previous step's kernels and never races them
  (:class:`hpcdist.distribute.streams.PrefetchCopier`). Without the thread
  (``experimental_per_replica_buffer_size=0``) the copy is a plain
  synchronous one in the caller's thread.

Otherwise (one worker, arrays in memory: ``from_tensor_slices``, ``range``,
``shuffle``, ``batch``, a plain ``map`` or ``filter``...) each step is read in
the caller's thread when it is asked for. Its work is short and mostly holds
the GIL, so a thread has little to overlap, while handing a step from one
thread to another costs a thread switch, more than such a step's own work: the
thread made ``benchmarks/input_pipeline.py``'s one-worker distributed pipeline
slower than the same pipeline iterated directly. (Add
``.prefetch(n)`` to a dataset to give it a thread of its own anyway, e.g.
after a plain ``map`` that reads files.) ``n = 0`` never starts a thread. The
thread fills a buffer of ``n + 1`` steps; when the caller has used up the
steps it took, it takes every ready step at once (one handoff for several
steps), so at most ``2 * (n + 1)`` steps are read ahead.
:attr:`DistributedIterator.reads_ahead` says whether an iterator has the thread.

*Cost.* One ``Collectives.allreduce`` of 16 bytes per step with several
workers (the engine sends it as two tiny MPI all-reduces: its metadata check
and the data), so a step costs more than with one worker by about one small
engine all-reduce: mostly the engine's per-call overhead, not the 16 bytes
(``docs/performance.md``: *All-reduce* has the engine's and raw MPI's 4-byte
latency, *Input pipeline* the step times).

Example:
    >>> import numpy as np
    >>> from hpcdist.data.dataset import Dataset
    >>> dist = distribute_dataset(Dataset.range(4).batch(2), num_replicas_per_worker=2)
    >>> [[v.tolist() for v in x.values] for x in dist]
    [[[0], [1]], [[2], [3]]]
"""

from __future__ import annotations

import threading
import weakref
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from hpcdist.arrays import is_array, to_device
from hpcdist.data.autoshard import apply_autoshard
from hpcdist.data.dataset import Dataset, iteration_counts, set_iteration_counts
from hpcdist.data.options import AutoShardPolicy
from hpcdist.data.rebatch import (
    MAX_REPLICAS,
    batch_dim,
    empty_from_spec,
    empty_like_batch,
    find_global_batch_size,
    rebatch_steps,
    worker_sub_batches,
)
from hpcdist.data.small_batch import warn_if_batch_below_replicas
from hpcdist.distribute import nest
from hpcdist.distribute.devices import parse_device
from hpcdist.distribute.input_context import (
    InputContext,
    InputOptions,
    InputReplicationMode,
    check_input_options,
)
from hpcdist.distribute.streams import PrefetchCopier
from hpcdist.distribute.values import PerReplica, regroup
from hpcdist.errors import CheckpointError, DistributedInputError

_MISSING = object()  # a replica's slot in a step for which its pipeline had no data
_END = object()  # the producer's last item: the local pipeline is exhausted


# -- argument checks ---------------------------------------------------------------------


@dataclass(frozen=True)
class _Layout:
    num_workers: int
    worker_index: int
    num_replicas: int
    devices: tuple[tuple[str, int], ...]  # (device type, index) of each local replica
    collectives: Any


def _int(name: str, value: Any, minimum: int) -> int:
    if isinstance(value, bool) or not hasattr(value, "__index__"):
        raise TypeError(f"{name} must be an int, got {type(value).__name__} {value!r}")
    value = int(value.__index__())
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    return value


def _device_pair(device: Any) -> tuple[str, int]:
    if isinstance(device, str):
        device = parse_device(device)
    kind = getattr(device, "device_type", None)
    index = getattr(device, "index", None)
    if kind not in ("CPU", "GPU") or not isinstance(index, int):
        raise TypeError(
            f"a replica device must be a device string like '/gpu:0' or an hpcdist Device; "
            f"got {device!r}"
        )
    return kind, index


def _layout(
    num_workers: Any,
    worker_index: Any,
    num_replicas_per_worker: Any,
    collectives: Any,
    devices: Sequence[Any] | None,
) -> _Layout:
    w_count = _int("num_workers", num_workers, 1)
    w = _int("worker_index", worker_index, 0)
    if w >= w_count:
        raise ValueError(
            f"worker_index is {w} but there are {w_count} workers; expected "
            f"0 <= worker_index < {w_count}"
        )
    if num_replicas_per_worker is None:
        num_replicas_per_worker = 1 if devices is None else len(devices)
    r = _int("num_replicas_per_worker", num_replicas_per_worker, 1)
    if w_count * r > MAX_REPLICAS:
        raise ValueError(
            f"num_workers * num_replicas_per_worker is {w_count} * {r} replicas, more than "
            f"{MAX_REPLICAS:,}; check the arguments for a typo"
        )
    if devices is None:
        pairs = (("CPU", 0),) * r
    else:
        pairs = tuple(_device_pair(d) for d in devices)
        if len(pairs) != r:
            raise ValueError(
                f"num_replicas_per_worker is {r} but {len(pairs)} devices were given; "
                "give one device per local replica"
            )
    if w_count > 1:
        if collectives is None:
            raise ValueError(
                f"with {w_count} workers the distributed input needs collectives (the "
                "strategy's hpcdist.collectives.Collectives over the workers) to agree on "
                "the end of the data; got None"
            )
        size = getattr(collectives, "size", w_count)
        if size != w_count:
            raise ValueError(
                f"the collectives span {size} ranks but num_workers is {w_count}; pass the "
                "collectives engine of the workers that read this dataset"
            )
    return _Layout(w_count, w, r, pairs, collectives if w_count > 1 else None)


# -- the local stream of steps -----------------------------------------------------------


class _Step:
    """One step of this worker's pipeline: a value (or ``_MISSING``) per local replica."""

    __slots__ = ("values", "template", "has_elements", "missing", "bare", "events")

    def __init__(
        self,
        values: list[Any],
        template: Any,
        has_elements: bool,
        missing: bool,
        bare: bool,
        events: list[Any] | None = None,
    ) -> None:
        self.values = values
        self.template = template  # an empty host batch shaped like the values, or None
        self.has_elements = has_elements
        self.missing = missing  # some replica has no value in this step
        self.bare = bare  # every value is a NumPy array (no nest to regroup)
        self.events = events  # (gpu, event) of copies still in flight (prefetch to GPU)


class _Failure:
    __slots__ = ("error",)

    def __init__(self, error: BaseException) -> None:
        self.error = error


def _host_template(value: Any) -> Any:
    try:
        return empty_like_batch(value)
    except Exception:  # noqa: BLE001 - no batch dimension: this stream cannot pad
        return None


def _closing(iterator: Iterator[Any]) -> None:
    close = getattr(iterator, "close", None)
    if callable(close):
        close()


def _rows(value: Any) -> int:
    if type(value) is np.ndarray and value.ndim:
        return value.shape[0]
    return batch_dim(value)


def _steps(
    groups: Callable[[], Iterator[list[Any]]],
    num_replicas: int,
    place: Callable[[int, Any], Any] | None,
    count_elements: bool,
    copier: Any = None,
) -> Iterator[_Step]:
    """Steps from ``groups()`` (lists of up to R values, ``_MISSING`` allowed), placed.

    With a ``copier`` (a :class:`~hpcdist.distribute.streams.PrefetchCopier`
    behind ``place``) each step carries the events of its copies.
    """
    template = None
    it = groups()
    try:
        for group in it:
            values = list(group)
            if len(values) < num_replicas:
                values += [_MISSING] * (num_replicas - len(values))
            has_elements = missing = False
            bare = True
            for v in values:
                if v is _MISSING:
                    missing = True
                    continue
                if template is None:
                    template = _host_template(v)
                if not has_elements:
                    has_elements = _rows(v) > 0 if count_elements else True
                if type(v) is not np.ndarray:
                    bare = False
            if place is not None:
                values = [v if v is _MISSING else place(i, v) for i, v in enumerate(values)]
                bare = False
            events = copier.take_events() if copier is not None else None
            yield _Step(values, template, has_elements, missing, bare, events)
    finally:
        _closing(it)


def _placer(
    layout: _Layout, options: InputOptions, copier: Any = None
) -> Callable[[int, Any], Any] | None:
    """What copies a replica's batch to its device; ``None`` when nothing needs copying.

    With a ``copier`` (the prefetch thread's) the copies are asynchronous.
    """
    fetch = options.experimental_fetch_to_device
    fetch = fetch and not options.experimental_place_dataset_on_device
    if not fetch or all(kind == "CPU" for kind, _ in layout.devices):
        return None
    if copier is not None:

        def place_async(i: int, value: Any) -> Any:
            kind, index = layout.devices[i]
            return value if kind != "GPU" else copier.copy(value, i, index)

        return place_async

    def place(i: int, value: Any) -> Any:
        kind, index = layout.devices[i]
        if kind != "GPU":
            return value
        return nest.map_structure(
            lambda x: to_device(x, "GPU", index, copy=False) if is_array(x) else x, value
        )

    return place


def _sub_batch_steps(
    elements: Iterator[Any], num_workers: int, r: int, worker_index: int, own: bool
) -> Iterator[list[Any]]:
    """:func:`~hpcdist.data.rebatch.rebatch_steps`, with the cuts of a NumPy batch cached.

    The rows each sub-batch takes depend only on the batch size, so they are
    worked out once per size (by :func:`worker_sub_batches` itself, on an
    index array) and a NumPy batch is then cut with plain slices.
    """
    cuts: dict[int, list[slice]] = {}
    try:
        for element in elements:
            if type(element) is np.ndarray and element.ndim:
                cut = cuts.get(element.shape[0])
                if cut is None:
                    cut = cuts[element.shape[0]] = _cuts(
                        element.shape[0], num_workers, r, worker_index, own
                    )
                pieces = [element[c] for c in cut]
            else:
                pieces = worker_sub_batches(
                    element, num_workers, r, worker_index, own_part_only=own
                )
            if len(pieces) == r:
                yield pieces
            else:
                for i in range(0, len(pieces), r):
                    yield pieces[i : i + r]
    finally:
        _closing(elements)


def _cuts(b: int, num_workers: int, r: int, worker_index: int, own: bool) -> list[slice]:
    """The row ranges :func:`worker_sub_batches` takes from a batch of ``b`` rows."""
    rows = worker_sub_batches(np.arange(b), num_workers, r, worker_index, own_part_only=own)
    return [slice(int(p[0]), int(p[0]) + len(p)) if len(p) else slice(0, 0) for p in rows]


# -- reading ahead -------------------------------------------------------------------------


def _waits_outside_gil(node: Any) -> bool:
    """Whether a pipeline node may wait on I/O, threads or processes (see the module doc).

    Each node type says so itself (``Dataset.releases_gil``; a ``map`` with a thread
    pool decides per instance); a node without the attribute is assumed to wait.
    """
    check = getattr(node, "_waits_outside_gil", None)
    return bool(check()) if callable(check) else True


def _read_ahead_helps(sources: Sequence[Any], layout: _Layout, options: InputOptions) -> bool:
    """Whether a reading-ahead thread can overlap waits in the caller's work."""
    if options.experimental_per_replica_buffer_size == 0:
        return False
    if layout.num_workers > 1:
        return True  # the caller waits in the end-of-data all-reduce (MPI frees the GIL)
    if _placer(layout, options) is not None:
        return True  # copies to a GPU

    for source in sources:
        if isinstance(source, Dataset):
            node: Any = source
            while node is not None:
                if _waits_outside_gil(node):
                    return True
                node = node._input
        elif not isinstance(source, (list, tuple)):
            return True  # a generator, a DataLoader: it may wait on I/O or processes
    return False


class _Prefetcher:
    """Runs the local pipeline in a daemon thread, up to ``depth`` steps ahead (never MPI).

    The caller takes every ready step at once when it has used up the ones it
    took before, so one handoff between the threads serves several steps.
    """

    def __init__(self, steps: Iterator[_Step], depth: int) -> None:
        self._depth = depth
        self._ready: deque[Any] = deque()  # filled by the thread, under _cond
        self._taken: deque[Any] = deque()  # the caller's steps, no lock needed
        self._cond = threading.Condition()
        self._stopped = False
        self.thread = threading.Thread(
            target=self._produce, args=(steps,), name="hpcdist-input-prefetch", daemon=True
        )
        self.thread.start()

    def _put(self, item: Any) -> bool:
        cond = self._cond
        with cond:
            while len(self._ready) >= self._depth and not self._stopped:
                cond.wait()
            if self._stopped:
                return False
            self._ready.append(item)
            cond.notify()
        return True

    def _produce(self, steps: Iterator[_Step]) -> None:
        try:
            for step in steps:
                if not self._put(step):
                    return
            self._put(_END)
        except BaseException as error:  # noqa: BLE001 - handed to the consumer, raised there
            self._put(_Failure(error))
        finally:
            _closing(steps)

    def get(self) -> Any:
        if self._taken:
            return self._taken.popleft()
        cond = self._cond
        with cond:
            while not self._ready:
                if not cond.wait(timeout=0.5) and not self.thread.is_alive() and not self._ready:
                    return _Failure(RuntimeError("the input prefetch thread stopped unexpectedly"))
            self._taken, self._ready = self._ready, self._taken  # all ready steps at once
            cond.notify()
        return self._taken.popleft()

    def close(self) -> None:
        with self._cond:
            self._stopped = True
            self._ready.clear()
            self._cond.notify_all()  # wakes a producer waiting on a full buffer
        self._taken.clear()
        if self.thread is not threading.current_thread():
            self.thread.join(timeout=1.0)


def _close_all(source: Any, copier: Any) -> None:
    """Stop the prefetch thread, then wait until its staging buffers are read."""
    source.close()
    copier.close()


class _Synchronous:
    """The local pipeline read in the caller's thread, one step when it is asked for."""

    thread = None

    def __init__(self, steps: Iterator[_Step]) -> None:
        self._next = steps.__next__
        self._steps = steps

    def get(self) -> Any:
        try:
            return self._next()
        except StopIteration:
            return _END
        except Exception as error:  # noqa: BLE001 - agreed on with the other workers first
            return _Failure(error)

    def close(self) -> None:
        _closing(self._steps)


# -- public classes ----------------------------------------------------------------------


class OptionalValue:
    """A value that may be absent (``tf.experimental.Optional``), from ``get_next_as_optional``.

    Named ``OptionalValue`` so that it does not shadow ``typing.Optional``; the
    TF name stays importable as ``hpcdist.data.distributed.Optional``.

    Example:
        >>> o = OptionalValue.from_value(3)
        >>> o.has_value(), o.get_value(), OptionalValue.empty(None).has_value()
        (True, 3, False)
    """

    def __init__(self, value: Any = _MISSING, element_spec: Any = None) -> None:
        self._value = value
        self._element_spec = element_spec

    @staticmethod
    def from_value(value: Any, element_spec: Any = None) -> OptionalValue:
        """An ``OptionalValue`` holding ``value``."""
        return OptionalValue(value, element_spec)

    @staticmethod
    def empty(element_spec: Any) -> OptionalValue:
        """An ``OptionalValue`` without a value."""
        return OptionalValue(_MISSING, element_spec)

    def has_value(self) -> bool:
        """Whether a value is present."""
        return self._value is not _MISSING

    def get_value(self) -> Any:
        """The value; ``ValueError`` when there is none (check :meth:`has_value` first)."""
        if self._value is _MISSING:
            raise ValueError(
                "this OptionalValue has no value: the distributed dataset is exhausted on every "
                "worker; check has_value() before get_value()"
            )
        return self._value

    @property
    def element_spec(self) -> Any:
        """The spec of the value (the distributed dataset's ``element_spec``)."""
        return self._element_spec

    def __repr__(self) -> str:
        return f"OptionalValue({'empty' if self._value is _MISSING else repr(self._value)})"


#: ``tf.experimental.Optional``'s name, kept for code that imports it from here.
Optional = OptionalValue


class DistributedDataset:
    """A dataset whose elements are per-replica values (``tf.distribute.DistributedDataset``).

    Iterate it (``for x in dist``: one :class:`DistributedIterator` per loop,
    i.e. per epoch) and pass each ``x`` to ``strategy.run``. No more
    transformations can be added. Made by :func:`distribute_dataset` and
    :func:`distribute_datasets_from_function`.

    Example:
        >>> from hpcdist.data.dataset import Dataset
        >>> dist = distribute_dataset(Dataset.range(3).batch(3))
        >>> [x.tolist() for x in dist]
        [[0, 1, 2]]
    """

    def __init__(
        self,
        groups: Callable[[], Iterator[list[Any]]],
        layout: _Layout,
        options: InputOptions,
        element_spec: Any,
        *,
        count_elements: bool,
        auto_shard_policy: AutoShardPolicy | None = None,
        read_ahead: bool = True,
        sources: Sequence[Any] = (),
    ) -> None:
        self._groups = groups
        self._sources = list(sources)  # the pipelines whose iteration counters a checkpoint keeps
        self._layout = layout
        self._options = options
        self._replica_spec = element_spec
        self._count_elements = count_elements
        self._auto_shard_policy = auto_shard_policy
        self._read_ahead = bool(read_ahead) and options.experimental_per_replica_buffer_size > 0

    def __iter__(self) -> DistributedIterator:
        return DistributedIterator(self)

    @property
    def element_spec(self) -> Any:
        """The spec of one step's value: a ``PerReplica`` of the per-replica specs per leaf
        (the plain per-replica spec with one local replica; ``None`` when a
        ``dataset_fn`` returned a plain Python iterable)."""
        return _distributed_spec(self._replica_spec, self._layout.num_replicas)

    @property
    def auto_shard_policy(self) -> AutoShardPolicy | None:
        """The sharding in effect (FILE, DATA or OFF); ``None`` for ``dataset_fn`` input."""
        return self._auto_shard_policy

    @property
    def sources(self) -> list[Any]:
        """The input pipelines whose iteration counters a checkpoint keeps."""
        return self._sources

    def __repr__(self) -> str:
        lay = self._layout
        return (
            f"<DistributedDataset worker={lay.worker_index}/{lay.num_workers} "
            f"replicas_per_worker={lay.num_replicas}>"
        )


class DistributedIterator:
    """An iterator over a :class:`DistributedDataset` (``tf.distribute.DistributedIterator``).

    :meth:`get_next` gives one step: a ``PerReplica`` of the local replicas'
    batches (the plain batch with one local replica). Every worker must call
    it the same number of times (as every worker calls ``strategy.run``):
    with several workers each call makes one small collective. Whether a
    background thread reads ahead is :attr:`reads_ahead` (see the module
    docstring: with several workers, or a pipeline stage that waits outside the GIL).

    Example:
        >>> from hpcdist.data.dataset import Dataset
        >>> it = iter(distribute_dataset(Dataset.range(4).batch(2)))
        >>> it.get_next().tolist(), it.get_next_as_optional().get_value().tolist()
        ([0, 1], [2, 3])
        >>> it.get_next_as_optional().has_value()
        False
    """

    def __init__(self, dataset: DistributedDataset) -> None:
        self._dataset = dataset
        self._layout = dataset._layout
        self._agreeing = self._layout.collectives is not None

        self._per_replica = PerReplica
        self._start()

    def _start(self) -> None:
        dataset, layout = self._dataset, self._layout
        # Before anything iterates: the counters this iteration will use (for checkpoints).
        self._counts = [iteration_counts(s) for s in dataset._sources]
        self._steps_taken = 0
        self._copier = None
        if dataset._read_ahead and _placer(layout, dataset._options) is not None:
            gpus = [index for kind, index in layout.devices if kind == "GPU"]
            self._copier = PrefetchCopier(gpus)  # in this (the consumer's) thread: its streams
        steps = _steps(
            dataset._groups,
            layout.num_replicas,
            _placer(layout, dataset._options, self._copier),
            dataset._count_elements,
            self._copier,
        )
        depth = dataset._options.experimental_per_replica_buffer_size
        self._source: _Prefetcher | _Synchronous = (
            _Prefetcher(steps, depth + 1) if dataset._read_ahead else _Synchronous(steps)
        )
        if self._copier is None:
            self._finalizer: weakref.finalize[..., DistributedIterator] = weakref.finalize(
                self, self._source.close
            )
        else:
            self._finalizer = weakref.finalize(self, _close_all, self._source, self._copier)
        self._template: Any = None
        self._local_done = False
        self._done = False

    # -- checkpoints (hpcdist.checkpoint's state protocol)
    def _checkpoint_state(self) -> tuple[dict[str, np.ndarray], dict]:
        """No arrays; meta = the pipelines' iteration counters and the steps given so far.

        Example: ``Checkpoint(iterator=it).save(prefix)`` calls it on every worker.
        """
        return {}, {"counts": self._counts, "steps": self._steps_taken, "done": self._done}

    def _restore_checkpoint_state(self, arrays: dict[str, np.ndarray], meta: dict) -> None:
        """Restart at the saved position: same counters, then skip the steps already given.

        The skipped steps are read again (and agreed on, like any step) but not
        returned, so the pipeline must be deterministic: seeded shuffles, no
        ``seed=None``. Every worker restores at the same time, as it saves.

        Example: ``Checkpoint(iterator=iter(dist)).restore(path)``.
        """
        try:
            counts, steps, done = meta["counts"], int(meta["steps"]), bool(meta["done"])
            if not isinstance(counts, list) or len(counts) != len(self._dataset._sources):
                raise ValueError(f"{len(self._dataset._sources)} pipelines, counts {counts!r}")
            if steps < 0:
                raise ValueError(f"steps is {steps}")
        except (KeyError, TypeError, ValueError) as error:
            raise CheckpointError(
                f"the saved iterator state {meta!r} does not fit this iterator ({error}); "
                "restore into an iterator of the same distributed dataset"
            ) from None
        self._finalizer()
        for source, saved in zip(self._dataset._sources, counts, strict=True):
            set_iteration_counts(source, saved)
        self._start()
        for _ in range(steps):
            if self._advance() is _MISSING:
                raise CheckpointError(
                    f"the input pipeline ended after {self._steps_taken} of the {steps} steps "
                    "the checkpoint had already taken: it is not the same data"
                )
            self._steps_taken += 1
        if done:
            self._finish()

    # -- TF's API
    def get_next(self) -> Any:
        """The next step's per-replica batches; ``StopIteration`` on every worker at the end."""
        value = self._advance()
        if value is _MISSING:
            raise StopIteration
        self._steps_taken += 1
        return value

    def get_next_as_optional(self) -> OptionalValue:
        """The next step as an :class:`OptionalValue`, empty (not an error) at the end."""
        value = self._advance()
        if value is not _MISSING:
            self._steps_taken += 1
        spec = self.element_spec
        return (
            OptionalValue.empty(spec)
            if value is _MISSING
            else OptionalValue.from_value(value, spec)
        )

    @property
    def element_spec(self) -> Any:
        """The spec of :meth:`get_next`'s value (as the dataset's ``element_spec``)."""
        return self._dataset.element_spec

    def __iter__(self) -> DistributedIterator:
        return self

    def __next__(self) -> Any:
        return self.get_next()

    @property
    def reads_ahead(self) -> bool:
        """Whether a background thread reads this worker's pipeline ahead of :meth:`get_next`.

        ``False`` means each step is read in the caller's thread when asked for.
        """
        return self._source.thread is not None

    def close(self) -> None:
        """Stop reading: the background thread (if any) ends now and the pipeline is closed.

        It also happens at the end of the data and when the iterator is collected.
        """
        self._finalizer()

    # -- the agreed step
    def _local(self) -> tuple[_Step | None, BaseException | None]:
        if self._local_done:
            return None, None
        item = self._source.get()
        if item is _END or isinstance(item, _Failure):
            self._local_done = True
            self._finalizer()
            return None, item.error if isinstance(item, _Failure) else None
        if item.template is not None:
            self._template = item.template
        return item, None

    def _agree(self, flags: list[bool]) -> Any:
        """The flags OR-ed over all workers: one tiny MAX all-reduce (none with one worker)."""
        if self._layout.collectives is None:
            return flags
        mine = np.array(flags, dtype=np.int32)
        return self._layout.collectives.allreduce([mine], "MAX")[0].tolist()

    def _empty_batch(self) -> Any:
        if self._template is None and self._dataset._replica_spec is not None:
            try:
                self._template = empty_from_spec(self._dataset._replica_spec)
            except Exception:  # noqa: BLE001 - no usable spec: reported as cannot pad
                self._template = None
        return self._template

    def _advance(self) -> Any:
        while not self._done:
            step, error = self._local()
            if step is None:
                has_data = has_elements = False
                cannot_pad = self._agreeing and self._empty_batch() is None
            else:
                has_data, has_elements = True, step.has_elements
                cannot_pad = step.missing and self._empty_batch() is None
            failed = error is not None
            if self._agreeing:
                flags = self._agree([has_data, has_elements, failed, cannot_pad])
                has_data, has_elements, failed, cannot_pad = (bool(f) for f in flags)
            if failed:
                self._finish()
                if error is not None:
                    raise error
                raise DistributedInputError(
                    "the input pipeline of another worker raised an error (see that worker's "
                    "output); this worker stops at the same step so that no worker hangs"
                )
            if not has_data:
                self._finish()
                return _MISSING
            if cannot_pad:
                self._finish()
                raise DistributedInputError(
                    "some replicas ran out of data while others still had some, and the "
                    "empty batch they should get could not be made: the elements have no "
                    "batch dimension (and no element_spec is known). Give every worker the "
                    "same number of batches, or yield arrays of rank >= 1"
                )
            if has_elements:
                return self._assemble(step)
        return _MISSING

    def _assemble(self, step: _Step | None) -> Any:
        r = self._layout.num_replicas
        if step is not None and step.events:
            self._copier.hand_out(step.events)  # type: ignore[union-attr]
        if step is not None and not step.missing:
            values, bare = step.values, step.bare
        else:
            values = step.values if step is not None else [_MISSING] * r
            values = [self._pad(i) if v is _MISSING else v for i, v in enumerate(values)]
            bare = all(type(v) is np.ndarray for v in values)
        if r == 1:
            return values[0]
        if bare:
            return self._per_replica(values)  # what regroup gives for bare arrays, without its walk

        return regroup(values, always_wrap=True)

    def _pad(self, i: int) -> Any:
        kind, index = self._layout.devices[i]
        empty = self._empty_batch()
        options = self._dataset._options
        if kind == "GPU" and options.experimental_fetch_to_device:
            return nest.map_structure(
                lambda x: to_device(x, "GPU", index) if is_array(x) else x, empty
            )
        return nest.map_structure(lambda x: x.copy() if isinstance(x, np.ndarray) else x, empty)

    def _finish(self) -> None:
        self._done = True
        self._local_done = True
        self._finalizer()


def _distributed_spec(spec: Any, num_replicas: int) -> Any:
    if spec is None or num_replicas == 1:
        return spec

    return nest.map_structure(lambda s: PerReplica((s,) * num_replicas), spec)


def _unbatched_first_dim(spec: Any) -> Any:
    def loosen(s: Any) -> Any:
        shape = tuple(getattr(s, "shape", ()))
        if not shape:
            return s
        loose = (None, *shape[1:])
        try:
            return replace(s, shape=loose)
        except TypeError:  # not a dataclass: rebuild it from shape and dtype
            return type(s)(loose, s.dtype)

    return nest.map_structure(loosen, spec)


# -- the entry points ----------------------------------------------------------------------


def worker_batches(
    dataset: Any,
    num_workers: int,
    worker_index: int,
    num_replicas_per_worker: int,
    policy: AutoShardPolicy | int | str | None = None,
) -> Iterator[list[Any]]:
    """Worker ``worker_index``'s local sub-batches, one list of ``R`` per step (no MPI).

    This is what :func:`distribute_dataset` feeds on that worker before the
    end-of-data agreement (which adds empty steps for a worker that ends
    early). ``policy`` overrides the dataset's ``auto_shard_policy``. Useful
    to check sharding in one process by running every ``worker_index``.

    Example:
        >>> from hpcdist.data.dataset import Dataset
        >>> steps = worker_batches(Dataset.range(8).batch(4), 2, 1, 1, policy="DATA")
        >>> [[b.tolist() for b in step] for step in steps]
        [[[2, 3]], [[6, 7]]]
    """
    w_count = _int("num_workers", num_workers, 1)
    r = _int("num_replicas_per_worker", num_replicas_per_worker, 1)
    find_global_batch_size(dataset)
    plan = apply_autoshard(dataset, w_count, worker_index, policy)
    own = plan.policy is AutoShardPolicy.DATA
    it = iter(plan.dataset)
    try:
        yield from rebatch_steps(it, w_count, r, worker_index, own_part_only=own)
    finally:
        _closing(it)


def distribute_dataset(
    dataset: Any,
    *,
    num_workers: int = 1,
    worker_index: int = 0,
    num_replicas_per_worker: int | None = None,
    collectives: Any = None,
    devices: Sequence[Any] | None = None,
    options: InputOptions | None = None,
) -> DistributedDataset:
    """``dataset`` (batched by the global batch size) distributed over all replicas.

    What ``Strategy.experimental_distribute_dataset(dataset, options)`` does
    with the strategy's layout: ``num_workers`` workers (``collectives``, the
    strategy's engine, joins them; ``None`` with one worker), this being
    ``worker_index``, with ``num_replicas_per_worker`` replicas on ``devices``
    (default: one CPU replica per device given, else one). See the module
    docstring for the rebatch, shard, prefetch order and the end of data.

    Raises ``ValueError`` for a dataset without ``.batch()`` and for FILE
    sharding with fewer files than workers; ``NotImplementedError`` for
    ``InputReplicationMode.PER_REPLICA`` options.

    Example:
        >>> from hpcdist.data.dataset import Dataset
        >>> dist = distribute_dataset(Dataset.range(4).batch(2), num_replicas_per_worker=2)
        >>> [[(v * 2).tolist() for v in x.values] for x in dist]
        [[[0], [2]], [[4], [6]]]
    """
    opts = check_input_options(options, from_function=False)
    layout = _layout(num_workers, worker_index, num_replicas_per_worker, collectives, devices)
    replicas = layout.num_workers * layout.num_replicas
    warn_if_batch_below_replicas(find_global_batch_size(dataset), replicas, layout.worker_index)
    plan = apply_autoshard(dataset, layout.num_workers, layout.worker_index)
    own = plan.policy is AutoShardPolicy.DATA
    source = plan.dataset

    def groups() -> Iterator[list[Any]]:
        return _sub_batch_steps(
            iter(source), layout.num_workers, layout.num_replicas, layout.worker_index, own
        )

    spec = _unbatched_first_dim(getattr(dataset, "element_spec", None))
    return DistributedDataset(
        groups,
        layout,
        opts,
        spec,
        count_elements=True,
        auto_shard_policy=plan.policy,
        read_ahead=_read_ahead_helps([source], layout, opts),
        sources=[source],
    )


def _per_worker_groups(source: Iterable[Any], r: int) -> Callable[[], Iterator[list[Any]]]:
    def groups() -> Iterator[list[Any]]:
        it = iter(source)
        try:
            group: list[Any] = []
            for element in it:
                group.append(element)
                if len(group) == r:
                    yield group
                    group = []
            if group:
                yield group
        finally:
            _closing(it)

    return groups


def _per_replica_groups(sources: list[Iterable[Any]]) -> Callable[[], Iterator[list[Any]]]:
    def groups() -> Iterator[list[Any]]:
        its: list[Iterator[Any] | None] = [iter(s) for s in sources]
        try:
            while True:
                group: list[Any] = []
                for i, it in enumerate(its):
                    value = _MISSING
                    if it is not None:
                        value = next(it, _MISSING)
                        if value is _MISSING:
                            _closing(it)
                            its[i] = None
                    group.append(value)
                if all(v is _MISSING for v in group):
                    return
                yield group
        finally:
            for it in its:
                if it is not None:
                    _closing(it)

    return groups


def _check_iterable(result: Any) -> Any:
    if not hasattr(result, "__iter__"):
        raise TypeError(
            f"dataset_fn must return a Dataset or an iterable of per-replica batches (a "
            f"generator, a DataLoader); it returned {type(result).__name__}"
        )
    return result


def distribute_datasets_from_function(
    dataset_fn: Callable[[InputContext], Any],
    *,
    num_workers: int = 1,
    worker_index: int = 0,
    num_replicas_per_worker: int | None = None,
    collectives: Any = None,
    devices: Sequence[Any] | None = None,
    options: InputOptions | None = None,
) -> DistributedDataset:
    """The per-replica batches of the datasets ``dataset_fn`` builds, over all replicas.

    What ``Strategy.distribute_datasets_from_function(dataset_fn, options)``
    does with the strategy's layout (arguments as in :func:`distribute_dataset`).
    With ``PER_WORKER`` replication (the default) ``dataset_fn`` is called
    once, with ``InputContext(num_workers, worker_index, num_replicas_in_sync)``;
    its result, already batched per replica and sharded as the function
    chooses, feeds the local replicas in turns: each step takes ``R``
    consecutive elements. With ``PER_REPLICA`` it is called once per local
    replica (``InputContext(W * R, w * R + i, W * R)``) and each replica reads
    its own. Nothing is rebatched or sharded. The result may be a plain
    iterable; a generator is consumed by the first epoch, so pass something
    iterable again (a list, a DataLoader) to run several epochs.

    Example:
        >>> import numpy as np
        >>> def dataset_fn(ctx):
        ...     n = ctx.get_per_replica_batch_size(4)
        ...     return [np.full(n, i) for i in range(4)]
        >>> dist = distribute_datasets_from_function(dataset_fn, num_replicas_per_worker=2)
        >>> [[v.tolist() for v in x.values] for x in dist]
        [[[0, 0], [1, 1]], [[2, 2], [3, 3]]]
    """
    if not callable(dataset_fn):
        raise TypeError(f"dataset_fn must be callable, got {type(dataset_fn).__name__}")
    opts = check_input_options(options, from_function=True)
    layout = _layout(num_workers, worker_index, num_replicas_per_worker, collectives, devices)
    w_count, w, r = layout.num_workers, layout.worker_index, layout.num_replicas
    if opts.experimental_replication_mode is InputReplicationMode.PER_REPLICA:
        results = [
            _check_iterable(dataset_fn(InputContext(w_count * r, w * r + i, w_count * r)))
            for i in range(r)
        ]
        groups = _per_replica_groups(results)
        spec = getattr(results[0], "element_spec", None)
    else:
        results = [_check_iterable(dataset_fn(InputContext(w_count, w, w_count * r)))]
        groups = _per_worker_groups(results[0], r)
        spec = getattr(results[0], "element_spec", None)
    read_ahead = _read_ahead_helps(results, layout, opts)
    return DistributedDataset(
        groups, layout, opts, spec, count_elements=False, read_ahead=read_ahead, sources=results
    )


__all__ = [
    "DistributedDataset",
    "DistributedInputError",
    "DistributedIterator",
    "Optional",
    "OptionalValue",
    "distribute_dataset",
    "distribute_datasets_from_function",
    "worker_batches",
]
