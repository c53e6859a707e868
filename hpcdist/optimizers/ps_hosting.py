"""What the optimizers give the parameter-server layer below them.

* :class:`RemoteView`: an optimizer as :mod:`hpcdist.distribute.ps.remote_updates` sees it
  (the ``RemoteOptimizer`` protocol): ``Optimizer.apply_gradients`` passes one when the
  variables live on parameter servers.

The other direction, the ps building its optimizers from ``(class_name, config)``, is
registered by ``hpcdist.optimizers`` itself (its ``deserialize``) with
:func:`~hpcdist.distribute.ps.optimizer_host.register_optimizer_factory`.

Example: ``remote_updates.apply_gradients(RemoteView(optimizer), pairs)``.
"""

from __future__ import annotations

from typing import Any


class RemoteView:
    """``optimizer`` seen through the ``RemoteOptimizer`` protocol of the ps updates.

    ``iterations`` is the optimizer's raw step counter (``None`` before the first step);
    the ps updates replace it by a ps variable.

    Example: ``RemoteView(SGD()).learning_rate_at(0)`` is ``0.01``.
    """

    def __init__(self, optimizer: Any) -> None:
        self._opt = optimizer

    @property
    def optimizer(self) -> Any:
        """The optimizer itself."""
        return self._opt

    @property
    def name(self) -> str:
        """The optimizer's name."""
        return str(self._opt.name)

    @property
    def clipnorm(self) -> float | None:
        """The optimizer's ``clipnorm``."""
        value: float | None = self._opt.clipnorm
        return value

    @property
    def global_clipnorm(self) -> float | None:
        """The optimizer's ``global_clipnorm``."""
        value: float | None = self._opt.global_clipnorm
        return value

    @property
    def clipvalue(self) -> float | None:
        """The optimizer's ``clipvalue``."""
        value: float | None = self._opt.clipvalue
        return value

    @property
    def iterations(self) -> Any:
        """The raw step counter (``None``, a variable or a ps variable)."""
        return self._opt._iterations

    @iterations.setter
    def iterations(self, value: Any) -> None:
        self._opt._iterations = value

    def learning_rate_at(self, step: int) -> float:
        """The learning rate of global step ``step``."""
        return float(self._opt._lr_at(step))

    def check_missing(self, pairs: list, variables: list, missing: list, stacklevel: int) -> None:
        """The optimizer's check of variables without gradients."""
        self._opt._check_missing(pairs, variables, missing, stacklevel=stacklevel + 1)


__all__ = ["RemoteView"]
