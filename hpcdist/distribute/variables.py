"""Variables: plain, mirrored (sync on write) and sync-on-read.

``hd.Variable(initial_value, ...)`` makes a plain :class:`Variable` outside
any strategy scope. Inside the scope of a mirrored strategy it makes:

* a :class:`MirroredVariable` (``synchronization`` AUTO or ON_WRITE): one
  identical copy per replica. Writes in replica context combine the values
  of all replicas with the ``aggregation`` (SUM, MEAN, ONLY_FIRST_REPLICA;
  NONE is an error there) and write the result everywhere.
* a :class:`SyncOnReadVariable` (ON_READ): each replica writes its own copy;
  reading in cross-replica context combines them with the aggregation.

Initial values are broadcast from worker 0, so every worker starts from the
same value even when each seeded its random generator differently. Creating
a variable (and reading a sync-on-read variable in cross-replica context) is
collective under a multi-worker strategy: every worker must do it, in the
same order.

Example:
    >>> import hpcdist as hd
    >>> v = hd.Variable(1.0)
    >>> v.assign_add(2.0).numpy()
    array(3.)
"""

from __future__ import annotations

import enum
from typing import TYPE_CHECKING, Any

import numpy as np
from numpy.lib.mixins import NDArrayOperatorsMixin

from hpcdist.arrays import array_module, asarray, is_cupy, to_device, to_host
from hpcdist.collectives.ops import ReduceOp
from hpcdist.distribute import context
from hpcdist.distribute.devices import Device
from hpcdist.distribute.strategy import mixing_error
from hpcdist.distribute.values import DistributedVariableBase, local_results, select_mirrored


class VariableSynchronization(enum.Enum):
    """When a distributed variable is synchronised (``tf.VariableSynchronization``)."""

    AUTO = 0
    NONE = 1
    ON_WRITE = 2
    ON_READ = 3


class VariableAggregation(enum.Enum):
    """How replicas' writes (or reads) are combined (``tf.VariableAggregation``)."""

    NONE = 0
    SUM = 1
    MEAN = 2
    ONLY_FIRST_REPLICA = 3


def _enum_value(kind: type[enum.Enum], value: Any, arg: str) -> Any:
    if isinstance(value, kind):
        return value
    if isinstance(value, str) and value.strip().upper() in kind.__members__:
        return kind[value.strip().upper()]
    raise ValueError(
        f"{arg} is {value!r}; expected a hpcdist.{kind.__name__} "
        f"({', '.join(kind.__members__)}) or its name"
    )


AGGREGATION_ERROR = (
    "You must specify an aggregation method to update a {kind} in replica context: "
    "pass aggregation=hpcdist.VariableAggregation.SUM, MEAN or ONLY_FIRST_REPLICA to "
    "hpcdist.Variable(...), or update it in cross-replica context (outside strategy.run)."
)


class _VariableMeta(type):
    """``hd.Variable(...)`` is a factory: the current strategy decides what it makes."""

    def __call__(cls, *args: Any, **kwargs: Any) -> Any:
        if cls is Variable:
            return create_variable(*args, **kwargs)
        return super().__call__(*args, **kwargs)


# numpy's stubs declare NDArrayOperatorsMixin with ABCMeta; at run time its metaclass is `type`
class Variable(NDArrayOperatorsMixin, metaclass=_VariableMeta):  # type: ignore[metaclass]
    """A named, mutable array (``tf.Variable``); arithmetic works on its value.

    Reads return a read-only snapshot: a later assignment does not change it.

    Example: ``v = hd.Variable(np.zeros(3), name="w"); v.assign_add(np.ones(3))``.
    """

    _distribute_strategy: Any = None
    _container: Any = None
    # set by _make (plain variables) or __init__ (distributed ones)
    _value: Any
    _name: str
    _trainable: bool
    _synchronization: VariableSynchronization
    _aggregation: VariableAggregation
    _device: Device | None

    if TYPE_CHECKING:
        # what ``hd.Variable(...)`` takes: _VariableMeta hands the call to create_variable
        def __init__(
            self,
            initial_value: Any = None,
            trainable: bool | None = None,
            name: str | None = None,
            dtype: Any = None,
            synchronization: VariableSynchronization | str = ...,
            aggregation: VariableAggregation | str = ...,
            shape: Any = None,
        ) -> None: ...

    @classmethod
    def _make(
        cls,
        value: Any,
        *,
        name: str,
        trainable: bool,
        synchronization: VariableSynchronization,
        aggregation: VariableAggregation,
        device: Device | None = None,
        strategy: Any = None,
    ) -> Variable:
        var = object.__new__(Variable)
        var._value = value
        var._name = name
        var._trainable = trainable
        var._synchronization = synchronization
        var._aggregation = aggregation
        var._device = device
        var._distribute_strategy = strategy
        return var

    # -- description -------------------------------------------------------------------
    @property
    def name(self) -> str:
        """The variable's name."""
        return self._name

    @property
    def trainable(self) -> bool:
        """Whether optimizers update this variable."""
        return self._trainable

    @property
    def distribute_strategy(self) -> Any:
        """The strategy the variable was made in (``None`` outside any strategy's scope)."""
        return self._distribute_strategy

    @property
    def synchronization(self) -> VariableSynchronization:
        """When the variable is synchronised across replicas."""
        return self._synchronization

    @property
    def aggregation(self) -> VariableAggregation:
        """How replicas' writes are combined."""
        return self._aggregation

    @property
    def device(self) -> str:
        """The name of the device the value lives on."""
        if self._device is not None:
            return self._device.name
        x = self.raw_value()
        return f"/device:GPU:{x.device.id}" if is_cupy(x) else "/device:CPU:0"

    @property
    def shape(self) -> tuple[int, ...]:
        """The shape of the value."""
        return tuple(self.raw_value().shape)

    @property
    def dtype(self) -> np.dtype:
        """The dtype of the value."""
        return self.raw_value().dtype

    @property
    def ndim(self) -> int:
        """The rank of the value."""
        return self.raw_value().ndim

    @property
    def size(self) -> int:
        """The number of elements."""
        return int(self.raw_value().size)

    # -- reading ---------------------------------------------------------------------------
    def raw_value(self) -> Any:
        """The stored array itself (no copy, no view), for layers and optimizers that update it.

        :meth:`value` is the read-only view to hand out; this is what hpcdist's
        own layers, metrics and optimizers read and write in place.
        """
        return self._value

    def value(self) -> Any:
        """The current value: a read-only NumPy view (CuPy arrays as they are)."""
        x = asarray(self.raw_value())
        if isinstance(x, np.ndarray):
            x = x.view()
            x.flags.writeable = False
        return x

    def read_value(self) -> Any:
        """The current value (same as :meth:`value`)."""
        return self.value()

    def numpy(self) -> np.ndarray:
        """A NumPy copy of the current value."""
        return np.array(to_host(self.value()), copy=True)

    def __array__(self, dtype: Any = None, copy: bool | None = None) -> np.ndarray:
        if copy:
            return np.array(to_host(self.value()), dtype=dtype, copy=True)
        return np.asarray(to_host(self.value()), dtype=dtype)

    def __array_ufunc__(self, ufunc: Any, method: str, *inputs: Any, **kwargs: Any) -> Any:
        if any(isinstance(o, Variable) for o in kwargs.get("out", ())):
            raise TypeError("a Variable cannot be the output of an operation; use assign")
        inputs = tuple(x.value() if isinstance(x, Variable) else x for x in inputs)
        return getattr(ufunc, method)(*inputs, **kwargs)

    # `v += x` rebinds `v` to a new array (as in TF); it does not update the variable.
    def __iadd__(self, other: Any) -> Any:
        return NotImplemented

    __isub__ = __imul__ = __itruediv__ = __iadd__

    __hash__ = object.__hash__

    def __getitem__(self, item: Any) -> Any:
        return self.value()[item]

    def __len__(self) -> int:
        return len(self.raw_value())

    def __float__(self) -> float:
        return float(to_host(self.value()))

    def __int__(self) -> int:
        return int(to_host(self.value()))

    def __bool__(self) -> bool:
        return bool(to_host(self.value()))

    def __repr__(self) -> str:
        return (
            f"<hpcdist.{type(self).__name__} {self.name!r} shape={self.shape} "
            f"dtype={self.dtype}, numpy={self._repr_value()}>"
        )

    def _repr_value(self) -> str:
        return np.array2string(to_host(self.raw_value()), threshold=20)

    # -- writing ----------------------------------------------------------------------------
    def _converted(self, value: Any) -> Any:
        """``value`` as an array of this variable's shape and dtype, on its device."""
        if isinstance(value, Variable):
            value = value.raw_value()
        value = asarray(value)
        current = self.raw_value()
        if tuple(value.shape) != tuple(current.shape):
            raise ValueError(
                f"cannot assign a value of shape {tuple(value.shape)} to variable {self.name!r} "
                f"of shape {tuple(current.shape)}; shapes must match"
            )
        if value.dtype != current.dtype:
            if not np.can_cast(value.dtype, current.dtype, casting="same_kind"):
                raise TypeError(
                    f"cannot assign a {value.dtype} value to variable {self.name!r} of dtype "
                    f"{current.dtype}; cast it first"
                )
        if self._device is not None:
            return to_device(value, self._device.device_type, self._device.index).astype(
                current.dtype, copy=False
            )
        return array_module(current).array(value, dtype=current.dtype, copy=True)

    def _set(self, op: str, value: Any) -> None:
        new = self._converted(value)
        if op == "add":
            new = self._value + new
        elif op == "sub":
            new = self._value - new
        self._value = asarray(new).astype(self._value.dtype, copy=False)

    def _write(self, op: str, value: Any, read_value: bool) -> Any:
        """``assign``, ``assign_add`` (``op="add"``) or ``assign_sub`` (``"sub"``)."""
        self._set(op, value)
        return self if read_value else None

    def assign(
        self,
        value: Any,
        use_locking: bool | None = None,
        name: str | None = None,
        read_value: bool = True,
    ) -> Variable | None:
        """Set the value; returns the variable (``None`` with ``read_value=False``).

        A distributed variable in replica context combines the replicas' values
        with its aggregation (mirrored) or sets this replica's copy (sync on read).
        """
        return self._write("assign", value, read_value)

    def assign_add(
        self,
        delta: Any,
        use_locking: bool | None = None,
        name: str | None = None,
        read_value: bool = True,
    ) -> Variable | None:
        """Add ``delta`` to the value; returns the variable."""
        return self._write("add", delta, read_value)

    def assign_sub(
        self,
        delta: Any,
        use_locking: bool | None = None,
        name: str | None = None,
        read_value: bool = True,
    ) -> Variable | None:
        """Subtract ``delta`` from the value; returns the variable."""
        return self._write("sub", delta, read_value)


class DistributedVariable(Variable, DistributedVariableBase):
    """A variable with one component per local replica (base of Mirrored and SyncOnRead)."""

    def __init__(
        self,
        strategy: Any,
        components: tuple[Variable, ...],
        *,
        name: str,
        trainable: bool,
        synchronization: VariableSynchronization,
        aggregation: VariableAggregation,
    ) -> None:
        self._components = tuple(components)
        self._name = name
        self._trainable = trainable
        self._synchronization = synchronization
        self._aggregation = aggregation
        self._device = None
        self._distribute_strategy = strategy
        for c in self._components:
            c._container = self

    @property
    def values(self) -> tuple[Variable, ...]:
        """The local components, one per local replica."""
        return self._components

    @property
    def _devices(self) -> tuple[Device | None, ...]:
        return tuple(c._device for c in self._components)

    @property
    def primary(self) -> Variable:
        """The first local component."""
        return self._components[0]

    @property
    def device(self) -> str:
        """The device of the component of this context (the primary one outside replicas)."""
        return self._current_component().device

    @property
    def shape(self) -> tuple[int, ...]:
        return self.primary.shape

    @property
    def dtype(self) -> np.dtype:
        return self.primary.dtype

    @property
    def ndim(self) -> int:
        return self.primary.ndim

    @property
    def size(self) -> int:
        return self.primary.size

    def __len__(self) -> int:
        return len(self.primary)

    def local_replica_id(self) -> int | None:
        """The local replica id when in a replica context of this variable's strategy.

        ``None`` in a cross-replica context and outside any scope; inside the
        scope or ``run`` of another strategy it is the mixing error.
        """
        mode = context.current_mode()
        if mode.strategy is not self._distribute_strategy:
            if mode.strategy is not context.default_strategy():
                raise mixing_error(mode.strategy, self._distribute_strategy)
            return None
        if mode.replica is None:
            return None
        return mode.replica._local_id

    def _current_component(self) -> Variable:
        local_id = self.local_replica_id()
        return self.primary if local_id is None else self._components[local_id]

    def _repr_value(self) -> str:
        return self.primary._repr_value()

    def _update_each(self, op: str, value: Any) -> DistributedVariable:
        """Apply ``op`` with a value that is the same for every replica to every component."""

        for i, c in enumerate(self._components):
            c._set(op, select_mirrored(i, value))
        return self


class MirroredVariable(DistributedVariable):
    """A variable kept identical on every replica (sync on write)."""

    def raw_value(self) -> Any:
        """The stored array of this replica's copy (the first copy outside a replica)."""
        return self._current_component().raw_value()

    def _write(self, op: str, value: Any, read_value: bool) -> Any:
        local_id = self.local_replica_id()
        if local_id is None:
            self._update_each(op, value)
            return self if read_value else None
        agg = self._aggregation
        check_replica_write(self, "MirroredVariable")

        def merge(strategy: Any, v: Any) -> None:
            self._update_each(op, aggregate(strategy, v, agg, self))

        key = ("write", id(self), op)
        replica = context.get_replica_context()
        assert replica is not None  # a local replica id means a replica context
        replica._merge(merge, (value,), None, True, key)
        return self if read_value else None


class SyncOnReadVariable(DistributedVariable):
    """Each replica writes its own copy; cross-replica reads combine them (sync on read)."""

    def raw_value(self) -> Any:
        """This replica's own stored array; outside a replica, the copies combined."""
        local_id = self.local_replica_id()
        if local_id is not None:
            return self._components[local_id].raw_value()
        return self._aggregated()

    def _aggregated(self) -> Any:
        strategy = self._distribute_strategy
        agg = self._aggregation
        ext = strategy.extended
        if agg is VariableAggregation.ONLY_FIRST_REPLICA:
            return ext.broadcast_initial_value(self.primary.raw_value())
        if agg is VariableAggregation.NONE:
            raise ValueError(
                f"the sync-on-read variable {self.name!r} has aggregation NONE, so it has no "
                "value in cross-replica context; read it inside strategy.run, or create it "
                "with aggregation SUM, MEAN or ONLY_FIRST_REPLICA"
            )
        return ext.reduce_leaves(ReduceOp.from_variable_aggregation(agg), [self])[0]

    def _write(self, op: str, value: Any, read_value: bool) -> Any:
        local_id = self.local_replica_id()
        if local_id is not None:
            self._components[local_id]._set(op, value)
            return self if read_value else None
        if self._aggregation is VariableAggregation.SUM:
            if op != "assign":
                raise ValueError(
                    f"a sync-on-read variable with SUM aggregation does not support "
                    f"assign_{op} in cross-replica context (the sum of the replicas' copies "
                    "would change by num_replicas times the delta); use assign, or update it "
                    "inside strategy.run"
                )
            value = asarray(value.raw_value() if isinstance(value, Variable) else value)
            n = self._distribute_strategy.num_replicas_in_sync
            value = (value / n).astype(self.dtype)
        self._update_each(op, value)
        return self if read_value else None


def check_replica_write(var: Any, kind: str) -> None:
    """Raise unless ``var``'s aggregation can combine a write made by several replicas.

    Example: ``check_replica_write(v, "MirroredVariable")`` before a merged write.
    """
    agg = var.aggregation
    if agg is VariableAggregation.NONE:
        raise ValueError(AGGREGATION_ERROR.format(kind=kind))
    if agg is VariableAggregation.MEAN and not np.issubdtype(var.dtype, np.floating):
        raise ValueError(
            f"cannot update the {var.dtype} variable {var.name!r} with MEAN aggregation "
            "in replica context (the mean of integers loses precision); use a float "
            "variable or update it in cross-replica context"
        )


def aggregate(strategy: Any, value: Any, aggregation: VariableAggregation, var: Any) -> Any:
    """Combine the replicas' ``value`` for a write to ``var`` (a Mirrored or plain array)."""
    ext = strategy.extended
    if aggregation is VariableAggregation.ONLY_FIRST_REPLICA:
        first = asarray(local_results(value)[0])
        return ext.broadcast_to(ext.broadcast_initial_value(first), var)
    op = ReduceOp.from_variable_aggregation(aggregation)
    return ext.reduce_to(op, value, var)


def create_variable(
    initial_value: Any = None,
    trainable: bool | None = None,
    name: str | None = None,
    dtype: Any = None,
    synchronization: VariableSynchronization | str = VariableSynchronization.AUTO,
    aggregation: VariableAggregation | str = VariableAggregation.NONE,
    shape: Any = None,
) -> Variable:
    """Make the variable the current strategy asks for (what ``hd.Variable(...)`` calls).

    Example: ``with strategy.scope(): v = create_variable(0.0)`` is a ``MirroredVariable``.
    """
    if initial_value is None:
        raise ValueError("initial_value must be given (a value, an array or a callable)")
    sync = _enum_value(VariableSynchronization, synchronization, "synchronization")
    agg = _enum_value(VariableAggregation, aggregation, "aggregation")
    if trainable is None:
        trainable = sync is not VariableSynchronization.ON_READ
    spec = {
        "name": name or "Variable",
        "trainable": bool(trainable),
        "synchronization": sync,
        "aggregation": agg,
    }
    ctx = context.get_replica_context()
    strategy = context.get_strategy()
    if ctx is not None and getattr(ctx, "_merger", None) is not None:

        def merge(s: Any, v: Any) -> Variable:
            return s.extended.create_variable(local_results(v)[0], dtype, shape, spec)

        return ctx._merge(merge, (initial_value,), None, False, ("create", spec["name"]))
    return strategy.extended.create_variable(initial_value, dtype, shape, spec)


def initial_array(initial_value: Any, dtype: Any, shape: Any) -> Any:
    """The array an initial value (a value, array, variable or callable) stands for."""
    value = initial_value() if callable(initial_value) else initial_value
    if isinstance(value, Variable):
        value = value.raw_value()
    value = asarray(value)
    if dtype is not None:
        value = value.astype(dtype, copy=False)
    if shape is not None and tuple(value.shape) != tuple(shape):
        raise ValueError(f"initial value has shape {tuple(value.shape)}, but shape={tuple(shape)}")
    return value
