"""What ``schedule`` returns, and the values that have one component per worker.

* :class:`RemoteValue`: the future result of one scheduled function.
* :class:`PerWorkerValues`: one value per worker; a scheduled function that takes
  one gets the component of the worker it runs on.
* :class:`PerWorkerDataset` / :class:`PerWorkerIterator`: what
  ``create_per_worker_dataset`` and ``iter()`` of it give. Each worker builds its
  own dataset (lazily, the first time a scheduled function reads it); the chief
  holds placeholders and never calls ``dataset_fn``.

Example:
    >>> pw = PerWorkerValues(("a", "b"))
    >>> resolve_per_worker((pw, {"x": [pw]}), 1)
    ('b', {'x': ['b']})
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from hpcdist.errors import (  # noqa: F401 (re-exported: users met them here)
    CancelledError,
    OutOfRangeError,
    ProgramsDivergedError,
    RemoteError,
    UnavailableError,
)

PENDING, DONE, FAILED, CANCELLED = "pending", "done", "failed", "cancelled"


class RemoteValue:
    """The result of a function given to ``ClusterCoordinator.schedule``.

    :meth:`fetch` (or ``coordinator.fetch(rv)``) waits for the function and returns
    its result; it raises the function's error, or :class:`CancelledError`
    when the function was cancelled because an earlier one failed. On worker
    ranks (which run the same program as the chief) ``fetch`` returns what the
    chief's ``fetch`` returns.

    Example: ``rv = coordinator.schedule(step_fn, args=(it,)); loss = rv.fetch()``.
    """

    def __init__(self, owner: Any, index: int, name: str) -> None:
        self._owner = owner
        self._index = index
        self._name = name
        self._status = PENDING
        self._value: Any = None
        self._error: dict | None = None

    def fetch(self) -> Any:
        """Wait for the result and return it (NumPy arrays and Python values)."""
        return self._owner.fetch(self)

    def get(self) -> Any:
        """Wait for the result and return it (as :meth:`fetch`; there is no device copy)."""
        return self._owner.fetch(self)

    # -- chief side bookkeeping
    @property
    def _finished(self) -> bool:
        return self._status != PENDING

    def _set(self, value: Any) -> None:
        self._status, self._value = DONE, value

    def _fail(self, info: dict) -> None:
        self._status, self._error = FAILED, info

    def _cancel(self, reason: str) -> None:
        text = f"scheduled function {self._name!r} (closure {self._index}) was cancelled: {reason}"
        self._status = CANCELLED
        self._error = {
            "module": CancelledError.__module__,
            "qualname": CancelledError.__qualname__,
            "args": [text],
            "message": text,
            "traceback": "",
            "closure": self._index,
            "worker": -1,
            "name": self._name,
        }

    def __repr__(self) -> str:
        return f"<RemoteValue of {self._name!r} (closure {self._index}): {self._status}>"


class _Placeholder:
    """A component that lives on another process (the chief never holds worker values)."""

    def __init__(self, worker: int) -> None:
        self.worker = worker

    def __repr__(self) -> str:
        return f"<value of worker {self.worker}, held by that worker>"


class PerWorkerValues:
    """One value per worker (``tf.distribute.coordinator.PerWorkerValue``).

    Pass it (or something holding it) to ``schedule``: the function gets the
    component of the worker that runs it. On the chief the components are
    placeholders; on a worker only its own component is real.

    Example:
        >>> PerWorkerValues((1, 2)).values
        (1, 2)
    """

    def __init__(self, values: Any) -> None:
        self._values = tuple(values)

    @property
    def values(self) -> tuple[Any, ...]:
        """The components, in worker order."""
        return self._values

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self._values!r})"


#: TF 2.x's name (``tf.distribute.coordinator.PerWorkerValue``) of :class:`PerWorkerValues`.
PerWorkerValue = PerWorkerValues


class _LocalDataset:
    """A worker's own dataset, built by ``dataset_fn()`` the first time it is read."""

    def __init__(self, source: Any) -> None:
        self._source = source
        self._built = False
        self._dataset: Any = None

    def get(self) -> Any:
        if not self._built:
            src = self._source
            self._dataset = src() if callable(src) and not hasattr(src, "__iter__") else src
            self._built = True
            if not hasattr(self._dataset, "__iter__"):
                raise TypeError(
                    f"dataset_fn returned a {type(self._dataset).__name__}; expected a dataset "
                    "(something iterable, e.g. hd.data.Dataset or a DistributedDataset)"
                )
        return self._dataset


class _LocalIterator:
    """This worker's iterator over its own dataset; ``next(it)`` inside a scheduled function."""

    def __init__(self, dataset: _LocalDataset) -> None:
        self._dataset = dataset
        self._it: Any = None

    def _iterator(self) -> Any:
        if self._it is None:
            self._it = iter(self._dataset.get())
        return self._it

    def __iter__(self) -> _LocalIterator:
        return self

    def __next__(self) -> Any:
        return next(self._iterator())

    def get_next(self) -> Any:
        """The next element (``StopIteration`` at the end)."""
        it = self._iterator()
        return it.get_next() if hasattr(it, "get_next") else next(it)

    def get_next_as_optional(self) -> Any:
        """The next element as an ``Optional`` (needs a ``DistributedIterator`` underneath)."""
        it = self._iterator()
        if not hasattr(it, "get_next_as_optional"):
            raise TypeError(
                f"the per-worker iterator reads a {type(it).__name__}, which has no "
                "get_next_as_optional; build the dataset with "
                "strategy.distribute_datasets_from_function, or use next(iterator)"
            )
        return it.get_next_as_optional()


class PerWorkerIterator(PerWorkerValues):
    """One iterator per worker (``iter(per_worker_dataset)``); use it in scheduled functions.

    Example: ``coordinator.schedule(lambda it: step(next(it)), args=(per_worker_iterator,))``.
    """

    def __next__(self) -> Any:
        raise TypeError(
            "a per-worker iterator is read by the workers: call next(iterator) inside a "
            "function given to coordinator.schedule(fn, args=(iterator,)), not on the chief"
        )

    def get_next(self) -> Any:
        """Not on the chief: see :meth:`__next__`."""
        return self.__next__()


class PerWorkerDataset:
    """What ``create_per_worker_dataset`` returns: ``iter()`` gives a :class:`PerWorkerIterator`.

    Each ``iter()`` starts every worker's dataset from its beginning (a new epoch).

    Example: ``it = iter(coordinator.create_per_worker_dataset(dataset_fn))``.
    """

    def __init__(self, num_workers: int, worker_index: int | None, source: Any) -> None:
        self._num_workers = num_workers
        self._worker = worker_index
        self._local = None if worker_index is None else _LocalDataset(source)

    def __iter__(self) -> PerWorkerIterator:
        values: list[Any] = [_Placeholder(w) for w in range(self._num_workers)]
        if self._local is not None and self._worker is not None:
            values[self._worker] = _LocalIterator(self._local)
        return PerWorkerIterator(values)

    def __repr__(self) -> str:
        return f"<PerWorkerDataset over {self._num_workers} workers>"


def check_dataset_fn(dataset_fn: Any) -> None:
    """``TypeError`` unless ``dataset_fn`` is a no-argument function or a dataset.

    Example: ``check_dataset_fn(lambda: [1, 2])`` passes; ``check_dataset_fn(3)`` raises.
    """
    if not (callable(dataset_fn) or hasattr(dataset_fn, "__iter__")):
        raise TypeError(
            f"create_per_worker_dataset needs a function of no arguments that returns a "
            f"dataset, or a DistributedDataset; got a {type(dataset_fn).__name__}"
        )


def _walk(x: Any, fn: Callable[[Any], Any]) -> Any:
    if isinstance(x, PerWorkerValues):
        return fn(x)
    if isinstance(x, tuple) and isinstance(getattr(type(x), "_fields", None), tuple):
        return type(x)(*(_walk(v, fn) for v in x))
    if isinstance(x, (list, tuple)):
        return type(x)(_walk(v, fn) for v in x)
    if isinstance(x, dict):
        return type(x)((k, _walk(v, fn)) for k, v in x.items())
    if isinstance(x, RemoteValue):
        raise TypeError(
            f"{x!r} was passed to schedule; a scheduled function cannot take a RemoteValue "
            "(its value may live on another worker): pass coordinator.fetch(rv) instead"
        )
    return x


def check_arguments(args: Any, kwargs: Any, num_workers: int) -> None:
    """Raise for arguments a scheduled function cannot take (RemoteValues, wrong-length
    :class:`PerWorkerValues`). Run on the chief and on every worker alike.

    Example: ``check_arguments((PerWorkerValues((1, 2)),), {}, 2)`` passes.
    """

    def check(p: PerWorkerValues) -> PerWorkerValues:
        if len(p.values) != num_workers:
            raise ValueError(
                f"a PerWorkerValues of {len(p.values)} values was passed to schedule; "
                f"expected one value per worker ({num_workers})"
            )
        return p

    _walk((args, kwargs), check)


def check_schedule(fn: Any, args: Any, kwargs: Any, num_workers: int) -> tuple[tuple, dict]:
    """``(args, kwargs)`` as a tuple and a dict, checked (the same on every rank).

    Example: ``check_schedule(len, ([1],), None, 2)`` is ``(([1],), {})``.
    """
    if not callable(fn):
        raise TypeError(f"schedule needs a callable fn; got a {type(fn).__name__}")
    args = () if args is None else args
    kwargs = {} if kwargs is None else kwargs
    if not isinstance(args, (tuple, list)):
        raise TypeError(f"schedule's args must be a tuple or list; got a {type(args).__name__}")
    if not isinstance(kwargs, dict):
        raise TypeError(f"schedule's kwargs must be a dict; got a {type(kwargs).__name__}")
    check_arguments(tuple(args), kwargs, num_workers)
    return tuple(args), kwargs


def resolve_per_worker(structure: Any, worker_index: int) -> Any:
    """``structure`` with each :class:`PerWorkerValues` replaced by its worker's component.

    Example: ``resolve_per_worker(PerWorkerValues((1, 2)), 0)`` is ``1``.
    """
    return _walk(structure, lambda p: p.values[worker_index])


__all__ = [
    "CancelledError",
    "OutOfRangeError",
    "ProgramsDivergedError",
    "RemoteError",
    "UnavailableError",
    "PerWorkerDataset",
    "PerWorkerIterator",
    "PerWorkerValue",
    "PerWorkerValues",
    "RemoteValue",
    "check_arguments",
    "check_dataset_fn",
    "check_schedule",
    "resolve_per_worker",
]
