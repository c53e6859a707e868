"""Reduce operations and the local (in-process) reduction of arrays.

:class:`ReduceOp` is ``tf.distribute.ReduceOp``: ``SUM``, ``MEAN``, ``MIN`` and
``MAX``; strings name them in any case. :func:`reduce_arrays` reduces a list of
equally shaped arrays element-wise in a fixed order, so every rank that runs
it on the same inputs gets bitwise the same result.

Example:
    >>> import numpy as np
    >>> ReduceOp.from_any("sum") is ReduceOp.SUM
    True
    >>> reduce_arrays([np.array([1, 4]), np.array([2, 7])], "MEAN")
    array([1.5, 5.5])
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from typing import Any

import numpy as np

from hpcdist.arrays import BFLOAT16, array_module, asarray


class ReduceOp(enum.Enum):
    """How a set of values is reduced: ``SUM``, ``MEAN``, ``MIN`` or ``MAX``."""

    SUM = "SUM"
    MEAN = "MEAN"
    MIN = "MIN"
    MAX = "MAX"

    @classmethod
    def from_any(cls, value: Any) -> ReduceOp:
        """A :class:`ReduceOp` from itself or its name in any case.

        Example: ``ReduceOp.from_any("mean") is ReduceOp.MEAN``.
        """
        if isinstance(value, cls):
            return value
        if isinstance(value, str):
            try:
                return cls[value.strip().upper()]
            except KeyError:
                pass
            raise ValueError(
                f"reduce_op is {value!r}; expected one of SUM, MEAN, MIN, MAX "
                "(a hpcdist.ReduceOp or its name)"
            )
        raise TypeError(
            f"reduce_op is {value!r} of type {type(value).__name__}; expected a "
            "hpcdist.ReduceOp (SUM, MEAN, MIN, MAX) or its name as a string"
        )

    @classmethod
    def from_variable_aggregation(cls, aggregation: Any) -> ReduceOp:
        """The op of a variable aggregation: ``SUM`` → SUM, ``MEAN`` → MEAN.

        Any other aggregation (``NONE``, ``ONLY_FIRST_REPLICA``) has no reduce
        op and raises ``ValueError``.
        """
        name = str(getattr(aggregation, "name", aggregation)).upper()
        if name in ("SUM", "MEAN"):
            return cls[name]
        raise ValueError(
            f"could not convert the variable aggregation {aggregation!r} to a ReduceOp; "
            "only SUM and MEAN aggregations have one"
        )


def divide_mean(total: Any, count: int) -> Any:
    """``total / count``: floats keep their dtype, integers give float64 (as TF's MEAN does).

    Example: ``divide_mean(np.array([3, 7]), 2)`` is ``array([1.5, 3.5])``.
    """
    xp = array_module(total)
    if xp.issubdtype(total.dtype, xp.inexact) or total.dtype == BFLOAT16:
        return (total / xp.asarray(count, dtype=total.dtype)).astype(total.dtype, copy=False)
    return xp.true_divide(total, count)


def reduce_arrays(arrays: Sequence[Any], op: ReduceOp | str, count: int | None = None) -> Any:
    """Element-wise reduction of equally shaped arrays, in list order.

    ``MEAN`` divides the sum by ``count`` (default: the number of arrays).
    The result is a new array on the device of the first one.

    Example: ``reduce_arrays([a, b], ReduceOp.MAX)`` equals ``np.maximum(a, b)``.
    """
    op = ReduceOp.from_any(op)
    if not arrays:
        raise ValueError("reduce_arrays needs at least one array")
    items = [asarray(a) for a in arrays]
    xp = array_module(items[0])
    out = xp.array(items[0], dtype=xp.result_type(*items), copy=True)
    if out.dtype == xp.bool_ and op in (ReduceOp.SUM, ReduceOp.MEAN):
        raise TypeError(f"{op.name} of boolean values is not defined; cast to a number first")
    combine = {ReduceOp.MIN: xp.minimum, ReduceOp.MAX: xp.maximum}.get(op, xp.add)
    if out.dtype == BFLOAT16 and op in (ReduceOp.SUM, ReduceOp.MEAN):
        # bfloat16: accumulate in float32 (divide there), round once
        total = reduce_arrays([a.astype(np.float32) for a in items], op, count)
        return total.astype(BFLOAT16)
    for other in items[1:]:
        if other.shape != out.shape:
            raise ValueError(
                f"cannot reduce arrays of shapes {out.shape} and {other.shape}; every "
                "replica must give the same shape"
            )
        combine(out, other, out=out)
    if op is ReduceOp.MEAN:
        out = divide_mean(out, len(arrays) if count is None else count)
    return out
