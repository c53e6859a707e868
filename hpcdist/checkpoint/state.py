"""Adapters: the checkpoint state protocol for types that do not implement it themselves.

An object can be put in a :class:`~hpcdist.checkpoint.Checkpoint` when it has
``_checkpoint_state() -> (arrays, meta)`` and ``_restore_checkpoint_state(arrays, meta)``
(host NumPy arrays keyed by plain names; JSON-able meta). :func:`adapt` gives
one for:

* ``hd.Variable`` and the distributed variables (one array ``"value"``),
  ``ShardedVariable`` (the whole value);
* a model: any object with ``weights``, ``get_weights`` and ``set_weights``
  (:class:`WeightsOwner`, which ``hpcdist.nn.Model`` implements), its ``weights``
  keyed by position, checked by shape. The checkpoint layer defines this protocol
  and never imports ``hpcdist.nn`` (a layer above it);
* an ``Optimizer`` (``iterations`` and every slot, keyed ``"slot/<i>/<name>"`` by the
  position of the variable in the optimizer). Restoring into an optimizer that has
  no slots yet is *deferred*: the values wait on the optimizer and are applied when
  ``build`` or the first ``apply_gradients`` creates the slots;
* ``np.random.Generator`` and ``np.random.RandomState`` (meta = the bit generator's state,
  so each worker gets its own stream back).

Adapters may also have ``_check_checkpoint_state(arrays, meta)`` (raise before anything is
assigned), ``_checkpoint_pending()`` (values still waiting) and ``_ps_variables()``
(variables whose state lives on a parameter server: saved by the ps itself).

Example:
    >>> import numpy as np, hpcdist as hd
    >>> v = hd.Variable(np.array([1.0, 2.0]))
    >>> arrays, meta = adapt(v)._checkpoint_state()
    >>> arrays["value"]
    array([1., 2.])
    >>> adapt(v)._restore_checkpoint_state({"value": np.array([5.0, 6.0])}, meta)
    >>> v.numpy()
    array([5., 6.])
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

import numpy as np

from hpcdist.arrays import to_host
from hpcdist.distribute.ps.variable import PSVariable
from hpcdist.distribute.sharded_variable import ShardedVariable
from hpcdist.distribute.variables import Variable
from hpcdist.errors import CheckpointError, ShardingError
from hpcdist.optimizers.optimizer import Optimizer

__all__ = ["WeightsOwner", "adapt", "has_protocol", "ps_variables_of"]


@runtime_checkable
class WeightsOwner(Protocol):
    """A model as the checkpoint sees it: its variables, and their values read and set.

    ``hpcdist.nn.Model`` implements it; so can any user class.

    Example:
        >>> isinstance(object(), WeightsOwner)
        False
    """

    @property
    def weights(self) -> list[Any]:
        """The model's variables, in a fixed order."""
        ...

    def get_weights(self) -> list[np.ndarray]:
        """The variables' values."""
        ...

    def set_weights(self, weights: Any) -> None:
        """Assign the variables' values."""
        ...


def has_protocol(obj: Any) -> bool:
    """Whether ``obj`` implements the checkpoint state protocol itself.

    Example:
        >>> has_protocol(object())
        False
    """
    return callable(getattr(obj, "_checkpoint_state", None)) and callable(
        getattr(obj, "_restore_checkpoint_state", None)
    )


def _is_ps_variable(v: Any) -> bool:
    if isinstance(v, ShardedVariable):
        return any(isinstance(s, PSVariable) for s in v.variables)
    return isinstance(v, PSVariable)


def ps_variables_of(adapter: Any) -> list:
    """The parameter-server variables of an adapted object (``[]`` for most).

    Example:
        >>> ps_variables_of(adapt(np.random.default_rng(0)))
        []
    """
    fn = getattr(adapter, "_ps_variables", None)
    return list(fn()) if callable(fn) else []


def _host(x: Any) -> np.ndarray:
    value = x.raw_value() if hasattr(x, "raw_value") else np.asarray(x)
    return np.array(to_host(value), copy=True)


def _check_array(owner: str, name: str, saved: np.ndarray, shape: Any, dtype: Any) -> None:
    if tuple(saved.shape) != tuple(shape) or np.dtype(saved.dtype) != np.dtype(dtype):
        raise CheckpointError(
            f"{owner}: the checkpoint holds {name} with shape {tuple(saved.shape)} and dtype "
            f"{saved.dtype}, but this program's has shape {tuple(shape)} and dtype "
            f"{np.dtype(dtype)}; restore into objects built like the saved ones"
        )


def _need(owner: str, arrays: dict, names: list[str]) -> None:
    missing = [n for n in names if n not in arrays]
    if missing:
        raise CheckpointError(
            f"{owner}: the checkpoint lacks {missing} (it holds {sorted(arrays)}); it was saved "
            "from a different kind of object"
        )


class VariableState:
    """A variable (plain, mirrored, sync-on-read, sharded): one array ``"value"``.

    Example: ``VariableState(v)._checkpoint_state()[0]["value"]`` is ``v.numpy()``.
    """

    def __init__(self, var: Any) -> None:
        self.var = var

    def _owner(self) -> str:
        return f"variable {getattr(self.var, 'name', '?')!r}"

    def _ps_variables(self) -> list:
        return [self.var] if _is_ps_variable(self.var) else []

    def _checkpoint_state(self) -> tuple[dict[str, np.ndarray], dict]:
        if self._ps_variables():
            return {}, {}
        return {"value": _host(self.var)}, {}

    def _check_checkpoint_state(self, arrays: dict, meta: dict) -> None:
        if self._ps_variables():
            return
        _need(self._owner(), arrays, ["value"])
        _check_array(self._owner(), "its value", arrays["value"], self.var.shape, self.var.dtype)

    def _restore_checkpoint_state(self, arrays: dict, meta: dict) -> None:
        self._check_checkpoint_state(arrays, meta)
        if not self._ps_variables():
            self.var.assign(arrays["value"])


class ModelState:
    """A model's ``weights``, keyed by position (``"0"``, ``"1"``, ...), checked by shape.

    Example: ``ModelState(model)._checkpoint_state()[0]["0"]`` is the first weight.
    """

    def __init__(self, model: Any) -> None:
        self.model = model

    def _owner(self) -> str:
        return f"model {getattr(self.model, 'name', '?')!r}"

    def _ps_variables(self) -> list:
        return [v for v in self.model.weights if _is_ps_variable(v)]

    def _checkpoint_state(self) -> tuple[dict[str, np.ndarray], dict]:
        weights = self.model.weights
        arrays = {str(i): _host(v) for i, v in enumerate(weights) if not _is_ps_variable(v)}
        return arrays, {"names": [str(v.name) for v in weights]}

    def _check_checkpoint_state(self, arrays: dict, meta: dict) -> None:
        weights = self.model.weights
        saved = meta.get("names") if isinstance(meta, dict) else None
        count = len(saved) if isinstance(saved, list) else len(arrays)
        if count != len(weights):
            hint = "" if weights else " (it is not built yet: build it first)"
            raise CheckpointError(
                f"{self._owner()}: the checkpoint holds {count} weights, but the model has "
                f"{len(weights)}{hint}; restore into a model with the same layers"
            )
        local = [str(i) for i, v in enumerate(weights) if not _is_ps_variable(v)]
        _need(self._owner(), arrays, local)
        for i in local:
            v = weights[int(i)]
            _check_array(self._owner(), f"weight {i} ({v.name!r})", arrays[i], v.shape, v.dtype)

    def _restore_checkpoint_state(self, arrays: dict, meta: dict) -> None:
        self._check_checkpoint_state(arrays, meta)
        for i, v in enumerate(self.model.weights):
            if not _is_ps_variable(v):
                v.assign(arrays[str(i)])


class _DeferredSlots:
    """Slot values waiting for the optimizer to create the slots (applied in ``_build``)."""

    def __init__(self, owner: str, slots: dict[int, dict[str, np.ndarray]]) -> None:
        self.owner = owner
        self.slots = slots

    def apply(self, optimizer: Any, new: list[Any]) -> None:
        """Assign the waiting values of the variables ``new`` (just given slots)."""
        position = {id(v): i for i, v in enumerate(optimizer.ordered_variables)}
        for v in new:
            i = position.get(id(v))
            values = self.slots.get(i) if i is not None else None
            if i is None or values is None:
                continue
            slots = optimizer._entries[id(v)][1]
            for name, value in values.items():
                _check_array(self.owner, f"slot {name!r} of variable {i} ({v.name!r})",
                             value, v.shape, v.dtype)  # fmt: skip
            for name, value in values.items():
                slots[name].assign(value)
            del self.slots[i]
        if not self.slots:
            optimizer._checkpoint_deferred = None


class OptimizerState:
    """An optimizer's ``iterations`` and slots; restore is deferred for missing slots.

    Example: ``OptimizerState(opt)._checkpoint_state()[0]["iterations"]``.
    """

    def __init__(self, optimizer: Any) -> None:
        self.opt = optimizer

    def _owner(self) -> str:
        return f"optimizer {self.opt.name!r}"

    def _ps_variables(self) -> list:
        it = self.opt.created_iterations
        return [it] if it is not None and _is_ps_variable(it) else []

    def _checkpoint_state(self) -> tuple[dict[str, np.ndarray], dict]:
        opt = self.opt
        if getattr(opt, "sharding", None) is not None:
            raise ShardingError(
                f"{self._owner()} is sharded (experimental_sharding={opt.sharding!r}): each "
                "worker holds a slice of its slots, which Checkpoint does not gather. Save it "
                "with hpcdist.checkpoint.sharded.save_optimizer (every worker writes its slice)"
            )
        step = int(opt.created_iterations) if self._ps_variables() else opt.current_step()
        arrays = {"iterations": np.asarray(np.int64(step))}
        names = list(opt.slot_names())
        for i, v in enumerate(opt.ordered_variables):
            slots = opt._entries[id(v)][1]
            for s in names:
                arrays[f"slot/{i}/{s}"] = _host(slots[s])
        meta = {"class": type(opt).__name__, "slot_names": names,
                "variables": [str(v.name) for v in opt.ordered_variables]}  # fmt: skip
        return arrays, meta

    def _split(self, arrays: dict, meta: dict) -> dict[int, dict[str, np.ndarray]]:
        opt = self.opt
        _need(self._owner(), arrays, ["iterations"])
        it = arrays["iterations"]
        if it.shape != () or it.dtype.kind not in "iu":
            raise CheckpointError(f"{self._owner()}: the saved iterations is not an integer")
        saved_class = meta.get("class") if isinstance(meta, dict) else None
        if saved_class is not None and saved_class != type(opt).__name__:
            raise CheckpointError(
                f"{self._owner()}: the checkpoint holds the state of a {saved_class}, but this "
                f"optimizer is a {type(opt).__name__}; restore into the same kind of optimizer"
            )
        names = list(opt.slot_names())
        slots: dict[int, dict[str, np.ndarray]] = {}
        for key, value in arrays.items():
            if key == "iterations":
                continue
            parts = key.split("/")
            if len(parts) != 3 or parts[0] != "slot" or not parts[1].isdigit():
                raise CheckpointError(f"{self._owner()}: unexpected saved array {key!r}")
            if parts[2] not in names:
                raise CheckpointError(
                    f"{self._owner()}: the checkpoint has slot {parts[2]!r}, but this optimizer's "
                    f"slots are {names}; create it with the same settings (momentum, amsgrad)"
                )
            slots.setdefault(int(parts[1]), {})[parts[2]] = value
        for i, values in slots.items():
            if set(values) != set(names):
                raise CheckpointError(
                    f"{self._owner()}: variable {i} has slots {sorted(values)} in the checkpoint, "
                    f"expected {names}"
                )
        for i, v in enumerate(opt.ordered_variables):
            for name, value in slots.get(i, {}).items():
                _check_array(self._owner(), f"slot {name!r} of variable {i} ({v.name!r})",
                             value, v.shape, v.dtype)  # fmt: skip
        return slots

    def _check_checkpoint_state(self, arrays: dict, meta: dict) -> None:
        self._split(arrays, meta)

    def _restore_checkpoint_state(self, arrays: dict, meta: dict) -> None:
        opt = self.opt
        slots = self._split(arrays, meta)
        opt.iterations = int(arrays["iterations"])
        for i, v in enumerate(opt.ordered_variables):
            values = slots.pop(i, None)
            if values:
                entry = opt._entries[id(v)][1]
                for name, value in values.items():
                    entry[name].assign(value)
        opt._checkpoint_deferred = _DeferredSlots(self._owner(), slots) if slots else None

    def _checkpoint_pending(self) -> bool:
        deferred = getattr(self.opt, "_checkpoint_deferred", None)
        return bool(deferred is not None and deferred.slots)


def _encode(x: Any) -> Any:
    """A bit generator state as JSON (arrays become ``{"__ndarray__": ...}``)."""
    if isinstance(x, np.ndarray):
        return {"__ndarray__": x.dtype.str, "shape": list(x.shape), "data": x.ravel().tolist()}
    if isinstance(x, dict):
        return {str(k): _encode(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_encode(v) for v in x]
    if isinstance(x, np.generic):
        return x.item()
    return x


def _decode(x: Any) -> Any:
    if isinstance(x, dict):
        if "__ndarray__" in x:
            dtype = np.dtype(x["__ndarray__"])
            if dtype.kind not in "biuf":
                raise CheckpointError(f"a saved random state has an array of dtype {dtype}")
            return np.array(x["data"], dtype=dtype).reshape(x["shape"])
        return {k: _decode(v) for k, v in x.items()}
    if isinstance(x, list):
        return [_decode(v) for v in x]
    return x


class GeneratorState:
    """A ``np.random.Generator`` or ``RandomState``: meta = its bit generator's state.

    Example:
        >>> g = np.random.default_rng(3)
        >>> arrays, meta = GeneratorState(g)._checkpoint_state()
        >>> first = g.random()
        >>> GeneratorState(g)._restore_checkpoint_state(arrays, meta)
        >>> g.random() == first
        True
    """

    def __init__(self, rng: Any) -> None:
        self.rng = rng

    def _get(self) -> dict:
        if isinstance(self.rng, np.random.RandomState):
            return self.rng.get_state(legacy=False)
        return self.rng.bit_generator.state

    def _checkpoint_state(self) -> tuple[dict[str, np.ndarray], dict]:
        return {}, {"state": _encode(self._get())}

    def _check_checkpoint_state(self, arrays: dict, meta: dict) -> None:
        state = meta.get("state") if isinstance(meta, dict) else None
        want = self._get().get("bit_generator")
        found = state.get("bit_generator") if isinstance(state, dict) else None
        if found != want:
            raise CheckpointError(
                f"random generator: the checkpoint holds a {found!r} state, but this generator "
                f"uses {want!r}; create it with the same bit generator"
            )

    def _restore_checkpoint_state(self, arrays: dict, meta: dict) -> None:
        self._check_checkpoint_state(arrays, meta)
        try:
            state = _decode(meta["state"])
            if isinstance(self.rng, np.random.RandomState):
                self.rng.set_state(state)
            else:
                self.rng.bit_generator.state = state
        except (TypeError, ValueError, KeyError, OverflowError) as error:
            raise CheckpointError(
                f"random generator: the saved state does not fit ({error})"
            ) from None


def adapt(obj: Any) -> Any:
    """The object that saves and restores ``obj``'s state (``obj`` itself if it can).

    Raises ``TypeError`` for objects that cannot be checkpointed.

    Example:
        >>> type(adapt(np.random.default_rng(0))).__name__
        'GeneratorState'
    """
    if has_protocol(obj):
        return obj
    if isinstance(obj, (Variable, ShardedVariable)):
        return VariableState(obj)
    if isinstance(obj, Optimizer):
        return OptimizerState(obj)
    if isinstance(obj, WeightsOwner):
        return ModelState(obj)
    if isinstance(obj, (np.random.Generator, np.random.RandomState)):
        return GeneratorState(obj)
    raise TypeError(
        f"a Checkpoint cannot track {obj!r:.80} (type {type(obj).__name__}); it tracks variables, "
        "models, optimizers, NumPy random generators, distributed iterators, Checkpoints, and "
        "any object with _checkpoint_state() and _restore_checkpoint_state(arrays, meta)"
    )
