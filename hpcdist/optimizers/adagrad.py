"""Adagrad (``keras.optimizers.Adagrad``).

Update (Keras 2.11+ and 3): ``accumulator += g^2``; ``p -= lr * g /
sqrt(accumulator + epsilon)``. The slot ``"accumulator"`` starts at
``initial_accumulator_value`` (0.1).

Example:
    >>> import numpy as np, hpcdist as hd
    >>> w = hd.Variable(np.array([1.0]))
    >>> _ = Adagrad(learning_rate=0.1).apply_gradients([(np.array([2.0]), w)])
    >>> np.round(w.numpy(), 6)  # 1 - 0.1 * 2 / sqrt(0.1 + 4 + 1e-7)
    array([0.901227])
"""

from __future__ import annotations

from typing import Any

import numpy as np

from hpcdist.optimizers.adam import check_positive
from hpcdist.optimizers.optimizer import LearningRate, Optimizer


class Adagrad(Optimizer):
    """Adagrad (Duchi et al.): per-parameter learning rates from the sum of squared gradients."""

    def __init__(
        self,
        learning_rate: LearningRate = 0.001,
        initial_accumulator_value: float = 0.1,
        epsilon: float = 1e-7,
        weight_decay: float | None = None,
        clipnorm: float | None = None,
        clipvalue: float | None = None,
        global_clipnorm: float | None = None,
        name: str = "Adagrad",
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
        try:
            initial = float(initial_accumulator_value)
        except (TypeError, ValueError):
            raise TypeError(
                f"initial_accumulator_value must be a number, got {initial_accumulator_value!r}"
            ) from None
        if not initial >= 0:
            raise ValueError(
                f"initial_accumulator_value must be >= 0, got {initial_accumulator_value!r}"
            )
        self.initial_accumulator_value = initial
        self.epsilon = check_positive("epsilon", epsilon)

    def slot_names(self) -> tuple[str, ...]:
        return ("accumulator",)

    def _slot_initial_value(self, name: str) -> float:
        return self.initial_accumulator_value

    def hyper_parameters(self, lr: float, step: int, dtype: np.dtype) -> np.ndarray:
        return np.array([lr, self.epsilon, self._wd()], dtype)

    def _update(
        self, k: Any, p_in: Any, p_out: Any, g: Any, slots: dict[str, Any], hyper: Any
    ) -> None:
        k.adagrad(p_in, p_out, g, slots["accumulator"], hyper)

    def get_config(self) -> dict[str, Any]:
        return {
            **super().get_config(),
            "initial_accumulator_value": self.initial_accumulator_value,
            "epsilon": self.epsilon,
        }
