"""Mixed precision for ``hpcdist.nn``: Keras's ``Policy``, global policy and loss scaling.

A *policy* names the dtype layers compute in and the dtype of their
variables: ``"float32"`` (both float32), ``"mixed_bfloat16"`` and
``"mixed_float16"`` (compute in bfloat16 / float16, variables float32: the
*master weights* the optimizer updates), or any float dtype name. Layers
made while a policy is global (and given no ``dtype``), or given a policy
(``dtype="mixed_float16"``), follow it, as in Keras: every layer casts its
floating inputs to its compute dtype, reads a 16-bit copy of its float32
variables, and returns the compute dtype. Where 16-bit arithmetic is unsafe a
layer computes inside in float32 and rounds its output once: the statistics of
``BatchNormalization`` and ``LayerNormalization``, the ``softmax`` and
``gelu`` activations. Matmuls of
bfloat16 accumulate in float32 (NumPy's). The gradients of the variables are
float32 (the master weights'). ``fit`` computes the loss in float32 and hands
every gradient to the optimizer as float32. NumPy has bfloat16 (``ml_dtypes``);
CuPy has none, so ``"mixed_bfloat16"`` layers on GPU arrays raise
:class:`~hpcdist.errors.ArrayInteropError` (use ``"mixed_float16"`` there).

Float16 gradients underflow without loss scaling: :class:`LossScaleOptimizer`
(Keras's semantics) multiplies the loss by a dynamic scale, divides the
gradients by it, and skips a step whose gradients hold an inf or a NaN on any
replica (halving the scale); after ``dynamic_growth_steps`` good steps in a
row the scale doubles. The decision is all-reduced, so every rank skips the
same steps.

Example:
    >>> set_global_policy("mixed_bfloat16")
    >>> global_policy()
    <Policy "mixed_bfloat16">
    >>> global_policy().compute_dtype, global_policy().variable_dtype
    ('bfloat16', 'float32')
    >>> set_global_policy(None)  # back to floatx ("float32")
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np

from hpcdist.arrays import BFLOAT16, array_module
from hpcdist.distribute import context
from hpcdist.errors import ArrayInteropError
from hpcdist.nn import backend

__all__ = ["LossScaleOptimizer", "Policy", "global_policy", "set_global_policy"]

_MIXED = {"mixed_float16": "float16", "mixed_bfloat16": "bfloat16"}
_PLAIN = ("float16", "float32", "float64")


class Policy:
    """A dtype policy: ``Policy("mixed_bfloat16")`` (Keras's ``keras.mixed_precision.Policy``).

    Example: ``Policy("mixed_float16").compute_dtype == "float16"``.
    """

    def __init__(self, name: str | Policy) -> None:
        if isinstance(name, Policy):
            name = name.name
        if not isinstance(name, str) or (name not in _MIXED and name not in _PLAIN):
            names = ", ".join((*_PLAIN, *_MIXED))
            raise ValueError(f"policy name is {name!r}; expected one of {names}")
        self._name = name

    @property
    def name(self) -> str:
        """The policy's name, e.g. ``"mixed_bfloat16"``."""
        return self._name

    @property
    def compute_dtype(self) -> str:
        """The dtype layers compute in."""
        return _MIXED.get(self._name, self._name)

    @property
    def variable_dtype(self) -> str:
        """The dtype of layers' variables (the master weights)."""
        return "float32" if self._name in _MIXED else self._name

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Policy) and other.name == self.name

    def __hash__(self) -> int:
        return hash(self._name)

    def __repr__(self) -> str:
        return f'<Policy "{self._name}">'


_global: list[Policy | None] = [None]


def global_policy() -> Policy:
    """The policy new layers follow: the one set, else ``Policy(backend.floatx())``.

    Example: ``global_policy().name == "float32"`` by default.
    """
    return _global[0] if _global[0] is not None else Policy(backend.floatx())


def set_global_policy(policy: Policy | str | None) -> None:
    """Make ``policy`` (a :class:`Policy` or its name; ``None``: floatx) the global policy.

    Example: ``set_global_policy("mixed_bfloat16")`` before building the model.
    """
    _global[0] = None if policy is None else Policy(policy)


def layer_dtypes(dtype: Any) -> tuple[str | None, str | None]:
    """``(variable dtype, compute dtype)`` for a layer given ``dtype`` (``None``: the policy's).

    ``dtype`` may be a :class:`Policy` or a mixed policy's name (as in Keras,
    ``Dense(4, dtype="mixed_float16")``). ``(None, None)`` means: the layer's
    own dtype for both. Example: ``layer_dtypes(None)`` is
    ``("float32", "bfloat16")`` under ``"mixed_bfloat16"``.
    """
    if isinstance(dtype, str) and dtype in _MIXED:
        dtype = Policy(dtype)
    if isinstance(dtype, Policy):
        return dtype.variable_dtype, dtype.compute_dtype
    if dtype is None and _global[0] is not None:
        return _global[0].variable_dtype, _global[0].compute_dtype
    return None, None


def compute_array_dtype(name: str, xp: Any = np) -> np.dtype:
    """The dtype of a compute dtype name for arrays of ``xp`` (NumPy or CuPy).

    ``"bfloat16"`` is ``ml_dtypes.bfloat16`` for NumPy; CuPy has no bfloat16,
    so it raises :class:`~hpcdist.errors.ArrayInteropError` for CuPy.

    Example: ``compute_array_dtype("bfloat16") == BFLOAT16``.
    """
    if name != "bfloat16":
        return np.dtype(name)
    if xp is not np:
        raise ArrayInteropError(
            'the policy "mixed_bfloat16" computes in bfloat16, but the layer\'s arrays are '
            f"{getattr(xp, '__name__', xp)} arrays and CuPy has no bfloat16 type. On GPUs use "
            '"mixed_float16" (with LossScaleOptimizer) or "float32"'
        )
    return BFLOAT16


def is_half(dtype: Any) -> bool:
    """Whether ``dtype`` is a 16-bit float (float16 or bfloat16).

    Example: ``is_half(BFLOAT16)`` and ``not is_half(np.float32)``.
    """
    dtype = np.dtype(dtype)
    return dtype.itemsize == 2 and (dtype.kind == "f" or dtype == BFLOAT16)


def to_float32(x: Any) -> Any:
    """``x`` in float32 when it is a 16-bit float array (a mixed model's output), else ``x``.

    Example: ``to_float32(np.ones(2, np.float16)).dtype == np.float32``.
    """
    dtype = getattr(x, "dtype", None)
    if dtype is not None and is_half(dtype):
        return x.astype(np.float32)
    return x


def _local_replica_id(ctx: Any) -> int:
    local = len(ctx.strategy.extended.worker_devices) or 1
    return int(ctx.replica_id_in_sync_group) % local


class LossScaleOptimizer:
    """Keras's ``LossScaleOptimizer``: dynamic loss scaling around an hpcdist optimizer.

    Args:
        inner_optimizer: the optimizer that updates the (float32) variables.
        dynamic: change the scale (``False``: keep ``initial_scale``).
        initial_scale: the first scale (Keras: ``2 ** 15``).
        dynamic_growth_steps: good steps in a row before the scale doubles.

    ``fit`` multiplies the loss gradient by :attr:`loss_scale`; a custom loop
    calls :meth:`get_scaled_loss` / scales its own loss gradient, then
    :meth:`apply_gradients` with the scaled gradients. Attributes the class
    does not define are the inner optimizer's.

    Example: ``model.compile(LossScaleOptimizer(hd.optimizers.SGD(0.1)), "mse")``.
    """

    def __init__(
        self,
        inner_optimizer: Any,
        dynamic: bool = True,
        initial_scale: float = 2.0**15,
        dynamic_growth_steps: int = 2000,
    ) -> None:
        if not hasattr(inner_optimizer, "apply_gradients"):
            raise TypeError(
                f"inner_optimizer is {type(inner_optimizer).__name__}; expected an hpcdist "
                "optimizer (hd.optimizers.SGD(...), Adam(...), ...)"
            )
        if not np.isfinite(initial_scale) or initial_scale <= 0:
            raise ValueError(f"initial_scale is {initial_scale!r}; expected a finite number > 0")
        if isinstance(dynamic_growth_steps, bool) or int(dynamic_growth_steps) < 1:
            raise ValueError(
                f"dynamic_growth_steps is {dynamic_growth_steps!r}; expected an int >= 1"
            )
        self.inner_optimizer = inner_optimizer
        self.dynamic = bool(dynamic)
        self.dynamic_growth_steps = int(dynamic_growth_steps)
        self._scale = float(initial_scale)
        self._good_steps = 0
        self.skipped_steps = 0

    @property
    def loss_scale(self) -> float:
        """The current scale."""
        return self._scale

    def get_scaled_loss(self, loss: Any) -> Any:
        """``loss * loss_scale``. Example: ``opt.get_scaled_loss(loss)``."""
        return loss * self._scale

    def get_unscaled_gradients(self, grads: Iterable[Any]) -> list[Any]:
        """Each gradient divided by the scale, in float32 (``None`` stays ``None``).

        Example: ``grads = opt.get_unscaled_gradients(grads)``.
        """
        inv = np.float32(1.0 / self._scale)
        return [None if g is None else to_float32(g) * inv for g in grads]

    def apply_gradients(self, grads_and_vars: Iterable[tuple[Any, Any]], **kwargs: Any) -> bool:
        """Unscale, and apply unless some replica's gradients are not finite; update the scale.

        Returns whether the step was applied (the same on every rank).
        """
        pairs = list(grads_and_vars)
        grads = self.get_unscaled_gradients(g for g, _ in pairs)
        finite = all(bool(array_module(g).isfinite(g).all()) for g in grads if g is not None)
        ctx = context.get_replica_context()
        if ctx is not None:  # every replica (and rank) takes the same decision
            finite = bool(float(ctx.all_reduce("MIN", np.float32(finite))) > 0)
        first = ctx is None or _local_replica_id(ctx) == 0  # one update per process
        if finite:
            self.inner_optimizer.apply_gradients(
                zip(grads, (v for _, v in pairs), strict=True), **kwargs
            )
        if first and self.dynamic:
            self._update_scale(finite)
        elif first and not finite:
            self.skipped_steps += 1
        return finite

    def _update_scale(self, finite: bool) -> None:
        if finite:
            self._good_steps += 1
            if self._good_steps >= self.dynamic_growth_steps:
                self._scale *= 2.0
                self._good_steps = 0
            return
        self.skipped_steps += 1
        self._scale = max(1.0, self._scale / 2.0)
        self._good_steps = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.__dict__["inner_optimizer"], name)
