"""The default strategy: what is current outside any ``scope()``.

It has one replica, makes plain variables that live where their initial
value is, and ``run`` just calls the function in the current context.

Example:
    >>> import hpcdist as hd
    >>> s = hd.get_strategy()
    >>> s.num_replicas_in_sync, s.run(lambda x: x + 1, args=(1,))
    (1, 2)
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from hpcdist.distribute import context
from hpcdist.distribute.devices import parse_device
from hpcdist.distribute.extended import StrategyExtended
from hpcdist.distribute.strategy import Strategy


class DefaultExtended(StrategyExtended):
    """The default strategy's extended: one local replica, nothing distributed."""

    def __init__(self, strategy: Any) -> None:
        super().__init__(strategy, [parse_device("/cpu:0")], distributed_variables=False)
        self._variable_device = None

    def call_for_each_replica(
        self, fn: Callable, args: tuple = (), kwargs: dict | None = None
    ) -> Any:
        return fn(*args, **(kwargs or {}))

    def _owner(self) -> Any:
        return None


class DefaultStrategy(Strategy):
    """The single-replica strategy in effect when no other is (not constructed by users)."""

    def __init__(self) -> None:
        super().__init__(DefaultExtended(self))

    def __repr__(self) -> str:
        return "<DefaultStrategy>"


context.register_default_strategy(DefaultStrategy)
