"""Activation functions with explicit forward and backward passes (Keras names and formulas).

Each activation is an :class:`ActivationFunction`: ``forward(x)`` returns
``(y, cache)`` and ``backward(cache, dy)`` returns ``dx``; calling it returns
``y`` only. They work on NumPy and CuPy arrays and keep the input dtype. On
16-bit floats (float16, bfloat16: a mixed-precision layer's compute dtype)
``softmax`` and ``gelu`` compute in float32 and round the result once; the
other activations compute in the 16-bit type.

Example:
    >>> import numpy as np
    >>> y, cache = relu.forward(np.array([-1.0, 2.0]))
    >>> y, relu.backward(cache, np.array([5.0, 5.0]))
    (array([0., 2.]), array([0., 5.]))
    >>> get("softmax")(np.zeros(4))
    array([0.25, 0.25, 0.25, 0.25])
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import Any

import numpy as np

from hpcdist.arrays import array_module, asarray
from hpcdist.nn.mixed_precision import is_half

#: ``forward(x) -> (y, cache)``: an activation's forward pass and what its backward needs.
ForwardFn = Callable[[Any], tuple[Any, Any]]
#: ``backward(cache, dy) -> dx``: an activation's backward pass.
BackwardFn = Callable[[Any, Any], Any]


class ActivationFunction:
    """A named activation: ``forward(x) -> (y, cache)``, ``backward(cache, dy) -> dx``.

    Write a custom one by giving both passes; ``get`` accepts it like a name.

    Example:
        >>> import numpy as np
        >>> square = ActivationFunction("square", lambda x: (x * x, x), lambda x, dy: 2 * x * dy)
        >>> square(np.array([3.0])), square.backward(np.array([3.0]), np.array([1.0]))
        (array([9.]), array([6.]))
    """

    def __init__(
        self, name: str, forward: ForwardFn, backward: BackwardFn, float32_inside: bool = False
    ) -> None:
        self.name = name
        self.__name__ = name
        self._forward = forward
        self._backward = backward
        #: Compute 16-bit inputs in float32 (where 16-bit math is unsafe), returning 16 bits.
        self.float32_inside = bool(float32_inside)

    def forward(self, x: Any) -> tuple[Any, Any]:
        """``(y, cache)``: the activation of ``x`` and what :meth:`backward` needs.

        A 16-bit float ``x`` gives ``y`` of its dtype.
        """
        x = asarray(x)
        if not is_half(x.dtype):
            return self._forward(x)
        y, cache = self._forward(x.astype(np.float32) if self.float32_inside else x)
        return y.astype(x.dtype, copy=False), cache

    def backward(self, cache: Any, dy: Any) -> Any:
        """``dx``: the gradient with respect to the input, given the output gradient ``dy``.

        A 16-bit float ``dy`` gives ``dx`` of its dtype.
        """
        dy = asarray(dy)
        if not is_half(dy.dtype):
            return self._backward(cache, dy)
        dx = self._backward(cache, dy.astype(np.float32) if self.float32_inside else dy)
        return dx.astype(dy.dtype, copy=False)

    def __call__(self, x: Any) -> Any:
        return self.forward(x)[0]

    def get_config(self) -> str:
        """The name :func:`get` turns back into this activation."""
        return self.name

    def __repr__(self) -> str:
        return f"<activation {self.name}>"


# -- helpers ----------------------------------------------------------------------------------


def _sigmoid(x: Any) -> Any:
    """The logistic function without overflow: exp of non-positive numbers only."""
    xp = array_module(x)
    e = xp.exp(-xp.abs(x))
    return xp.where(x >= 0, 1 / (1 + e), e / (1 + e))


@functools.lru_cache(maxsize=1)
def _scipy_erf() -> Callable[[Any], Any] | None:
    try:
        from scipy.special import erf  # lazy: optional dependency (SciPy)
    except ImportError:
        return None
    return erf


def _erf_numpy(x: np.ndarray) -> np.ndarray:
    """erf to about 1e-13 (absolute) without SciPy: a power series, and a continued fraction
    for erfc when ``|x| >= 3``. Computed in float64."""
    z = np.asarray(x, dtype=np.float64)
    a = np.abs(z)
    s = np.minimum(a, 3.0)
    s2 = s * s
    term = s.copy()
    total = s.copy()
    for n in range(1, 64):  # erf(s) = 2/sqrt(pi) * sum (-1)^n s^(2n+1) / (n! (2n+1))
        term *= -s2 / n
        total += term / (2 * n + 1)
    series = total * (2 / math.sqrt(math.pi))
    t = np.maximum(a, 3.0)  # erfc(t) = exp(-t^2)/sqrt(pi) / (t + (1/2)/(t + 1/(t + (3/2)/...)))
    frac = t.copy()
    for k in range(64, 0, -1):
        frac = t + (k / 2) / frac
    tail = 1 - np.exp(-t * t) / (math.sqrt(math.pi) * frac)
    return np.sign(z) * np.where(a < 3.0, series, tail)


def erf(x: Any) -> Any:
    """The error function of an array (SciPy or CuPy when available), in ``x``'s float dtype.

    Example:
        >>> import numpy as np
        >>> round(float(erf(np.array(0.5))), 12)
        0.520499877813
    """
    x = asarray(x)
    xp = array_module(x)
    dtype = x.dtype if np.issubdtype(x.dtype, np.floating) else np.dtype(np.float64)
    if xp is not np:
        from cupyx.scipy.special import erf as cupy_erf  # lazy: optional GPU dependency (CuPy)

        return cupy_erf(x.astype(dtype, copy=False))
    scipy_erf = _scipy_erf()
    if scipy_erf is not None:
        return np.asarray(scipy_erf(x.astype(dtype, copy=False)))
    return _erf_numpy(x).astype(dtype, copy=False)


# -- the activations -----------------------------------------------------------------------------


def _linear_forward(x: Any) -> tuple[Any, Any]:
    return x, None


def _linear_backward(cache: Any, dy: Any) -> Any:
    return dy


def _relu_forward(x: Any) -> tuple[Any, Any]:
    y = array_module(x).maximum(x, 0)
    return y, y


def _relu_backward(y: Any, dy: Any) -> Any:
    return dy * (y > 0)


def _leaky_relu_forward(x: Any) -> tuple[Any, Any]:
    slope = x.dtype.type(LEAKY_RELU_SLOPE)
    positive = x > 0
    return array_module(x).where(positive, x, x * slope), positive


def _leaky_relu_backward(positive: Any, dy: Any) -> Any:
    slope = dy.dtype.type(LEAKY_RELU_SLOPE)
    return array_module(dy).where(positive, dy, dy * slope)


def _sigmoid_forward(x: Any) -> tuple[Any, Any]:
    y = _sigmoid(x)
    return y, y


def _sigmoid_backward(y: Any, dy: Any) -> Any:
    return dy * (y * (1 - y))


def _tanh_forward(x: Any) -> tuple[Any, Any]:
    y = array_module(x).tanh(x)
    return y, y


def _tanh_backward(y: Any, dy: Any) -> Any:
    return dy * (1 - y * y)


def _softmax_forward(x: Any) -> tuple[Any, Any]:
    xp = array_module(x)
    e = xp.exp(x - xp.max(x, axis=-1, keepdims=True))
    y = e / xp.sum(e, axis=-1, keepdims=True)
    return y, y


def _softmax_backward(y: Any, dy: Any) -> Any:
    xp = array_module(y)
    return y * (dy - xp.sum(dy * y, axis=-1, keepdims=True))


_INV_SQRT2 = 1 / math.sqrt(2.0)
_INV_SQRT_2PI = 1 / math.sqrt(2.0 * math.pi)


def _gelu_forward(x: Any) -> tuple[Any, Any]:
    cdf = 0.5 * (1 + erf(x * _INV_SQRT2))  # Phi(x), the standard normal CDF
    return x * cdf, (x, cdf)


def _gelu_backward(cache: tuple[Any, Any], dy: Any) -> Any:
    x, cdf = cache
    pdf = array_module(x).exp(-0.5 * x * x) * _INV_SQRT_2PI
    return dy * (cdf + x * pdf)


def _softplus_forward(x: Any) -> tuple[Any, Any]:
    xp = array_module(x)
    return xp.log1p(xp.exp(-xp.abs(x))) + xp.maximum(x, 0), x


def _softplus_backward(x: Any, dy: Any) -> Any:
    return dy * _sigmoid(x)


def _swish_forward(x: Any) -> tuple[Any, Any]:
    s = _sigmoid(x)
    y = x * s
    return y, (s, y)


def _swish_backward(cache: tuple[Any, Any], dy: Any) -> Any:
    s, y = cache
    return dy * (s + y * (1 - s))


def _elu_like(scale: float, alpha: float) -> tuple[ForwardFn, BackwardFn]:
    """``scale * (x if x > 0 else alpha * (exp(x) - 1))`` and its derivative."""

    def forward(x: Any) -> tuple[Any, Any]:
        xp = array_module(x)
        y = scale * xp.where(x > 0, x, alpha * xp.expm1(xp.minimum(x, 0)))
        return y, (x, y)

    def backward(cache: tuple[Any, Any], dy: Any) -> Any:
        x, y = cache
        return dy * array_module(x).where(x > 0, scale, y + scale * alpha)

    return forward, backward


_SELU_ALPHA = 1.6732632423543772848170429916717
_SELU_SCALE = 1.0507009873554804934193349852946

#: ``f(x) = x`` (no activation).
linear = ActivationFunction("linear", _linear_forward, _linear_backward)
#: ``max(x, 0)``.
relu = ActivationFunction("relu", _relu_forward, _relu_backward)
#: Keras 3's default slope of :data:`leaky_relu` for negative inputs.
LEAKY_RELU_SLOPE = 0.2
#: ``x`` for ``x > 0``, else ``0.2 * x`` (``keras.activations.leaky_relu``, negative_slope=0.2).
leaky_relu = ActivationFunction("leaky_relu", _leaky_relu_forward, _leaky_relu_backward)
#: ``1 / (1 + exp(-x))``.
sigmoid = ActivationFunction("sigmoid", _sigmoid_forward, _sigmoid_backward)
#: The hyperbolic tangent.
tanh = ActivationFunction("tanh", _tanh_forward, _tanh_backward)
#: Softmax over the last axis (each row sums to 1).
softmax = ActivationFunction(
    "softmax", _softmax_forward, _softmax_backward, float32_inside=True
)
#: Gaussian error linear unit, exact form ``x * (1 + erf(x / sqrt(2))) / 2``.
gelu = ActivationFunction("gelu", _gelu_forward, _gelu_backward, float32_inside=True)
#: ``log(1 + exp(x))``.
softplus = ActivationFunction("softplus", _softplus_forward, _softplus_backward)
#: ``x * sigmoid(x)`` (also called SiLU).
swish = ActivationFunction("swish", _swish_forward, _swish_backward)
#: Exponential linear unit: ``x`` for ``x > 0``, else ``exp(x) - 1``.
elu = ActivationFunction("elu", *_elu_like(1.0, 1.0))
#: Scaled ELU with the self-normalising constants of Klambauer et al. (2017).
selu = ActivationFunction("selu", *_elu_like(_SELU_SCALE, _SELU_ALPHA))

_BY_NAME: dict[str, ActivationFunction] = {
    f.name: f for f in (linear, relu, sigmoid, tanh, softmax, gelu, softplus, swish, elu, selu)
}
_BY_NAME["leaky_relu"] = leaky_relu
_BY_NAME["silu"] = swish


def get(identifier: str | ActivationFunction | None) -> ActivationFunction:
    """The activation for a name, an :class:`ActivationFunction`, or ``None`` (linear).

    Example: ``get("relu") is relu`` and ``get(None) is linear``.
    """
    if identifier is None:
        return linear
    if isinstance(identifier, str):
        found = _BY_NAME.get(identifier.strip().lower())
        if found is None:
            raise ValueError(
                f"unknown activation {identifier!r}; expected one of {', '.join(sorted(_BY_NAME))}"
                " or an hpcdist.nn.activations.ActivationFunction"
            )
        return found
    if callable(getattr(identifier, "forward", None)) and callable(
        getattr(identifier, "backward", None)
    ):
        return identifier
    raise TypeError(
        f"activation is {identifier!r}; expected a name such as 'relu', None, or an object with "
        "forward(x) -> (y, cache) and backward(cache, dy) -> dx (hpcdist.nn.activations."
        "ActivationFunction): a plain function has no backward pass to train with"
    )


def serialize(activation: ActivationFunction) -> str:
    """The name of an activation (what ``get`` accepts back).

    Example: ``serialize(relu) == "relu"``.
    """
    return getattr(activation, "name", getattr(activation, "__name__", repr(activation)))
