"""RMSprop, plain or centered, with optional momentum (``keras.optimizers.RMSprop``).

Update (Keras 2.11+): ``velocity = rho * velocity + (1 - rho) * g^2``;
centered: ``average_gradient = rho * average_gradient + (1 - rho) * g`` and
``denominator = velocity - average_gradient^2 + epsilon``, else
``denominator = velocity + epsilon``; ``increment = lr * g /
sqrt(denominator)``; with ``momentum > 0``: ``momentum_slot = momentum *
momentum_slot + increment; p -= momentum_slot``, else ``p -= increment``.
Slots: ``"velocity"`` (alias ``"rms"``), ``"momentum"`` (when momentum > 0),
``"average_gradient"`` (alias ``"mg"``, when centered).

Example:
    >>> import numpy as np, hpcdist as hd
    >>> w = hd.Variable(np.array([1.0]))
    >>> _ = RMSprop(learning_rate=0.01, rho=0.9).apply_gradients([(np.array([2.0]), w)])
    >>> np.round(w.numpy(), 6)  # 1 - 0.01 * 2 / sqrt(0.1 * 4)
    array([0.968377])
"""

from __future__ import annotations

from typing import Any

import numpy as np

from hpcdist.optimizers.adam import check_positive
from hpcdist.optimizers.optimizer import LearningRate, Optimizer
from hpcdist.optimizers.sgd import check_fraction


class RMSprop(Optimizer):
    """RMSprop (Hinton), optionally centered and with momentum."""

    _SLOT_ALIASES = {"rms": "velocity", "mg": "average_gradient"}

    def __init__(
        self,
        learning_rate: LearningRate = 0.001,
        rho: float = 0.9,
        momentum: float = 0.0,
        epsilon: float = 1e-7,
        centered: bool = False,
        weight_decay: float | None = None,
        clipnorm: float | None = None,
        clipvalue: float | None = None,
        global_clipnorm: float | None = None,
        name: str = "RMSprop",
        **kwargs: Any,
    ) -> None:
        super().__init__(
            name=name,
            learning_rate=learning_rate,
            weight_decay=weight_decay,
            clipnorm=clipnorm,
            clipvalue=clipvalue,
            global_clipnorm=global_clipnorm,
            **kwargs,
        )
        self.rho = check_fraction("rho", rho)
        self.momentum = check_fraction("momentum", momentum)
        self.epsilon = check_positive("epsilon", epsilon)
        self.centered = bool(centered)

    def slot_names(self) -> tuple[str, ...]:
        names = ["velocity"]
        if self.momentum > 0:
            names.append("momentum")
        if self.centered:
            names.append("average_gradient")
        return tuple(names)

    def hyper_parameters(self, lr: float, step: int, dtype: np.dtype) -> np.ndarray:
        return np.array([lr, self.rho, self.momentum, self.epsilon, self._wd()], dtype)

    def _update(
        self, k: Any, p_in: Any, p_out: Any, g: Any, slots: dict[str, Any], hyper: Any
    ) -> None:
        k.rmsprop(
            p_in,
            p_out,
            g,
            slots["velocity"],
            slots.get("average_gradient"),
            slots.get("momentum"),
            hyper,
        )

    def get_config(self) -> dict[str, Any]:
        return {
            **super().get_config(),
            "rho": self.rho,
            "momentum": self.momentum,
            "epsilon": self.epsilon,
            "centered": self.centered,
        }
