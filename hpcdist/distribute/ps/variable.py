"""``PSVariable``: a variable that lives on a parameter-server rank; workers hold a cached copy.

Reading pulls the value from its ps. Inside ``strategy.run`` a value is
pulled at most once per step (all local replicas of a worker see the same
value, as in TF's PS training: synchronous inside a worker, asynchronous
between workers); outside ``run`` every read pulls the current value. Writes
(``assign``, ``assign_add``, ``assign_sub``) are sent to the ps, which applies
them in arrival order, so concurrent ``assign_add`` from many workers are
never lost. In a replica context with several local replicas a write is
combined first with the variable's aggregation and sent once.

Example: ``with ps_strategy.scope(): v = hd.Variable(0)`` then ``v.assign_add(1)`` on
every worker leaves ``v.numpy() == num_workers`` once all have written.
"""

from __future__ import annotations

import threading
from typing import Any

import numpy as np

from hpcdist.arrays import asarray, to_host
from hpcdist.distribute import context
from hpcdist.distribute.aggregating import combine
from hpcdist.distribute.variables import Variable, check_replica_write

_UNSET = -1  # a token no run has: the cache must be pulled


class PSVariable(Variable):
    """A variable stored on ps task ``ps`` under id ``var_id`` (made by the strategy's scope).

    Example: ``v.device`` is ``'/job:ps/replica:0/task:0/device:CPU:0'`` for a variable on ps 0.
    """

    def __init__(
        self,
        extended: Any,
        var_id: int,
        ps: int,
        value: np.ndarray,
        *,
        name: str,
        trainable: bool,
        synchronization: Any,
        aggregation: Any,
    ) -> None:
        self._ext = extended
        self._id = int(var_id)
        self._ps = int(ps)
        self._value = value
        self._version = 0
        self._token = _UNSET
        self._shape = tuple(value.shape)
        self._dtype = value.dtype
        self._lock = threading.Lock()
        self._name = name
        self._trainable = trainable
        self._synchronization = synchronization
        self._aggregation = aggregation
        self._device = None
        self._distribute_strategy = extended._strategy

    # -- the public interface of the ps updates (remote_updates) ---------------------------
    @property
    def extended(self) -> Any:
        """The ``ParameterServerExtended`` this variable belongs to."""
        return self._ext

    @property
    def ps_task(self) -> int:
        """The index of the ps task that holds the value."""
        return self._ps

    @property
    def var_id(self) -> int:
        """The variable's id on its ps task."""
        return self._id

    @property
    def version(self) -> int:
        """The number of updates the ps had applied when this task last read the value."""
        return self._version

    def invalidate(self) -> None:
        """Forget the cached value: the next read pulls it from the ps."""
        self._token = _UNSET

    def set_cached(self, value: np.ndarray) -> None:
        """Cache ``value`` (a value the ps just returned); the next run step pulls again."""
        self._value, self._token = value, _UNSET

    # -- description (no pull) -------------------------------------------------------------
    @property
    def device(self) -> str:
        """The ps task holding the value."""
        return f"/job:ps/replica:0/task:{self._ps}/device:CPU:0"

    @property
    def shape(self) -> tuple[int, ...]:
        """The shape of the value."""
        return self._shape

    @property
    def dtype(self) -> Any:
        """The dtype of the value."""
        return self._dtype

    @property
    def ndim(self) -> int:
        """The rank of the value."""
        return len(self._shape)

    @property
    def size(self) -> int:
        """The number of elements."""
        return int(np.prod(self._shape, dtype=np.int64))

    def __len__(self) -> int:
        if not self._shape:
            raise TypeError("len() of a scalar variable")
        return self._shape[0]

    # -- reading ---------------------------------------------------------------------------
    def raw_value(self) -> Any:
        """The cached value, pulled first unless this run step pulled it already."""
        ext = self._ext
        token = ext._run_token
        if token is None or self._token != token:
            with self._lock:
                if token is None or self._token != token:
                    self._pull(token)
        if token is not None:
            ext._read_set[self._id] = self
        return self._value

    def _pull(self, token: int | None) -> None:
        out = np.empty(self._shape, self._dtype)
        (self._version,) = self._ext._client.pull(self._ps, [self._id], [out])
        self._value = out
        self._token = _UNSET if token is None else token

    def _gather_rows(self, rows: Any) -> np.ndarray:
        """Rows ``rows`` of the value, fetched from the ps without the rest (embedding lookups)."""
        rows = np.ascontiguousarray(np.asarray(rows, dtype=np.int64).reshape(-1))
        out = np.empty((rows.size, *self._shape[1:]), self._dtype)
        self._version = self._ext._client.gather(self._ps, self._id, rows, out)
        return out

    # -- writing ---------------------------------------------------------------------------
    def _converted(self, value: Any) -> np.ndarray:
        if isinstance(value, Variable):
            value = value.raw_value()
        value = np.asarray(to_host(asarray(value)))
        if tuple(value.shape) != self._shape:
            raise ValueError(
                f"cannot assign a value of shape {tuple(value.shape)} to variable {self.name!r} "
                f"of shape {self._shape}; shapes must match"
            )
        if value.dtype != self._dtype and not np.can_cast(
            value.dtype, self._dtype, casting="same_kind"
        ):
            raise TypeError(
                f"cannot assign a {value.dtype} value to variable {self.name!r} of dtype "
                f"{self._dtype}; cast it first"
            )
        return np.array(value, dtype=self._dtype, order="C")

    def _send(self, op: str, value: Any) -> None:
        self._ext._client.update(self._ps, self._id, op, self._converted(value))
        self._token = _UNSET

    def _write(self, op: str, value: Any, read_value: bool) -> Any:
        ctx = context.get_replica_context()
        ext = self._ext
        if (
            ctx is not None
            and ctx.strategy is ext._strategy
            and ext._num_local_replicas > 1
            and getattr(ctx, "_merger", None) is not None
        ):
            agg = self._aggregation
            check_replica_write(self, "PSVariable")

            def merge(strategy: Any, v: Any) -> None:
                self._send(op, combine(strategy, v, agg))

            ctx._merge(merge, (value,), None, True, ("ps_write", self._id, op))
            return self if read_value else None
        self._send(op, value)
        return self if read_value else None

    def _repr_value(self) -> str:
        return np.array2string(self.raw_value(), threshold=20)


__all__ = ["PSVariable"]
