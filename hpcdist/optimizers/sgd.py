"""SGD with optional (Nesterov) momentum (``keras.optimizers.SGD``).

Update (Keras 2.11+): ``p -= lr * g``; with momentum ``velocity = momentum *
velocity - lr * g; p += velocity`` (Nesterov: ``p += momentum * velocity - lr
* g``). The slot ``"momentum"`` (alias ``"m"``) exists when ``momentum > 0``.

Example:
    >>> import numpy as np, hpcdist as hd
    >>> w = hd.Variable(np.array([1.0]))
    >>> opt = SGD(learning_rate=0.1, momentum=0.9)
    >>> for _ in range(2):
    ...     _ = opt.apply_gradients([(np.array([1.0]), w)])
    >>> w.numpy(), opt.get_slot(w, "momentum").numpy()
    (array([0.71]), array([-0.19]))
"""

from __future__ import annotations

from typing import Any

import numpy as np

from hpcdist.optimizers.optimizer import LearningRate, Optimizer


def check_fraction(name: str, value: Any) -> float:
    """``value`` as a float in ``[0, 1]``, else a ``ValueError``."""
    try:
        v = float(value)
    except (TypeError, ValueError):
        raise TypeError(f"{name} must be a number in [0, 1], got {value!r}") from None
    if not 0.0 <= v <= 1.0:
        raise ValueError(f"`{name}` must be between [0, 1]; got {value!r}")
    return v


class SGD(Optimizer):
    """Gradient descent with optional momentum and Nesterov momentum."""

    _SLOT_ALIASES = {"m": "momentum"}

    def __init__(
        self,
        learning_rate: LearningRate = 0.01,
        momentum: float = 0.0,
        nesterov: bool = False,
        weight_decay: float | None = None,
        clipnorm: float | None = None,
        clipvalue: float | None = None,
        global_clipnorm: float | None = None,
        name: str = "SGD",
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
        self.momentum = check_fraction("momentum", momentum)
        self.nesterov = bool(nesterov)

    def slot_names(self) -> tuple[str, ...]:
        return ("momentum",) if self.momentum > 0 else ()

    def hyper_parameters(self, lr: float, step: int, dtype: np.dtype) -> np.ndarray:
        if self.momentum > 0:
            return np.array([lr, self.momentum, self._wd()], dtype)
        return np.array([lr, self._wd()], dtype)

    def _update(
        self, k: Any, p_in: Any, p_out: Any, g: Any, slots: dict[str, Any], hyper: Any
    ) -> None:
        if "momentum" in slots:
            k.momentum(p_in, p_out, g, slots["momentum"], hyper, self.nesterov)
        else:
            k.sgd(p_in, p_out, g, hyper)

    def get_config(self) -> dict[str, Any]:
        return {**super().get_config(), "momentum": self.momentum, "nesterov": self.nesterov}
