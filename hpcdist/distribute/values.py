"""Distributed values: one value per local replica.

* :class:`PerReplica`: each replica's own value (what ``run`` returns).
* :class:`Mirrored`: the same value on every replica (what ``reduce_to``
  and ``broadcast_to`` return).

A worker holds the values of its own replicas only: under
``MultiWorkerMirroredStrategy`` with 2 workers of 2 replicas each,
``experimental_local_results`` gives 2 values on each worker.

Example:
    >>> import numpy as np
    >>> v = PerReplica((np.float64(1.0), np.float64(2.0)))
    >>> len(v.values), select_replica(1, {"a": v})
    (2, {'a': np.float64(2.0)})
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, NoReturn

from hpcdist.arrays import export_like, import_array, is_foreign
from hpcdist.distribute import nest


class DistributedVariableBase:
    """The base of :class:`hpcdist.distribute.variables.DistributedVariable`.

    Distributed variables build on this module, so it recognises them by this
    base instead of importing them.
    """

    @property
    def values(self) -> tuple[Any, ...]:
        """Each local replica's copy."""
        raise NotImplementedError(f"{type(self).__name__} does not define values")


class DistributedValues:
    """Base class of values that have one component per local replica."""

    #: The devices of the components, when known (set by the strategy that made the value).
    _devices: tuple = ()

    def __init__(self, values: Sequence[Any]) -> None:
        values = tuple(values)
        if not values:
            raise ValueError(f"{type(self).__name__} needs at least one value; got none")
        self._values = values

    @property
    def values(self) -> tuple[Any, ...]:
        """The local components, in local replica order."""
        return self._values

    def _component(self, local_id: int) -> Any:
        return self._values[local_id]

    @property
    def primary(self) -> Any:
        """The first local component."""
        return self._values[0]

    def __len__(self) -> int:
        raise TypeError(
            f"{type(self).__name__} has no length: it holds one value per replica; use "
            "strategy.experimental_local_results(value) or strategy.reduce/gather"
        )

    def __iter__(self) -> NoReturn:
        raise TypeError(
            f"{type(self).__name__} is not iterable; use "
            "strategy.experimental_local_results(value) to get the local values"
        )

    def __bool__(self) -> bool:
        raise TypeError(
            f"the truth value of a {type(self).__name__} is ambiguous; reduce it first "
            "(strategy.reduce) or look at strategy.experimental_local_results(value)"
        )

    def __repr__(self) -> str:
        body = ",\n".join(f"  {i}: {v!r}" for i, v in enumerate(self._values))
        return f"{type(self).__name__}:{{\n{body}\n}}"


class PerReplica(DistributedValues):
    """Each local replica's own value."""


class Mirrored(DistributedValues):
    """The same value on every local replica (one copy per device)."""


def is_distributed(x: Any) -> bool:
    """Whether ``x`` is a distributed value or a distributed variable."""
    return isinstance(x, (DistributedValues, DistributedVariableBase))


def select_replica(local_id: int, structure: Any) -> Any:
    """The ``local_id``-th component of every distributed value in ``structure``.

    Distributed variables and plain values are returned as they are.

    Example: ``select_replica(0, PerReplica((a, b))) is a``.
    """

    def pick(x: Any) -> Any:
        if isinstance(x, DistributedValues):
            return x._component(local_id)
        return x

    return nest.map_structure(pick, structure)


def select_mirrored(local_id: int, structure: Any) -> Any:
    """Like :func:`select_replica`, but a :class:`PerReplica` value is an error.

    Cross-replica updates of mirrored variables must get the same value on
    every replica, so a per-replica value there raises ``TypeError``.
    """

    def pick(x: Any) -> Any:
        if isinstance(x, PerReplica):
            raise TypeError(
                f"expected a value that is the same on every replica (a plain value or "
                f"Mirrored), got a PerReplica: {x!r}; reduce it first with "
                "strategy.reduce / extended.reduce_to"
            )
        if isinstance(x, DistributedValues):
            return x._component(local_id)
        return x

    return nest.map_structure(pick, structure)


def regroup(
    per_replica: Sequence[Any],
    wrap: type[DistributedValues] = PerReplica,
    always_wrap: bool = False,
) -> Any:
    """Join the structures the local replicas returned into one structure.

    Leaves that are the same object on every replica (a variable, a shared
    constant) stay as they are, and so does the only value of a single
    replica; other leaves become ``wrap`` (``PerReplica``) values.

    Example: ``regroup([{"x": a}, {"x": b}])`` is ``{"x": PerReplica((a, b))}``.
    """
    first = per_replica[0]
    if len(per_replica) == 1:
        return first
    for other in per_replica[1:]:
        nest.assert_same_structure(first, other)
    flats = [nest.flatten(s) for s in per_replica]
    leaves = []
    for items in zip(*flats, strict=True):
        if not always_wrap and all(item is items[0] for item in items[1:]):
            leaves.append(items[0])
        else:
            leaves.append(wrap(items))
    return nest.pack_sequence_as(first, leaves)


def local_results(value: Any) -> tuple[Any, ...]:
    """The local components of a distributed value or variable, else ``(value,)``."""
    if isinstance(value, DistributedValues):
        return value.values
    if isinstance(value, DistributedVariableBase):
        return value.values
    return (value,)


def import_values(value: Any) -> tuple[Any, Callable[[Any], Any]]:
    """``value`` with framework arrays (torch, JAX, TF) as NumPy/CuPy views, and the way back.

    Leaves and the components of distributed values are converted by
    :func:`hpcdist.arrays.import_array` (no copies); the returned function
    turns a result of the same structure (a distributed value reduced to one
    array) back into the types of ``value``'s leaves.

    Example: ``native, back = import_values(torch_loss); back(strategy.reduce("SUM", native))``.
    """
    leaves = nest.flatten(value)
    samples = [_sample(leaf) for leaf in leaves]
    if not any(is_foreign(s) for s in samples):
        return value, _same

    def convert(x: Any) -> Any:
        if isinstance(x, DistributedValues):
            if not is_foreign(_sample(x)):
                return x
            out = type(x)([import_array(v) for v in x.values])
            out._devices = x._devices
            return out
        return import_array(x)

    converted = nest.pack_sequence_as(value, [convert(leaf) for leaf in leaves])

    def back(result: Any) -> Any:
        out = [export_like(s, r) for s, r in zip(samples, nest.flatten(result), strict=True)]
        return nest.pack_sequence_as(result, out)

    return converted, back


def _sample(leaf: Any) -> Any:
    return leaf.values[0] if isinstance(leaf, DistributedValues) and leaf.values else leaf


def _same(x: Any) -> Any:
    return x
