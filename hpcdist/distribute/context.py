"""Which strategy is current, and whether code runs in a replica or cross-replica context.

Each thread has a stack of modes. A mode names the current strategy and
either the strategy itself (cross-replica context: inside ``scope()`` or a
``merge_call`` function) or a :class:`ReplicaContext` (replica context: inside
``run``). With an empty stack the process-wide strategy set by
:func:`experimental_set_strategy` is current, or else the default strategy in
its default replica context, as in TF.

Example:
    >>> import hpcdist as hd
    >>> hd.has_strategy(), hd.in_cross_replica_context()
    (False, False)
    >>> type(hd.get_strategy()).__name__
    'DefaultStrategy'
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from hpcdist.errors import NotRegisteredError

if TYPE_CHECKING:
    from hpcdist.distribute.replica_context import ReplicaContext
    from hpcdist.distribute.strategy import Strategy


@dataclass(frozen=True)
class Mode:
    """One entry of a thread's context stack."""

    strategy: Strategy
    cross_replica: Strategy | None
    replica: ReplicaContext | None


_local = threading.local()
_global_lock = threading.Lock()
_global_mode: list[Mode] = []  # at most one: the experimental_set_strategy mode
_default: list[Any] = []  # the default strategy, created on first use
# The class of the default strategy: hpcdist.distribute.default registers it when imported
# (it builds on Strategy, which needs this module, so this module cannot import it).
_default_class: list[Callable[[], Strategy]] = []


def register_default_strategy(factory: Callable[[], Strategy]) -> None:
    """Set what :func:`default_strategy` creates (``DefaultStrategy``, registered on import)."""
    _default_class[:] = [factory]


def default_strategy() -> Strategy:
    """The default (single-replica, no-op) strategy, current outside any scope."""
    if not _default:
        with _global_lock:
            if not _default:
                if not _default_class:
                    raise NotRegisteredError(
                        "no default strategy is registered; expected hpcdist.distribute to be "
                        "imported (`import hpcdist` imports it)"
                    )
                _default.append(_default_class[0]())
    return _default[0]


def _stack() -> list[Mode]:
    stack = getattr(_local, "stack", None)
    if stack is None:
        stack = _local.stack = []
    return stack


def current_mode() -> Mode:
    """The innermost mode of this thread (the global or default mode when none)."""
    stack = _stack()
    if stack:
        return stack[-1]
    if _global_mode:
        return _global_mode[0]
    strategy = default_strategy()
    return Mode(strategy, None, strategy.extended._default_replica_context())


def push_mode(mode: Mode) -> None:
    """Enter ``mode`` on this thread (pair with :func:`pop_mode`)."""
    _stack().append(mode)


def pop_mode(mode: Mode) -> None:
    """Leave ``mode``, which must be this thread's innermost mode."""
    stack = _stack()
    if not stack or stack[-1] is not mode:
        raise RuntimeError(
            "strategy contexts were left out of order: exit `with strategy.scope()` "
            "blocks in the reverse order they were entered"
        )
    stack.pop()


def set_thread_stack(modes: list[Mode]) -> None:
    """Give a new thread (a replica thread) its starting stack."""
    _local.stack = list(modes)


def get_strategy() -> Strategy:
    """The current strategy: the one whose scope (or ``run``) we are in, else the default.

    Example: ``with s.scope(): assert hd.get_strategy() is s``.
    """
    return current_mode().strategy


def has_strategy() -> bool:
    """Whether a non-default strategy is current.

    Example: ``hd.has_strategy()`` is ``False`` outside any scope.
    """
    return get_strategy() is not default_strategy()


def in_cross_replica_context() -> bool:
    """Whether code runs in a cross-replica context (in ``scope()``, not inside ``run``).

    Example: ``with s.scope(): assert hd.in_cross_replica_context()``.
    """
    return current_mode().cross_replica is not None


def get_replica_context() -> ReplicaContext | None:
    """The current :class:`ReplicaContext`, or ``None`` in a cross-replica context.

    Outside any scope it is the default strategy's single replica context.

    Example: ``hd.get_replica_context().replica_id_in_sync_group`` inside ``run``.
    """
    return current_mode().replica


def get_cross_replica_context() -> Strategy | None:
    """The current strategy in a cross-replica context, else ``None``."""
    return current_mode().cross_replica


def experimental_set_strategy(strategy: Strategy | None) -> None:
    """Make ``strategy`` current for the whole process without ``with strategy.scope()``.

    ``None`` goes back to the default strategy. It must not be called inside
    a ``scope()`` (``RuntimeError``), since that scope would then be left in
    the wrong order.

    Example: ``hd.experimental_set_strategy(s); ...; hd.experimental_set_strategy(None)``.
    """
    if _stack():
        raise RuntimeError(
            "experimental_set_strategy must not be called inside a `strategy.scope()` or "
            "`strategy.run`; leave the `with` block first"
        )
    with _global_lock:
        _global_mode.clear()
        if strategy is not None:
            _global_mode.append(Mode(strategy, strategy, None))
