"""Nadam: Adam with Nesterov momentum (``keras.optimizers.Nadam``).

Update (Keras 2.11+ and 3), with ``t = iterations + 1`` and ``decay = 0.96``:
``u_t = beta_1 * (1 - 0.5 * decay^t)``, ``u_{t+1}`` alike, ``P_t = u_1 u_2 ...
u_t``; ``m += (g - m)(1 - beta_1)``; ``v += (g^2 - v)(1 - beta_2)``; ``m_hat =
u_{t+1} m / (1 - P_t u_{t+1}) + (1 - u_t) g / (1 - P_t)``; ``v_hat = v / (1 -
beta_2^t)``; ``p -= lr * m_hat / (sqrt(v_hat) + epsilon)``. Slots: ``"m"``
(alias ``"momentums"``) and ``"v"`` (alias ``"velocities"``).

Keras keeps ``P_t`` in a variable; here it is computed from ``iterations`` (in
float64), so a restored optimizer continues exactly, on any number of workers.

Example:
    >>> import numpy as np, hpcdist as hd
    >>> w = hd.Variable(np.array([1.0, -1.0]))
    >>> _ = Nadam(learning_rate=0.1).apply_gradients([(np.array([0.5, -2.0]), w)])
    >>> np.round(w.numpy(), 4)
    array([ 0.8937, -0.8937])
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from hpcdist.optimizers.adam import check_positive
from hpcdist.optimizers.optimizer import LearningRate, Optimizer
from hpcdist.optimizers.sgd import check_fraction

_DECAY = 0.96


def momentum_schedule(beta_1: float, t: int) -> float:
    """``u_t = beta_1 * (1 - 0.5 * 0.96^t)``, Nadam's momentum at step ``t`` (1-based).

    Example: ``momentum_schedule(0.9, 1) == 0.9 * (1 - 0.5 * 0.96)``.
    """
    return beta_1 * (1.0 - 0.5 * _DECAY**t)


class Nadam(Optimizer):
    """Nadam (Dozat, 2016), as Keras computes it."""

    _SLOT_ALIASES = {"momentums": "m", "velocities": "v"}

    def __init__(
        self,
        learning_rate: LearningRate = 0.001,
        beta_1: float = 0.9,
        beta_2: float = 0.999,
        epsilon: float = 1e-7,
        weight_decay: float | None = None,
        clipnorm: float | None = None,
        clipvalue: float | None = None,
        global_clipnorm: float | None = None,
        name: str = "Nadam",
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
        self.beta_1 = check_fraction("beta_1", beta_1)
        self.beta_2 = check_fraction("beta_2", beta_2)
        self.epsilon = check_positive("epsilon", epsilon)
        self._product = (0, 1.0)  # (t, u_1 ... u_t): extended step by step

    def slot_names(self) -> tuple[str, ...]:
        return ("m", "v")

    def _u_product(self, t: int) -> float:
        """``u_1 * ... * u_t`` (cached; recomputed after a jump such as a restore)."""
        done, product = self._product
        if done > t:
            done, product = 0, 1.0
        for s in range(done + 1, t + 1):
            product *= momentum_schedule(self.beta_1, s)
        self._product = (t, product)
        return product

    def hyper_parameters(self, lr: float, step: int, dtype: np.dtype) -> np.ndarray:
        t = step + 1
        u_t = momentum_schedule(self.beta_1, t)
        u_next = momentum_schedule(self.beta_1, t + 1)
        product = self._u_product(t)
        c_m = u_next / (1.0 - product * u_next)
        c_g = (1.0 - u_t) / (1.0 - product)
        c_v = 1.0 / (1.0 - self.beta_2**t) if self.beta_2 < 1.0 else math.inf
        hyper = [lr, self.beta_1, self.beta_2, self.epsilon, c_m, c_g, c_v, lr * self._wd()]
        return np.array(hyper, dtype)

    def _update(
        self, k: Any, p_in: Any, p_out: Any, g: Any, slots: dict[str, Any], hyper: Any
    ) -> None:
        k.nadam(p_in, p_out, g, slots["m"], slots["v"], hyper)

    def get_config(self) -> dict[str, Any]:
        return {
            **super().get_config(),
            "beta_1": self.beta_1,
            "beta_2": self.beta_2,
            "epsilon": self.epsilon,
        }
