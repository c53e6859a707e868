"""The optimizer base class: ``apply_gradients`` with flat buffers, one merge call, one allreduce.

``apply_gradients(grads_and_vars)`` works in three places:

* Inside ``strategy.run`` (a replica context): ONE ``merge_call``. In it, the
  gradients of each local replica are packed into one flat buffer per dtype,
  the local buffers are summed and ONE batched cross-worker allreduce of all
  of them is issued (``strategy.extended.reduce_leaves``). With several GPUs
  in one process (one worker), each buffer is instead all-reduced among the
  GPUs (``NcclAllReduce``: NCCL) and every replica updates its copy from the
  sum on its own GPU. Gradients are
  summed, as in TF: the loss is already divided by the global batch size.
  ``skip_gradients_aggregation=True`` (or ``experimental_aggregate_gradients=
  False``) skips the reduction: each replica's gradients update its own copy.
* In a cross-replica context (inside ``strategy.scope()``) or without a
  strategy: the gradients are applied as given.

Then the clipping (``clipnorm``, ``global_clipnorm`` over all gradients, or
``clipvalue``) and one fused kernel call per (device, dtype) over the flat
parameter buffer (:mod:`hpcdist.optimizers.flat`). ``iterations`` grows by
one per call; a learning-rate schedule is called with ``iterations`` before
the increment. ``None`` gradients are skipped (all ``None`` is an error).

Example:
    >>> import numpy as np, hpcdist as hd
    >>> from hpcdist.optimizers import SGD
    >>> w = hd.Variable(np.array([1.0, 2.0]), name="w")
    >>> opt = SGD(learning_rate=0.5)
    >>> int(opt.apply_gradients([(np.array([1.0, 1.0]), w)]))
    1
    >>> w.numpy()
    array([0.5, 1.5])
"""

from __future__ import annotations

import functools
import math
import warnings
from collections.abc import Callable, Iterable
from typing import Any, SupportsFloat, TypeAlias

import numpy as np

from hpcdist.arrays import array_module, asarray, device_of, import_array, to_device
from hpcdist.collectives.ops import ReduceOp
from hpcdist.distribute import context
from hpcdist.distribute.aggregating import AggregatingVariable
from hpcdist.distribute.ps import remote_updates
from hpcdist.distribute.values import DistributedValues, PerReplica, select_replica
from hpcdist.distribute.variables import (
    DistributedVariable,
    SyncOnReadVariable,
    Variable,
    VariableAggregation,
    VariableSynchronization,
)
from hpcdist.errors import ShardingError
from hpcdist.observe.timeline import span
from hpcdist.optimizers import schedules, sharded
from hpcdist.optimizers.clipping import check_clip, global_scale, kernels_for
from hpcdist.optimizers.flat import FlatBuffer, empty_like, on_device_of
from hpcdist.optimizers.ps_hosting import RemoteView

#: What ``learning_rate`` takes: a number, a schedule (or its ``serialize`` dict), or, as a
#: schedule is, a function of the step (``optimizer.iterations``) that gives the rate.
LearningRate: TypeAlias = (
    SupportsFloat | schedules.LearningRateSchedule | Callable[[int], Any] | dict[str, Any]
)

SUPPORTED_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))


def _component(var: Any, local_id: int) -> Any:
    """The component of ``var`` for local replica ``local_id`` (the variable itself if plain)."""
    return var.values[local_id] if isinstance(var, DistributedVariable) else var


def _num_local(var: Any) -> int:
    return len(var.values) if isinstance(var, DistributedVariable) else 1


def _runs(idx: list[int | None]) -> list[tuple[int, int]]:
    """Maximal ranges ``[start, stop)`` of consecutive entries that are not ``None``."""
    runs = []
    start = None
    for j, i in enumerate(idx):
        if i is None:
            if start is not None:
                runs.append((start, j))
                start = None
        elif start is None:
            start = j
    if start is not None:
        runs.append((start, len(idx)))
    return runs


def _like(g: Any, ref: Any) -> Any:
    """``g`` on the device of ``ref`` (no copy when it is there already)."""
    where = device_of(ref)
    if device_of(g) != where:
        return to_device(g, where[0], where[1], copy=False)
    return g


def _address(x: Any) -> int:
    iface = getattr(x, "__cuda_array_interface__", None) or x.__array_interface__
    return int(iface["data"][0])


def _one_buffer(pieces: list[Any], group: _Group) -> Any:
    """The flat buffer the gradients already lie in, laid out as ``group``'s, else ``None``.

    A model's backward pass writes all gradients into one contiguous buffer
    (:meth:`hpcdist.nn.Model.backward`); then packing them again would only
    copy. The buffer is read, never written (clipping works on a copy).
    """
    if not pieces or any(p is None for p in pieces):
        return None
    base = pieces[0].base
    if base is None or getattr(base, "base", None) is not None:
        return None
    if base.ndim != 1 or base.dtype != group.dtype or base.size != group.offsets[-1]:
        return None
    if not base.flags.c_contiguous or type(base) is not type(pieces[0]):
        return None
    start = _address(base)
    item = base.dtype.itemsize
    for p, offset in zip(pieces, group.offsets, strict=False):
        if p.base is not base or _address(p) != start + offset * item:
            return None
    return base


class _Group:
    """The variables of one dtype: flat parameter, slot and gradient buffers per local replica."""

    def __init__(self, dtype: np.dtype, slot_names: tuple[str, ...]) -> None:
        self.dtype = dtype
        self.slot_names = slot_names
        self.variables: list[Any] = []
        self.slot_vars: list[dict[str, Any]] = []
        self.params: list[FlatBuffer] = []
        self.slots: dict[str, list[FlatBuffer]] = {}
        self.grads: dict[int, Any] = {}
        self.offsets: list[int] = [0]

    def add(self, var: Any, slots: dict[str, Any]) -> None:
        self.variables.append(var)
        self.slot_vars.append(slots)
        self.params = []  # rebuilt by build()

    def build(self, num_local: int) -> None:
        """(Re)adopt every variable and slot into fresh flat buffers."""
        self.params = [
            FlatBuffer([_component(v, i) for v in self.variables]) for i in range(num_local)
        ]
        self.slots = {
            name: [
                FlatBuffer([_component(s[name], i) for s in self.slot_vars])
                for i in range(num_local)
            ]
            for name in self.slot_names
            if self.slot_vars and name in self.slot_vars[0]  # (sharded: no slot variables)
        }
        self.offsets = list(self.params[0].offsets)
        self.grads = {}

    def grad_buffer(self, r: int) -> Any:
        """The reusable pack buffer of replica ``r`` (on the device of its parameters)."""
        buf = self.grads.get(r)
        if buf is None:
            ref = self.params[min(r, len(self.params) - 1)].views[0]
            buf = self.grads[r] = empty_like(ref, self.offsets[-1])
        return buf


class Optimizer:
    """Base class of the optimizers (Keras 2.11+ ``keras.optimizers.Optimizer`` semantics).

    Subclasses give their slot names (``slot_names``), their hyper-parameter
    array (``hyper_parameters``) and the fused kernel call (``_update``).

    ``learning_rate`` is a float or a :class:`~hpcdist.optimizers.schedules.
    LearningRateSchedule` (settable; reading it gives the current value);
    ``weight_decay`` is decoupled (``p -= lr * wd * p`` before the update);
    at most one of ``clipnorm`` (per variable), ``clipvalue`` (per element)
    and ``global_clipnorm`` (over all gradients) may be set.

    Example: ``opt = hd.optimizers.Adam(1e-3); opt.apply_gradients(zip(grads, vars))``.
    """

    #: Other names ``get_slot`` accepts for a slot (Keras legacy names).
    _SLOT_ALIASES: dict[str, str] = {}
    _learning_rate: float | schedules.LearningRateSchedule | Callable[[int], Any]

    def __init__(
        self,
        name: str,
        learning_rate: LearningRate = 0.001,
        weight_decay: float | None = None,
        clipnorm: float | None = None,
        clipvalue: float | None = None,
        global_clipnorm: float | None = None,
        **kwargs: Any,
    ) -> None:
        if "lr" in kwargs:
            learning_rate = kwargs.pop("lr")
        if kwargs:
            raise TypeError(
                f"{type(self).__name__} got unexpected keyword arguments {sorted(kwargs)}; "
                "expected learning_rate, weight_decay, clipnorm, clipvalue, global_clipnorm"
            )
        self._name = str(name)
        self.learning_rate = learning_rate
        self.weight_decay = check_clip("weight_decay", weight_decay)
        self.clipnorm = check_clip("clipnorm", clipnorm)
        self.clipvalue = check_clip("clipvalue", clipvalue)
        self.global_clipnorm = check_clip("global_clipnorm", global_clipnorm)
        given = [
            k for k in ("clipnorm", "clipvalue", "global_clipnorm") if getattr(self, k) is not None
        ]
        if len(given) > 1:
            raise ValueError(
                f"only one of clipnorm, clipvalue and global_clipnorm can be set; got {given}"
            )
        self._iterations: Any = None
        self._groups: dict[np.dtype, _Group] = {}
        self._entries: dict[int, tuple[Any, dict[str, Any]]] = {}
        self._order: list[Any] = []
        self._strategy_key: Any = None
        self._warned: set[tuple[str, ...]] = set()
        self._sharding: str | None = None  # ZeRO stage of the strategy (hpcdist.optimizers.sharded)
        self._shards: dict[np.dtype, Any] = {}
        if context.has_strategy() and context.in_cross_replica_context():
            self._iterations = self._new_iterations(context.get_strategy(), 0)

    # -- properties ------------------------------------------------------------------
    @property
    def sharding(self) -> str | None:
        """The ZeRO stage of the strategy the variables belong to (``None``: not sharded)."""
        return self._sharding

    @property
    def name(self) -> str:
        """The optimizer's name."""
        return self._name

    @property
    def learning_rate(self) -> float:
        """The learning rate of the next step (a schedule is evaluated at ``iterations``)."""
        return self._lr_at(self.current_step())

    @learning_rate.setter
    def learning_rate(self, value: LearningRate) -> None:
        rate = schedules.deserialize(value) if isinstance(value, dict) else value
        if isinstance(rate, schedules.LearningRateSchedule) or (
            callable(rate) and not isinstance(rate, Variable)
        ):
            self._learning_rate = rate
            return
        try:
            lr = float(rate)
        except (TypeError, ValueError):
            raise TypeError(
                f"learning_rate must be a number or a LearningRateSchedule, got {value!r}"
            ) from None
        if not lr >= 0:
            raise ValueError(f"learning_rate must be >= 0, got {value!r}")
        self._learning_rate = lr

    lr = learning_rate

    @property
    def iterations(self) -> Variable:
        """The number of ``apply_gradients`` calls so far (an int64 variable).

        It is created in the strategy scope of the first variables (or of the
        scope the optimizer was made in); before that, a plain variable.
        """
        if self._iterations is None:
            self._iterations = self._new_iterations(None, 0)
        return self._iterations

    @iterations.setter
    def iterations(self, value: Any) -> None:
        self.iterations.assign(np.int64(int(value)))

    @property
    def ordered_variables(self) -> list[Any]:
        """The variables in the order the optimizer first saw them (the order of
        their slots in checkpoints)."""
        return self._order

    @property
    def created_iterations(self) -> Any:
        """The ``iterations`` variable if it exists yet, else ``None`` (reading
        :attr:`iterations` creates it)."""
        return self._iterations

    def current_step(self) -> int:
        """The number of ``apply_gradients`` calls so far, as an ``int`` (0 before any)."""
        if self._iterations is None:
            return 0
        return int(_component(self._iterations, 0)._value)

    def _lr_at(self, step: int) -> float:
        lr = self._learning_rate
        return float(lr(step)) if callable(lr) else float(lr)

    def _wd(self) -> float:
        return float(self.weight_decay) if self.weight_decay else 0.0

    # -- subclass interface ----------------------------------------------------------------
    def slot_names(self) -> tuple[str, ...]:
        """The names of the slots each variable gets (in order)."""
        return ()

    def _slot_initial_value(self, name: str) -> float:
        """The value every element of slot ``name`` starts at (0; Adagrad's accumulator differs)."""
        return 0.0

    def hyper_parameters(self, lr: float, step: int, dtype: np.dtype) -> np.ndarray:
        """The kernel's hyper-parameter array for this step, in ``dtype``."""
        raise NotImplementedError

    def _update(
        self, k: Any, p_in: Any, p_out: Any, g: Any, slots: dict[str, Any], hyper: Any
    ) -> None:
        """One fused kernel call over flat ranges (``k`` is the kernel module)."""
        raise NotImplementedError

    # -- variables ---------------------------------------------------------------------------
    def _make_variable(self, like: Any, initial: Any, name: str, aggregation: Any) -> Any:
        """A non-trainable variable placed like ``like`` (mirrored if ``like`` is)."""
        if isinstance(like, DistributedVariable):
            with like.distribute_strategy.scope():
                return Variable(initial, name=name, trainable=False, aggregation=aggregation)
        owner = like.distribute_strategy or context.default_strategy()
        spec = {
            "name": name,
            "trainable": False,
            "synchronization": VariableSynchronization.AUTO,
            "aggregation": aggregation,
        }
        return owner.extended.create_variable(initial, None, None, spec)

    def _new_iterations(self, strategy: Any, value: int) -> Any:
        initial = np.int64(value)
        name = f"{self._name}/iterations"
        agg = VariableAggregation.ONLY_FIRST_REPLICA
        if strategy is not None and strategy is not context.default_strategy():
            with strategy.scope():
                return Variable(initial, name=name, trainable=False, aggregation=agg)
        spec = {
            "name": name,
            "trainable": False,
            "synchronization": VariableSynchronization.AUTO,
            "aggregation": agg,
        }
        return context.default_strategy().extended.create_variable(initial, None, None, spec)

    def build(self, var_list: Iterable[Any]) -> None:
        """Create the slots of ``var_list`` and adopt the variables into flat buffers.

        ``apply_gradients`` does this on first use; call it to create the
        slots earlier (in the cross-replica context: creating variables is
        collective under a multi-worker strategy).

        Example: ``opt.build(model.trainable_variables); opt.get_slot(v, "m")``.
        """
        self._build(list(var_list))

    def _build(self, variables: list[Any]) -> None:
        new = [v for v in variables if id(v) not in self._entries]
        if not new:
            return
        for v in new:
            self._check_variable(v)
        first = new[0]
        if isinstance(first, (DistributedVariable, AggregatingVariable)):
            strategy = first.distribute_strategy
            self._sharding = sharded.sharding_of(strategy)
            it = self._iterations
            if it is None or not isinstance(it, (DistributedVariable, AggregatingVariable)):
                self._iterations = self._new_iterations(strategy, self.current_step())
            elif it.distribute_strategy is not strategy:
                raise ValueError(
                    f"optimizer {self._name!r} was created in the scope of "
                    f"{it.distribute_strategy!r} but variable {first.name!r} belongs to "
                    f"{strategy!r}; create the optimizer and the variables in one strategy scope"
                )
        elif self._iterations is None:
            self._iterations = self._new_iterations(None, 0)
        slot_names = self.slot_names()
        touched: set[np.dtype] = set()
        for v in new:
            dtype = np.dtype(v.dtype)
            group = self._groups.get(dtype)
            if group is None:
                group = self._groups[dtype] = _Group(dtype, slot_names)
            slots = {}
            proto = _component(v, 0)._value
            for s in slot_names if self._sharding is None else ():
                initial = array_module(proto).full(proto.shape, self._slot_initial_value(s), dtype)
                agg = VariableAggregation.MEAN
                slots[s] = self._make_variable(v, initial, f"{v.name}/{s}", agg)
            group.add(v, slots)
            self._entries[id(v)] = (v, slots)
            self._order.append(v)
            touched.add(dtype)
        deferred = getattr(self, "_checkpoint_deferred", None)
        if deferred is not None:  # slot values restored from a checkpoint before they existed
            deferred.apply(self, new)
        for dtype in touched:
            self._groups[dtype].build(_num_local(first))

    def _check_variable(self, v: Any) -> None:
        if not isinstance(v, Variable):
            raise TypeError(
                f"apply_gradients expects (gradient, variable) pairs with hpcdist Variables; got "
                f"{type(v).__name__} {v!r} as a variable"
            )
        if isinstance(v, SyncOnReadVariable):
            raise TypeError(
                f"variable {v.name!r} is a SyncOnReadVariable; optimizers update mirrored or "
                "plain variables (create it with synchronization AUTO or ON_WRITE)"
            )
        if np.dtype(v.dtype) not in SUPPORTED_DTYPES:
            raise TypeError(
                f"variable {v.name!r} has dtype {v.dtype}; {type(self).__name__} updates float32 "
                "and float64 variables only (create the variable with one of those dtypes)"
            )
        key = (
            v.distribute_strategy if isinstance(v, DistributedVariable) else None,
            _num_local(v),
        )
        if self._strategy_key is None:
            self._strategy_key = key
        elif key[0] is not self._strategy_key[0] or key[1] != self._strategy_key[1]:
            kind = "a plain variable" if key[0] is None else f"a variable of {key[0]!r}"
            raise ValueError(
                f"variable {v.name!r} is {kind}, but optimizer {self._name!r} already updates "
                "variables of another kind or strategy; use one optimizer per strategy"
            )

    def get_slot(self, var: Any, slot_name: str) -> Any:
        """The slot variable ``slot_name`` of ``var`` (e.g. ``"m"`` and ``"v"`` for Adam).

        Example: ``opt.get_slot(w, "momentum")`` after the first step.
        """
        entry = self._entries.get(id(var))
        if self._sharding is not None:
            raise ShardingError(
                f"optimizer {self._name!r} is sharded (experimental_sharding="
                f"{self._sharding!r}): it has no slot variables, each worker holds its slice "
                "of the slots as flat arrays (optimizer._shards)"
            )
        if entry is None:
            raise KeyError(
                f"optimizer {self._name!r} has no slots for variable "
                f"{getattr(var, 'name', var)!r}; it gets them at its first apply_gradients "
                "(or build(var_list))"
            )
        name = self._SLOT_ALIASES.get(slot_name, slot_name)
        slots = entry[1]
        if name not in slots:
            raise KeyError(
                f"{type(self).__name__} has no slot {slot_name!r}; its slots are "
                f"{list(slots) or 'none (with these settings)'}"
            )
        return slots[name]

    def get_slot_names(self) -> list[str]:
        """The names of the slots each variable gets.

        Example: ``Adam(amsgrad=True).get_slot_names() == ["m", "v", "vhat"]``.
        """
        return list(self.slot_names())

    def variables(self) -> list[Any]:
        """``iterations`` and every slot variable, in creation order.

        Example: ``len(SGD(momentum=0.9).variables())`` is ``1 + number of variables`` after a step.
        """
        out = [self.iterations]
        for v in self._order:
            out.extend(self._entries[id(v)][1].values())
        return out

    # -- configuration ---------------------------------------------------------------------
    def get_config(self) -> dict[str, Any]:
        """The constructor arguments (a schedule as ``{"class_name", "config"}``).

        Example: ``type(opt).from_config(opt.get_config())`` is an equal new optimizer.
        """
        return {
            "name": self._name,
            "learning_rate": schedules.serialize(self._learning_rate)
            if isinstance(self._learning_rate, (schedules.LearningRateSchedule, int, float))
            else self._learning_rate,
            "weight_decay": self.weight_decay,
            "clipnorm": self.clipnorm,
            "global_clipnorm": self.global_clipnorm,
            "clipvalue": self.clipvalue,
        }

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> Optimizer:
        """A new optimizer from :meth:`get_config`'s output.

        Example: ``Adam.from_config({"learning_rate": 0.01})``.
        """
        config = dict(config)
        if isinstance(config.get("learning_rate"), dict):
            config["learning_rate"] = schedules.deserialize(config["learning_rate"])
        return cls(**config)

    def __repr__(self) -> str:
        return f"<hpcdist.optimizers.{type(self).__name__} name={self._name!r}>"

    # -- applying ---------------------------------------------------------------------------
    def apply_gradients(
        self,
        grads_and_vars: Iterable[tuple[Any, Any]],
        name: str | None = None,
        skip_gradients_aggregation: bool = False,
        experimental_aggregate_gradients: bool = True,
    ) -> Variable:
        """Apply ``(gradient, variable)`` pairs; returns ``iterations`` (incremented by one).

        Inside ``strategy.run`` the replicas' gradients are summed over all
        replicas and workers first (one merge call, one allreduce) unless
        ``skip_gradients_aggregation`` is true or
        ``experimental_aggregate_gradients`` is false.

        Example: ``optimizer.apply_gradients(zip(grads, model.trainable_variables))``.
        """
        # torch/jax/tf gradients: NumPy/CuPy views of their memory (hpcdist.arrays)
        grads_and_vars = [
            (import_array(p[0]), p[1]) if isinstance(p, tuple) and len(p) == 2 else p
            for p in grads_and_vars
        ]
        if remote_updates.targets_ps(grads_and_vars):  # the ps runs it (ParameterServerStrategy)
            return remote_updates.apply_gradients(RemoteView(self), grads_and_vars)
        grads, variables, every = self._filter(grads_and_vars)
        aggregate = not skip_gradients_aggregation and bool(experimental_aggregate_gradients)
        ctx = context.get_replica_context()
        if ctx is not None and ctx.strategy is not context.default_strategy():
            self._check_replica_variables(ctx.strategy, variables)
            merge = functools.partial(
                self._merge_apply, variables=tuple(variables), every=every, aggregate=aggregate
            )
            key = ("apply_gradients", id(self), aggregate, tuple(id(v) for v in variables))
            return ctx.merge_call(merge, (tuple(grads),), key=key)
        num_local = _num_local(variables[0])
        if any(isinstance(g, DistributedValues) for g in grads):
            for g in grads:
                if isinstance(g, DistributedValues) and len(g.values) != num_local:
                    raise ValueError(
                        f"a gradient has {len(g.values)} per-replica components but the "
                        f"variables have {num_local}; they come from different strategies"
                    )
            per_replica = [list(select_replica(i, grads)) for i in range(num_local)]
            return self._apply(None, variables, every, per_replica, False)
        return self._apply(None, variables, every, [list(grads)], False)

    def _merge_apply(
        self, strategy: Any, grads: Any, *, variables: tuple, every: list, aggregate: bool
    ) -> Variable:
        k = strategy.extended.num_local_replicas
        per_replica = [list(select_replica(i, grads)) for i in range(k)]
        return self._apply(strategy, list(variables), every, per_replica, aggregate)

    def _filter(self, grads_and_vars: Iterable[tuple[Any, Any]]) -> tuple[list, list, list]:
        """``(grads, variables with a gradient, every variable)`` of the pairs, checked."""
        pairs = list(grads_and_vars)
        grads, variables, missing = [], [], []
        seen: set[int] = set()
        for pair in pairs:
            if not (isinstance(pair, (tuple, list)) and len(pair) == 2):
                raise TypeError(
                    f"apply_gradients expects (gradient, variable) pairs, got {pair!r}; "
                    "write apply_gradients(zip(grads, variables))"
                )
            g, v = pair
            if id(v) not in self._entries:
                self._check_variable(v)
            if id(v) in seen:
                raise ValueError(
                    f"variable {v.name!r} appears twice in grads_and_vars; pass each variable "
                    "once (sum its gradients first)"
                )
            seen.add(id(v))
            if g is None:
                missing.append(v.name)
                continue
            grads.append(g)
            variables.append(v)
        self._check_missing(pairs, variables, missing, stacklevel=4)
        return grads, variables, [v for _, v in pairs]

    def _check_missing(self, pairs: list, variables: list, missing: list, stacklevel: int) -> None:
        """Raise when no variable has a gradient; warn (once) about those without one."""
        if not variables:
            names = [getattr(v, "name", v) for _, v in pairs]
            raise ValueError(
                f"No gradients provided for any variable: {names}. Every gradient is None; "
                "check that the loss depends on the variables"
            )
        if missing and tuple(missing) not in self._warned:
            self._warned.add(tuple(missing))
            warnings.warn(
                f"Gradients do not exist for variables {missing} when minimizing the loss; "
                "they are not updated",
                stacklevel=stacklevel,
            )

    def _check_replica_variables(self, strategy: Any, variables: list[Any]) -> None:
        k = strategy.extended.num_local_replicas
        for v in variables:
            if isinstance(v, (DistributedVariable, AggregatingVariable)):
                if v.distribute_strategy is not strategy:
                    raise ValueError(
                        f"variable {v.name!r} belongs to {v.distribute_strategy!r}, not to "
                        f"{strategy!r} which runs this replica function"
                    )
            elif k > 1:
                raise TypeError(
                    f"variable {v.name!r} is not a MirroredVariable of {strategy!r}, so its "
                    f"{k} replicas cannot update it; create the variables inside "
                    "strategy.scope()"
                )

    def _apply(
        self,
        strategy: Any,
        variables: list[Any],
        every: list[Any],
        replica_grads: list[list[Any]],
        aggregate: bool,
    ) -> Variable:
        """Pack, reduce, clip and update (runs once, in the cross-replica context).

        ``every`` holds all the variables of the call, those with ``None``
        gradients too: they get slots and a place in the flat buffers (as
        Keras builds with all of them), so the layout does not change when a
        gradient is missing.
        """
        self._build(every)
        step = self.current_step()
        lr = self._lr_at(step)
        slot_names = self.slot_names()
        position = {id(v): j for j, v in enumerate(variables)}
        work = []
        for group in self._groups.values():
            if group.slot_names != slot_names:
                raise ValueError(
                    f"{type(self).__name__} {self._name!r}: its settings changed after its "
                    f"slots {list(group.slot_names)} were made (now {list(slot_names)}); "
                    "make a new optimizer instead"
                )
            idx = [position.get(id(v)) for v in group.variables]
            runs = _runs(idx)
            if runs:
                work.append((group, idx, runs))
        reduced = aggregate and strategy is not None and strategy.num_replicas_in_sync > 1
        # Unreduced gradients are clipped in place: then they must be the optimizer's copy.
        clips = not (self.clipnorm is None and self.global_clipnorm is None)
        alias_ok = reduced or not (clips or self.clipvalue is not None)
        if self._sharding is not None:
            if not reduced and strategy is not None and strategy.num_replicas_in_sync > 1:
                raise ShardingError(
                    f"experimental_sharding={self._sharding!r}: the gradients must be summed "
                    "over the workers (each updates its slice); drop skip_gradients_aggregation"
                )
            sharded.apply(self, strategy, work, replica_grads, lr, step, alias_ok)
            self._iterations.assign_add(np.int64(1))
            return self._iterations
        packed = [
            [self._pack(group, r, idx, grads, alias_ok) for group, idx, _ in work]
            for r, grads in enumerate(replica_grads)
        ]
        if reduced:
            leaves = [
                PerReplica(tuple(p[a] for p in packed)) if len(packed) > 1 else packed[0][a]
                for a in range(len(work))
            ]
            on_gpus = getattr(strategy.extended, "local_gpu_all_reduce", None)
            per_replica = on_gpus(ReduceOp.SUM, leaves) if on_gpus is not None else None
            if per_replica is not None:  # several local GPUs: summed on them (NCCL)
                sources = per_replica
            else:
                with span("gradient reduction"):  # the timeline's fit phase (off: a no-op)
                    sources = [strategy.extended.reduce_leaves(ReduceOp.SUM, leaves)]
        else:
            sources = packed
        for grads in sources:
            self._clip(work, grads)
        num_local = len(work[0][0].params)
        if len(sources) > 1 and len(sources) != num_local:
            raise ValueError(
                f"{len(sources)} replicas' gradients cannot each update the single copy of the "
                f"variables of {strategy!r} (they are not mirrored); let apply_gradients sum "
                "them (skip_gradients_aggregation=False, experimental_aggregate_gradients=True)"
            )
        hypers = {group.dtype: self.hyper_parameters(lr, step, group.dtype) for group, _, _ in work}
        for local_id in range(num_local):
            grads = sources[local_id if len(sources) > 1 else 0]
            for (group, _, runs), g in zip(work, grads, strict=True):
                self._update_group(group, local_id, g, runs, hypers[group.dtype])
        self._iterations.assign_add(np.int64(1))
        return self._iterations

    def _pack(
        self, group: _Group, r: int, idx: list[int | None], grads: list[Any], alias_ok: bool = True
    ) -> Any:
        """The gradients of ``group``'s variables from replica ``r`` in its flat buffer."""
        buf = group.grad_buffer(r)
        xp = array_module(buf)
        pieces: list[Any] = []
        for v, i in zip(group.variables, idx, strict=True):
            if i is None:
                pieces.append(None)
                continue
            g = grads[i]
            if isinstance(g, Variable):
                g = g.raw_value()
            g = asarray(g)
            if tuple(g.shape) != tuple(v.shape):
                raise ValueError(
                    f"the gradient for variable {v.name!r} has shape {tuple(g.shape)} but the "
                    f"variable has shape {tuple(v.shape)}; they must match"
                )
            if g.dtype.kind not in "fiu":
                raise TypeError(
                    f"the gradient for variable {v.name!r} has dtype {g.dtype}; expected a "
                    "float (or integer) array"
                )
            pieces.append(_like(g, buf).reshape(-1))
        flat = _one_buffer(pieces, group) if alias_ok else None
        if flat is not None:
            return flat
        with on_device_of(buf):
            if all(p is not None for p in pieces):
                xp.concatenate(pieces, out=buf)
                return buf
            for j, p in enumerate(pieces):
                lo, hi = group.offsets[j], group.offsets[j + 1]
                if p is None:
                    buf[lo:hi] = 0
                else:
                    buf[lo:hi] = p
        return buf

    def _clip(self, work: list, grads: list[Any]) -> None:
        """Clip the flat gradients in place (the ranges that hold gradients)."""
        if self.clipnorm is None and self.global_clipnorm is None and self.clipvalue is None:
            return
        with on_device_of(grads[0]):
            self._clip_on_device(work, grads)

    def _clip_on_device(self, work: list, grads: list[Any]) -> None:
        if self.clipnorm is not None:
            c = self.clipnorm
            for (group, idx, _), g in zip(work, grads, strict=True):
                k = kernels_for(g)
                for j, i in enumerate(idx):
                    if i is None:
                        continue
                    seg = g[group.offsets[j] : group.offsets[j + 1]]
                    norm = math.sqrt(k.sum_squares(seg))
                    if norm > c:
                        k.scale(seg, c / norm)
        elif self.global_clipnorm is not None:
            total = 0.0
            for (group, _, runs), g in zip(work, grads, strict=True):
                k = kernels_for(g)
                for a, b in runs:
                    total += k.sum_squares(g[group.offsets[a] : group.offsets[b]])
            factor = global_scale(math.sqrt(total), self.global_clipnorm)
            if factor != 1.0:
                for (group, _, runs), g in zip(work, grads, strict=True):
                    k = kernels_for(g)
                    for a, b in runs:
                        k.scale(g[group.offsets[a] : group.offsets[b]], factor)
        elif self.clipvalue is not None:
            for (group, _, runs), g in zip(work, grads, strict=True):
                k = kernels_for(g)
                for a, b in runs:
                    k.clip_values(g[group.offsets[a] : group.offsets[b]], self.clipvalue)

    def _update_group(
        self, group: _Group, local_id: int, g: Any, runs: list[tuple[int, int]], hyper: Any
    ) -> None:
        """One kernel call per range of ``runs`` (one in all when every variable has a gradient)."""
        params = group.params[local_id]
        params.ensure()
        slots = {}
        for name, bufs in group.slots.items():
            buf = bufs[local_id]
            if not buf.ensure():
                buf.make_private()
            slots[name] = buf
        g = _like(g, params.views[0])
        out_of_place = params.shared()  # before any local reference to params.flat
        p_in = params.flat
        p_out = empty_like(p_in, params.total) if out_of_place else p_in
        k = kernels_for(p_in)
        offsets = group.offsets
        with on_device_of(p_in):
            if out_of_place:
                covered = 0
                for a, b in runs:
                    if offsets[a] > covered:
                        p_out[covered : offsets[a]] = p_in[covered : offsets[a]]
                    covered = offsets[b]
                if covered < params.total:
                    p_out[covered:] = p_in[covered:]
            if runs == [(0, len(group.variables))]:
                state = {name: buf.flat for name, buf in slots.items()}
                self._update(k, p_in, p_out, g, state, hyper)
            else:
                for a, b in runs:
                    lo, hi = offsets[a], offsets[b]
                    state = {name: buf.flat[lo:hi] for name, buf in slots.items()}
                    seg = p_in[lo:hi]
                    out = seg if p_out is p_in else p_out[lo:hi]
                    self._update(k, seg, out, g[lo:hi], state, hyper)
        if out_of_place:
            del p_in
            params.rebind(p_out)
