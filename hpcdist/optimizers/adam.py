"""Adam, AMSGrad and AdamW (``keras.optimizers.Adam`` / ``AdamW``).

Update (Keras 2.11+), with ``t = iterations + 1``: ``lr_t = lr * sqrt(1 -
beta_2^t) / (1 - beta_1^t)``; ``m += (g - m)(1 - beta_1)``; ``v += (g^2 -
v)(1 - beta_2)``; amsgrad: ``vhat = max(vhat, v)`` used in place of ``v``;
``p -= lr_t * m / (sqrt(v) + epsilon)``. AdamW is Adam with a decoupled
``weight_decay`` (``p -= lr * wd * p`` first). Slots: ``"m"``, ``"v"`` and
``"vhat"`` (amsgrad).

Example:
    >>> import numpy as np, hpcdist as hd
    >>> w = hd.Variable(np.array([1.0, -1.0]))
    >>> opt = Adam(learning_rate=0.1)
    >>> _ = opt.apply_gradients([(np.array([0.5, -2.0]), w)])
    >>> np.round(w.numpy(), 4)  # the first Adam step moves each weight by about lr
    array([ 0.9, -0.9])
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from hpcdist.optimizers.optimizer import LearningRate, Optimizer
from hpcdist.optimizers.sgd import check_fraction


def check_positive(name: str, value: Any) -> float:
    try:
        v = float(value)
    except (TypeError, ValueError):
        raise TypeError(f"{name} must be a number, got {value!r}") from None
    if not v > 0:
        raise ValueError(f"{name} must be > 0, got {value!r}")
    return v


class Adam(Optimizer):
    """Adam (Kingma & Ba), optionally AMSGrad."""

    def __init__(
        self,
        learning_rate: LearningRate = 0.001,
        beta_1: float = 0.9,
        beta_2: float = 0.999,
        epsilon: float = 1e-7,
        amsgrad: bool = False,
        weight_decay: float | None = None,
        clipnorm: float | None = None,
        clipvalue: float | None = None,
        global_clipnorm: float | None = None,
        name: str = "Adam",
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
        self.amsgrad = bool(amsgrad)

    def slot_names(self) -> tuple[str, ...]:
        return ("m", "v", "vhat") if self.amsgrad else ("m", "v")

    def hyper_parameters(self, lr: float, step: int, dtype: np.dtype) -> np.ndarray:
        t = step + 1
        b1, b2 = self.beta_1, self.beta_2
        lr_t = lr * math.sqrt(1.0 - b2**t) / (1.0 - b1**t) if b1 < 1.0 else 0.0
        return np.array([lr_t, b1, b2, self.epsilon, lr * self._wd()], dtype)

    def _update(
        self, k: Any, p_in: Any, p_out: Any, g: Any, slots: dict[str, Any], hyper: Any
    ) -> None:
        k.adam(p_in, p_out, g, slots["m"], slots["v"], slots.get("vhat"), hyper)

    def get_config(self) -> dict[str, Any]:
        return {
            **super().get_config(),
            "beta_1": self.beta_1,
            "beta_2": self.beta_2,
            "epsilon": self.epsilon,
            "amsgrad": self.amsgrad,
        }


class AdamW(Adam):
    """Adam with decoupled weight decay (Loshchilov & Hutter); ``weight_decay`` is required."""

    def __init__(
        self,
        learning_rate: LearningRate = 0.001,
        weight_decay: float = 0.004,
        beta_1: float = 0.9,
        beta_2: float = 0.999,
        epsilon: float = 1e-7,
        amsgrad: bool = False,
        clipnorm: float | None = None,
        clipvalue: float | None = None,
        global_clipnorm: float | None = None,
        name: str = "AdamW",
        **kwargs: Any,
    ) -> None:
        if weight_decay is None:
            raise ValueError(
                "AdamW: weight_decay must be a float (default 0.004), got None; use Adam for "
                "no weight decay"
            )
        super().__init__(
            learning_rate=learning_rate,
            beta_1=beta_1,
            beta_2=beta_2,
            epsilon=epsilon,
            amsgrad=amsgrad,
            weight_decay=weight_decay,
            clipnorm=clipnorm,
            clipvalue=clipvalue,
            global_clipnorm=global_clipnorm,
            name=name,
            **kwargs,
        )
