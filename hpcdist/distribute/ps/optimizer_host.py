"""The optimizers a parameter server runs: one per ``opt_id``, slots per (optimizer, variable).

Clients register an optimizer by class name and ``get_config()``; the ps
builds it with :func:`hpcdist.optimizers.deserialize` (the learning rate in the
config is ignored: every apply brings its own ``lr``) and updates its
variables in place with the optimizer's fused Numba kernel
(``opt._update(k, p, p, g, slots, opt.hyper_parameters(lr, step, dtype))``). Slots are
zeros at a variable's first update; ``step`` is the number of updates this
optimizer already applied to that variable (Adam's bias correction).

Clipping: ``clipnorm`` (per variable) and ``clipvalue`` (per element) are
applied to each gradient here; ``global_clipnorm`` spans variables on
several servers, so the client applies it before sending.

A sparse update (rows of an embedding) sums duplicate rows, then runs the
optimizer on those rows only, parameters and slots alike ("lazy" updates).

Example:
    >>> import numpy as np
    >>> host = OptimizerHost()
    >>> host.register(0, "SGD", {"learning_rate": 0.1, "momentum": 0.0})
    >>> p = np.array([1.0, 2.0])
    >>> host.apply_dense(0, 7, p, np.array([1.0, -1.0]), lr=0.5)
    >>> p, host.step(0, 7)
    (array([0.5, 2.5]), 1)
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from typing import Any

import numpy as np

from hpcdist.distribute.ps.protocol import OPTIMIZER_CLASSES, PSError, PSTypeError
from hpcdist.kernels import optim as kernels

_FLOATS = (np.dtype(np.float32), np.dtype(np.float64))

#: Builds the ps-side optimizer of ``(class_name, config)``: an object with ``clipnorm``,
#: ``clipvalue``, ``slot_names()``, ``hyper_parameters(lr, step, dtype)`` and ``_update(...)``.
OptimizerFactory = Callable[[str, dict[str, Any]], Any]
_factories: list[OptimizerFactory] = []


def register_optimizer_factory(factory: OptimizerFactory) -> None:
    """Set how the ps builds optimizers (``hpcdist.optimizers`` registers its ``deserialize``).

    The ps layer sits below the optimizers: it defines this registration point and the
    optimizers package fills it when imported (``import hpcdist`` imports it).

    Example: ``register_optimizer_factory(lambda name, cfg: deserialize(...))``.
    """
    _factories[:] = [factory]


def _build_optimizer(class_name: str, config: dict[str, Any]) -> Any:
    if not _factories:
        raise PSError(
            "no optimizer factory is registered with the parameter server; import "
            "hpcdist.optimizers (import hpcdist does) on the ps ranks before serving"
        )
    return _factories[0](class_name, config)


class _State:
    """The slots (flat, one per slot name) and the update count of one (optimizer, variable)."""

    __slots__ = ("slots", "step")

    def __init__(self, names: tuple[str, ...], size: int, dtype: np.dtype) -> None:
        self.slots = {name: np.zeros(size, dtype) for name in names}
        self.step = 0


def _config_key(class_name: str, config: dict[str, Any]) -> str:
    """What must agree between two registrations of one ``opt_id`` (all but the learning rate)."""
    rest = {k: v for k, v in config.items() if k != "learning_rate"}
    return json.dumps([class_name, rest], sort_keys=True)


class OptimizerHost:
    """The ps-side optimizers and their slots.

    Example:
        >>> host = OptimizerHost()
        >>> host.register(1, "Adam", {"learning_rate": 0.001})
        >>> sorted(host.slots(1, 0, np.zeros(3)))
        ['m', 'v']
    """

    def __init__(self) -> None:
        self._opts: dict[int, tuple[str, Any]] = {}
        self._keys: dict[int, str] = {}
        self._states: dict[tuple[int, int], _State] = {}
        self._configs: dict[int, dict[str, Any]] = {}
        self._restored: dict[int, str] = {}  # opt_id -> class of restored slots not yet registered

    def register(self, opt_id: int, class_name: str, config: dict[str, Any]) -> None:
        """Build optimizer ``opt_id``; a repeat with the same class and config is a no-op.

        Raises :class:`PSError` for an unknown class, a bad config, or another
        optimizer already registered under ``opt_id``.

        Example: ``host.register(0, "RMSprop", RMSprop(rho=0.8).get_config())``.
        """
        if class_name not in OPTIMIZER_CLASSES:
            raise PSError(
                f"the parameter server cannot run optimizer class {class_name!r}; expected one "
                f"of {', '.join(OPTIMIZER_CLASSES)}"
            )
        if not isinstance(config, dict):
            raise PSError(f"optimizer config must be a dict (get_config()), got {config!r}")
        key = _config_key(class_name, config)
        restored = self._restored.get(opt_id)
        if restored is not None and restored != class_name:
            raise PSError(
                f"a checkpoint restored {restored} slots for optimizer id {opt_id} on this "
                f"parameter server, but a client registers a {class_name} under that id. Create "
                "the optimizers in the same order as the program that saved the checkpoint"
            )
        if opt_id in self._keys:
            if self._keys[opt_id] != key:
                raise PSError(
                    f"optimizer id {opt_id} is already registered as {self._keys[opt_id]}; "
                    f"another client registers it as {key}. Every client must create the same "
                    "optimizers in the same order"
                )
            return
        cfg = dict(config)
        cfg["learning_rate"] = 0.0  # each apply brings its own lr; schedules stay on the clients
        try:
            opt = _build_optimizer(class_name, cfg)
        except (TypeError, ValueError) as e:
            raise PSError(f"cannot build optimizer {class_name} from config {config!r}: {e}") from e
        names = set(opt.slot_names())
        for (oid, vid), state in self._states.items():
            if oid == opt_id and set(state.slots) != names:
                raise PSError(
                    f"a checkpoint restored slots {sorted(state.slots)} of variable {vid} for "
                    f"optimizer id {opt_id}, but the registered {class_name} uses slots "
                    f"{sorted(names)}; configure it as in the program that saved the checkpoint"
                )
        self._opts[opt_id] = (class_name, opt)
        self._keys[opt_id] = key
        self._configs[opt_id] = dict(config)
        self._restored.pop(opt_id, None)

    def optimizer(self, opt_id: int) -> Any:
        """The optimizer registered as ``opt_id`` (:class:`PSError` if none).

        Example: ``host.optimizer(0).get_config()["momentum"]``.
        """
        entry = self._opts.get(opt_id)
        if entry is None:
            raise PSError(
                f"no optimizer is registered with id {opt_id} on this parameter server; call "
                "register_optimizer before apply"
            )
        return entry[1]

    def slots(self, opt_id: int, var_id: int, param: np.ndarray) -> dict[str, np.ndarray]:
        """The flat slot arrays of ``var_id`` under ``opt_id`` (created as zeros).

        Example: ``host.slots(0, 3, p)["momentum"].reshape(p.shape)``.
        """
        return self._state(opt_id, var_id, param).slots

    def step(self, opt_id: int, var_id: int) -> int:
        """How many updates ``opt_id`` applied to ``var_id`` so far.

        Example: ``host.step(0, 3) == 0`` before the first apply.
        """
        state = self._states.get((opt_id, var_id))
        return 0 if state is None else state.step

    def forget(self, var_id: int) -> None:
        """Drop every slot of ``var_id`` (when the variable is created anew)."""
        for key in [k for k in self._states if k[1] == var_id]:
            del self._states[key]

    # -- checkpoints ------------------------------------------------------------------------
    def export_states(self, var_ids: set[int]) -> list[dict[str, Any]]:
        """The optimizer state of the variables ``var_ids``: one dict per optimizer id with
        ``id``, ``class_name``, ``config`` and ``states`` (``{var_id: (step, {slot: flat})}``;
        the arrays are the live ones: copy or write them before the next update).

        Example:
            >>> host = OptimizerHost()
            >>> host.register(0, "SGD", {"learning_rate": 0.1, "momentum": 0.5})
            >>> host.apply_dense(0, 3, np.zeros(2), np.ones(2), lr=1.0)
            >>> [(o["class_name"], o["states"][3][0]) for o in host.export_states({3})]
            [('SGD', 1)]
        """
        out: dict[int, dict[str, Any]] = {}
        for (opt_id, var_id), state in sorted(self._states.items()):
            if var_id not in var_ids:
                continue
            entry = out.get(opt_id)
            if entry is None:
                registered = self._opts.get(opt_id)
                entry = out[opt_id] = {
                    "id": opt_id,
                    "class_name": registered[0] if registered else self._restored[opt_id],
                    "config": self._configs.get(opt_id, {}),
                    "states": {},
                }
            entry["states"][var_id] = (state.step, state.slots)
        return list(out.values())

    def registered(self) -> dict[int, str]:
        """The registered optimizers: ``{opt_id: class_name}``.

        Example:
            >>> host = OptimizerHost(); host.register(2, "Adam", {"learning_rate": 0.1})
            >>> host.registered()
            {2: 'Adam'}
        """
        return {oid: entry[0] for oid, entry in self._opts.items()}

    def import_state(
        self,
        opt_id: int,
        class_name: str,
        var_id: int,
        step: int,
        slots: dict[str, np.ndarray],
        dry_run: bool = False,
    ) -> None:
        """Set the state of ``var_id`` under ``opt_id`` (restoring a checkpoint).

        If ``opt_id`` is registered, its class and slot names must match; if not
        yet, the state waits for the registration, which must then be of
        ``class_name``. The slot arrays are kept, not copied. Raises :class:`PSError` on a
        mismatch; ``dry_run`` only checks.

        Example:
            >>> host = OptimizerHost()
            >>> host.import_state(0, "SGD", 3, 5, {"momentum": np.ones(2)})
            >>> host.register(0, "SGD", {"learning_rate": 0.1, "momentum": 0.5})
            >>> host.step(0, 3), host.slots(0, 3, np.zeros(2))["momentum"].tolist()
            (5, [1.0, 1.0])
        """
        registered = self._opts.get(opt_id)
        if registered is not None:
            if registered[0] != class_name:
                raise PSError(
                    f"the checkpoint has {class_name} slots for optimizer id {opt_id}, but this "
                    f"parameter server runs a {registered[0]} under that id. Restore into the "
                    "same optimizers, created in the same order, as the saving program"
                )
            names = tuple(registered[1].slot_names())
            if set(names) != set(slots):
                raise PSError(
                    f"the checkpoint has slots {sorted(slots)} for optimizer id {opt_id} "
                    f"({class_name}), but it uses slots {sorted(names)}; its configuration "
                    "differs from the saving program's (e.g. momentum=0 versus momentum > 0)"
                )
        elif self._restored.get(opt_id, class_name) != class_name:
            raise PSError(
                f"the checkpoint has {class_name} and {self._restored[opt_id]} slots for "
                f"optimizer id {opt_id}; one optimizer id has one class"
            )
        if dry_run:
            return
        if registered is None:
            self._restored[opt_id] = class_name
        state = _State((), 0, np.dtype(np.float64))
        state.slots = {k: np.ascontiguousarray(v).reshape(-1) for k, v in slots.items()}
        state.step = int(step)
        self._states[(opt_id, var_id)] = state

    def _state(self, opt_id: int, var_id: int, param: np.ndarray) -> _State:
        state = self._states.get((opt_id, var_id))
        if state is None:
            opt = self.optimizer(opt_id)
            state = _State(tuple(opt.slot_names()), param.size, param.dtype)
            self._states[(opt_id, var_id)] = state
        return state

    def _prepare(self, opt_id: int, var_id: int, param: np.ndarray, name: str) -> Any:
        opt = self.optimizer(opt_id)
        if param.dtype not in _FLOATS:
            raise PSTypeError(
                f"optimizer {type(opt).__name__} cannot update variable {name or var_id} of dtype "
                f"{param.dtype}; the parameter server optimizes float32 and float64 variables only"
            )
        if not param.flags.c_contiguous:
            raise PSError(f"variable {name or var_id} is not contiguous on the ps (internal error)")
        return opt

    def _clip(self, opt: Any, g: np.ndarray) -> None:
        """``clipnorm`` / ``clipvalue`` of ``opt`` on the flat gradient ``g`` (in place)."""
        if opt.clipnorm is not None:
            norm = math.sqrt(kernels.sum_squares(g))
            if norm > opt.clipnorm:
                kernels.scale(g, opt.clipnorm / norm)
        elif opt.clipvalue is not None:
            kernels.clip_values(g, opt.clipvalue)

    def apply_dense(
        self,
        opt_id: int,
        var_id: int,
        param: np.ndarray,
        grad: np.ndarray,
        lr: float,
        name: str = "",
    ) -> None:
        """Update ``param`` (contiguous) in place with gradient ``grad`` (same size; may be clipped
        in place when it has ``param``'s dtype).
        """
        opt = self._prepare(opt_id, var_id, param, name)
        if grad.size != param.size:
            raise PSError(
                f"the gradient for variable {name or var_id} has {grad.size} elements but the "
                f"variable has shape {param.shape} ({param.size} elements)"
            )
        p = param.reshape(-1)
        g = grad.reshape(-1)
        if g.dtype != p.dtype or not g.flags.c_contiguous:
            g = np.ascontiguousarray(g, dtype=p.dtype)
        self._clip(opt, g)
        state = self._state(opt_id, var_id, param)
        hyper = opt.hyper_parameters(float(lr), state.step, p.dtype)
        opt._update(kernels, p, p, g, state.slots, hyper)
        state.step += 1

    def apply_sparse(
        self,
        opt_id: int,
        var_id: int,
        param: np.ndarray,
        rows: np.ndarray,
        values: np.ndarray,
        lr: float,
        name: str = "",
    ) -> None:
        """Update the rows ``rows`` of ``param`` (and of its slots) with ``values`` (one row each;
        duplicate rows are summed first).

        Example: ``host.apply_sparse(0, 3, table, np.array([4, 1, 4]), grads_3_rows, lr=0.1)``.
        """
        opt = self._prepare(opt_id, var_id, param, name)
        label = name or var_id
        if param.ndim == 0:
            raise PSError(f"a sparse update needs a variable with rows; {label} is a scalar")
        nrows = param.shape[0]
        width = param.size // nrows if nrows else 0
        rows = np.asarray(rows, np.int64).reshape(-1)
        if values.size != rows.size * width:
            raise PSError(
                f"sparse update of {label}: {rows.size} rows of {width} elements need "
                f"{rows.size * width} values, got {values.size}"
            )
        if rows.size and (int(rows.min()) < 0 or int(rows.max()) >= nrows):
            bad = rows[(rows < 0) | (rows >= nrows)][:5].tolist()
            raise PSError(
                f"sparse update of {label}: row indices {bad} are outside [0, {nrows}); the "
                "indices must be rows of this shard"
            )
        state = self._state(opt_id, var_id, param)
        if rows.size == 0:
            return
        vals = values.reshape(rows.size, width)
        uniq, inverse = np.unique(rows, return_inverse=True)
        summed = np.zeros((uniq.size, width), param.dtype)
        if uniq.size == rows.size:
            summed[inverse] = vals
        else:
            np.add.at(summed, inverse, vals)
        g = summed.reshape(-1)
        self._clip(opt, g)
        table = param.reshape(nrows, width)
        p = np.ascontiguousarray(table[uniq]).reshape(-1)
        slot_rows = {
            k: np.ascontiguousarray(s.reshape(nrows, width)[uniq]).reshape(-1)
            for k, s in state.slots.items()
        }
        hyper = opt.hyper_parameters(float(lr), state.step, p.dtype)
        opt._update(kernels, p, p, g, slot_rows, hyper)
        table[uniq] = p.reshape(uniq.size, width)
        for k, s in state.slots.items():
            s.reshape(nrows, width)[uniq] = slot_rows[k].reshape(uniq.size, width)
        state.step += 1


__all__ = ["OptimizerHost"]
