"""Layers with explicit forward and backward passes: Dense, Activation, Dropout, InputLayer,
Input, Flatten (normalization: :mod:`hpcdist.nn.normalization`; Embedding:
:mod:`hpcdist.nn.embedding`).

``forward(x, training)`` returns ``(y, cache)`` and ``backward(cache, dy)``
returns ``(dx, grads)``, ``grads`` aligned with ``layer.trainable_weights``.
Both are pure: nothing is stored on the layer, so the replicas of a
``MirroredStrategy`` can run one layer at the same time on their threads.
Weights are read with ``var.raw_value()``, which inside ``strategy.run`` is the
current replica's copy. Inputs are cast to the layer's compute dtype: its dtype
(:func:`hpcdist.nn.backend.floatx` unless given), or under a mixed-precision
policy the 16-bit type (:mod:`hpcdist.nn.mixed_precision`).

Example:
    >>> import numpy as np
    >>> layer = Dense(2, kernel_initializer="ones", dtype="float64")
    >>> layer.build((None, 3))
    >>> y, cache = layer.forward(np.array([[1.0, 2.0, 3.0]]))
    >>> y
    array([[6., 6.]])
    >>> dx, (dkernel, dbias) = layer.backward(cache, np.ones((1, 2)))
    >>> dx, dkernel.ravel(), dbias
    (array([[2., 2., 2.]]), array([1., 1., 2., 2., 3., 3.]), array([1., 1.]))
"""

from __future__ import annotations

import re
import threading
from typing import Any

import numpy as np
from numpy.typing import DTypeLike

from hpcdist.arrays import array_module, asarray, is_array, is_cupy, to_host
from hpcdist.distribute import context
from hpcdist.distribute.variables import Variable, VariableAggregation, VariableSynchronization
from hpcdist.nn import activations as activations_mod
from hpcdist.nn import backend, mixed_precision
from hpcdist.nn import initializers as initializers_mod
from hpcdist.nn import regularizers as regularizers_mod

_FLOATS = ("float16", "float32", "float64")


def snake_case(name: str) -> str:
    """``"Dense"`` -> ``"dense"``, ``"InputLayer"`` -> ``"input_layer"`` (default layer names).

    Example: ``snake_case("MyLayer") == "my_layer"``.
    """
    return re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", name).lower()


def resolve_dtype(dtype: DTypeLike | None) -> str:
    """The float dtype name of a layer: ``dtype`` or, when ``None``, the current floatx.

    Example: ``resolve_dtype(None) == "float32"``; ``resolve_dtype(np.float64) == "float64"``.
    """
    if dtype is None:
        return backend.floatx()
    try:
        name = np.dtype(dtype).name
    except TypeError:
        name = repr(dtype)
    if name not in _FLOATS:
        raise ValueError(f"layer dtype is {dtype!r}; expected one of {', '.join(_FLOATS)}")
    return name


def cast_input(x: Any, dtype: str | None, xp: Any = None) -> Any:
    """``x`` as an array of ``dtype`` in the array module ``xp`` (``x``'s own by default).

    No copy when ``x`` already is one; ``dtype=None`` keeps ``x``'s dtype. A CuPy
    ``x`` for NumPy weights comes to the host; a NumPy ``x`` for CuPy weights goes
    to the current GPU.

    Example: ``cast_input([1, 2], "float32")`` is ``array([1., 2.], dtype=float32)``.
    """
    if not is_array(x):
        x = asarray(x.raw_value() if isinstance(x, Variable) else x)
    if xp is None:
        xp = array_module(x)
    elif xp is np and is_cupy(x):
        x = to_host(x)
    elif xp is not np and not is_cupy(x):
        x = xp.asarray(x)
    return x if dtype is None else x.astype(dtype, copy=False)


def check_build_context(what: str, how: str) -> None:
    """Raise unless variables may be created here: not inside ``strategy.run``.

    A layer or model built inside ``run`` would create its variables from
    every replica thread; it must be built before, in the cross-replica
    context (or outside any strategy).

    Example: ``check_build_context("model", "model.build(input_shape)")`` passes outside run.
    """
    mode = context.current_mode()
    if mode.replica is not None and mode.strategy is not context.default_strategy():
        raise RuntimeError(
            f"{what} is not built, and it cannot be built inside strategy.run (each replica would "
            f"create its own weights). Build it first, outside strategy.run: call {how} "
            "(input_shape includes the batch dimension, e.g. (None, 10)), or call it once on a "
            "batch outside strategy.run"
        )


def check_shape(what: str, expected: tuple, found: tuple) -> None:
    if tuple(found) != tuple(expected):
        raise ValueError(
            f"{what}: the output gradient dy has shape {tuple(found)}, but the layer's output had "
            f"shape {tuple(expected)}; pass dL/dy of the same shape as the forward output"
        )


class Layer:
    """Base class of layers (``tf.keras.layers.Layer``) with an explicit backward pass.

    Subclasses define ``build`` (create weights with :meth:`add_weight`),
    ``forward`` and ``backward``, and ``compute_output_shape`` when the
    shape changes.

    Example:
        >>> import numpy as np
        >>> class Scale(Layer):
        ...     def forward(self, x, training=False):
        ...         return 2 * np.asarray(x), None
        ...     def backward(self, cache, dy):
        ...         return 2 * dy, []
        >>> Scale()(np.ones(2))
        array([2., 2.])
    """

    def __init__(
        self,
        trainable: bool = True,
        name: str | None = None,
        dtype: DTypeLike | None = None,
        input_shape: tuple | None = None,
    ) -> None:
        if name is not None and (not isinstance(name, str) or not name):
            raise ValueError(f"layer name is {name!r}; expected a non-empty string or None")
        self._name = name
        self._base_name = snake_case(type(self).__name__)
        self._trainable = bool(trainable)
        self.built = False
        variable, compute = mixed_precision.layer_dtypes(dtype)
        self.dtype = resolve_dtype(dtype if variable is None else variable)
        #: The dtype the layer computes in (a mixed policy's 16-bit type; else :attr:`dtype`).
        self.compute_dtype = self.dtype if compute is None else compute
        self._trainable_weights: list[Variable] = []
        self._non_trainable_weights: list[Variable] = []
        self._regularized: list[tuple[Variable, Any]] = []
        self._batch_input_shape: tuple | None = None
        if input_shape is not None:
            self._batch_input_shape = (None, *_shape_tuple(input_shape, "input_shape"))

    # -- description --------------------------------------------------------------------
    @property
    def dtype_policy(self) -> mixed_precision.Policy:
        """The layer's policy (Keras's ``layer.dtype_policy``), e.g. ``<Policy "mixed_bfloat16">``.

        Example: ``Dense(2, dtype="mixed_float16").dtype_policy.compute_dtype == "float16"``.
        """
        if self.compute_dtype == self.dtype:
            return mixed_precision.Policy(self.dtype)
        return mixed_precision.Policy(f"mixed_{self.compute_dtype}")

    @property
    def name(self) -> str:
        """The layer's name (set by the model it is added to, when not given)."""
        return self._name or self._base_name

    @property
    def trainable(self) -> bool:
        """Whether the layer's weights are trained (settable, to freeze a layer)."""
        return self._trainable

    @trainable.setter
    def trainable(self, value: bool) -> None:
        self._trainable = bool(value)

    @property
    def trainable_weights(self) -> list[Variable]:
        """The weights an optimizer updates (none when the layer is frozen)."""
        return list(self._trainable_weights) if self._trainable else []

    @property
    def non_trainable_weights(self) -> list[Variable]:
        """The weights that are not trained."""
        if self._trainable:
            return list(self._non_trainable_weights)
        return self._trainable_weights + self._non_trainable_weights

    @property
    def weights(self) -> list[Variable]:
        """All weights: trainable ones first."""
        return self.trainable_weights + self.non_trainable_weights

    trainable_variables = trainable_weights
    non_trainable_variables = non_trainable_weights
    variables = weights

    def __repr__(self) -> str:
        return f"<{type(self).__name__} name={self.name!r} built={self.built}>"

    # -- building ----------------------------------------------------------------------
    def build(self, input_shape: tuple) -> None:
        """Create the weights for inputs of ``input_shape`` (batch dimension included)."""
        self.built = True

    def _build(self, input_shape: tuple) -> None:
        """Build for ``input_shape`` and record it (what ``__call__`` and models use)."""
        input_shape = _shape_tuple(input_shape, "input_shape")
        if self._name is None:
            self._name = self._base_name  # from now on the weight names are fixed
        self.build(input_shape)
        self.built = True
        self._build_input_shape = input_shape

    def add_weight(
        self,
        name: str,
        shape: tuple,
        initializer: initializers_mod.InitializerLike = "zeros",
        trainable: bool = True,
        dtype: DTypeLike | None = None,
        *,
        synchronization: VariableSynchronization | str = VariableSynchronization.AUTO,
        aggregation: VariableAggregation | str = VariableAggregation.NONE,
        regularizer: regularizers_mod.RegularizerLike = None,
    ) -> Variable:
        """Create a weight ``"<layer name>/<name>"`` in the current strategy scope.

        A ``regularizer`` (:mod:`hpcdist.nn.regularizers`) adds its penalty of
        the weight to :attr:`losses`.
        """
        if self._name is None:
            self._name = self._base_name
        dtype = self.dtype if dtype is None else np.dtype(dtype).name
        shape = _shape_tuple(shape, "shape")
        init = initializers_mod.get(initializer) or initializers_mod.Zeros()
        value = asarray(init(shape, dtype))
        if tuple(value.shape) != shape:
            raise ValueError(
                f"the initializer of weight {self.name}/{name} returned shape "
                f"{tuple(value.shape)}; expected {shape}"
            )
        var = Variable(
            value,
            name=f"{self.name}/{name}",
            trainable=trainable,
            dtype=dtype,
            synchronization=synchronization,
            aggregation=aggregation,
        )
        (self._trainable_weights if trainable else self._non_trainable_weights).append(var)
        reg = regularizers_mod.get(regularizer)
        if reg is not None:
            self._regularized.append((var, reg))
        return var

    @property
    def losses(self) -> list[Any]:
        """The regularization penalties of the weights, now (0-d arrays; ``tf.keras``'s
        ``layer.losses``). Inside ``strategy.run`` they use this replica's weights.

        Example: ``Dense(2, kernel_regularizer="l2").losses`` after building.
        """
        return [reg(var.raw_value()) for var, reg in self._regularized]

    def compute_output_shape(self, input_shape: tuple) -> tuple:
        """The output shape for ``input_shape`` (the same, unless a subclass says otherwise).

        Example: ``Dense(3).compute_output_shape((None, 5)) == (None, 3)``.
        """
        return tuple(input_shape)

    def _autocast(self, x: Any, xp: Any = None) -> Any:
        """``x`` as an array of the compute dtype in ``xp`` (Keras's autocast of inputs).

        Under a mixed policy this is the 16-bit type (a ``"mixed_bfloat16"``
        layer on CuPy arrays raises :class:`~hpcdist.errors.ArrayInteropError`).
        """
        if self.compute_dtype == self.dtype:
            return cast_input(x, self.dtype, xp)
        x = cast_input(x, None, xp)
        return x.astype(mixed_precision.compute_array_dtype(self.compute_dtype, array_module(x)))

    def _require_built(self) -> None:
        if not self.built:
            raise RuntimeError(
                f"layer {self.name!r} is not built: call layer.build(input_shape) or call the "
                "layer on an input first"
            )

    # -- computing ---------------------------------------------------------------------
    def forward(self, x: Any, training: bool = False) -> tuple[Any, Any]:
        """``(y, cache)`` for the input ``x``; pure (stores nothing on the layer)."""
        raise NotImplementedError(f"{type(self).__name__} must define forward(x, training)")

    def backward(self, cache: Any, dy: Any) -> tuple[Any, list[Any]]:
        """``(dx, grads)`` from a forward ``cache`` and the output gradient ``dy``."""
        raise NotImplementedError(f"{type(self).__name__} must define backward(cache, dy)")

    def _backward(
        self, cache: Any, dy: Any, need_dx: bool, out: list[Any] | None = None
    ) -> tuple[Any, list[Any]]:
        """``backward``; layers that can skip computing ``dx`` when not needed override it.

        ``out``: arrays to write the gradients into, used by layers with ``_grads_into``.
        """
        return self.backward(cache, dy)

    def __call__(self, x: Any, training: bool = False) -> Any:
        """Build from ``x.shape`` if needed, then ``forward(x, training)[0]``."""
        if not self.built:
            check_build_context(f"layer {self.name!r}", "layer.build(input_shape)")
            x = asarray(x)
            self._build((None, *x.shape[1:]))
        return self.forward(x, training)[0]

    # -- counting and configuration -------------------------------------------------------
    def count_params(self) -> int:
        """The number of scalars in the layer's weights.

        Example: ``Dense(3, input_shape=(4,))`` built has ``4 * 3 + 3 == 15``.
        """
        if not self.built:
            raise ValueError(
                f"layer {self.name!r} is not built, so it has no weights to count yet: build it "
                "(layer.build(input_shape)) or call it on an input first"
            )
        return int(sum(v.size for v in self.weights))

    def get_config(self) -> dict[str, Any]:
        """The constructor arguments (``type(layer)(**layer.get_config())`` makes a twin)."""
        config: dict[str, Any] = {"name": self.name, "trainable": self.trainable}
        # a mixed layer saves its policy's name, so a loaded model computes as it did
        config["dtype"] = self.dtype_policy.name
        if self._batch_input_shape is not None:
            config["input_shape"] = self._batch_input_shape[1:]
        return config

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> Layer:
        """A layer made from :meth:`get_config`'s dict."""
        return cls(**config)


def _shape_tuple(shape: Any, what: str) -> tuple:
    if isinstance(shape, (int, np.integer)):
        shape = (shape,)
    try:
        out = tuple(None if d is None else int(d) for d in shape)
    except (TypeError, ValueError):
        raise ValueError(f"{what} is {shape!r}; expected a tuple of ints (or None)") from None
    if any(d is not None and d < 0 for d in out):
        raise ValueError(f"{what} is {shape!r}; dimensions must not be negative")
    return out


class InputLayer(Layer):
    """Declares the input shape of a model (``tf.keras.layers.InputLayer``); no weights.

    ``Sequential([InputLayer((10,)), Dense(1)])`` builds at construction; the
    input layer is not listed in ``model.layers`` (as in Keras).
    """

    def __init__(
        self,
        input_shape: tuple | None = None,
        batch_size: int | None = None,
        dtype: DTypeLike | None = None,
        name: str | None = None,
    ) -> None:
        if input_shape is None:
            raise ValueError("InputLayer needs input_shape, e.g. InputLayer((10,))")
        super().__init__(name=name, dtype=dtype, input_shape=input_shape)
        if batch_size is not None:
            assert self._batch_input_shape is not None  # set from input_shape
            self._batch_input_shape = (int(batch_size), *self._batch_input_shape[1:])
        self.built = True

    def forward(self, x: Any, training: bool = False) -> tuple[Any, Any]:
        # the variable dtype, not a 16-bit compute dtype (as keras.Input): integer ids stay exact
        return cast_input(x, self.dtype), None

    def backward(self, cache: Any, dy: Any) -> tuple[Any, list[Any]]:
        return dy, []

    def get_config(self) -> dict[str, Any]:
        config = super().get_config()
        config.pop("trainable")
        return config


class Dense(Layer):
    """A fully connected layer: ``y = activation(x @ kernel + bias)`` (``tf.keras.layers.Dense``).

    The kernel has shape ``(input features, units)``, the bias ``(units,)``.
    Inputs of higher rank are multiplied along their last axis.

    Example:
        >>> import numpy as np
        >>> layer = Dense(3, activation="relu")
        >>> layer(np.ones((2, 4))).shape, [w.name for w in layer.weights]
        ((2, 3), ['dense/kernel', 'dense/bias'])
    """

    def __init__(
        self,
        units: int,
        activation: str | activations_mod.ActivationFunction | None = None,
        use_bias: bool = True,
        kernel_initializer: initializers_mod.InitializerLike = "glorot_uniform",
        bias_initializer: initializers_mod.InitializerLike = "zeros",
        input_shape: tuple | None = None,
        dtype: DTypeLike | None = None,
        name: str | None = None,
        trainable: bool = True,
        kernel_regularizer: regularizers_mod.RegularizerLike = None,
        bias_regularizer: regularizers_mod.RegularizerLike = None,
    ) -> None:
        super().__init__(trainable=trainable, name=name, dtype=dtype, input_shape=input_shape)
        self.kernel_regularizer = regularizers_mod.get(kernel_regularizer)
        self.bias_regularizer = regularizers_mod.get(bias_regularizer)
        if isinstance(units, bool) or not isinstance(units, (int, np.integer)) or units <= 0:
            raise ValueError(f"Dense units is {units!r}; expected a positive integer")
        self.units = int(units)
        self.activation = activations_mod.get(activation)
        self.use_bias = bool(use_bias)
        self.kernel_initializer = initializers_mod.get(kernel_initializer)
        self.bias_initializer = initializers_mod.get(bias_initializer)

    def build(self, input_shape: tuple) -> None:
        if len(input_shape) < 1 or input_shape[-1] is None:
            raise ValueError(
                f"the last dimension of the inputs to Dense layer {self.name!r} must be known; "
                f"found input shape {tuple(input_shape)}"
            )
        n_in = input_shape[-1]
        self.kernel = self.add_weight(
            "kernel", (n_in, self.units), self.kernel_initializer,
            regularizer=self.kernel_regularizer,
        )  # fmt: skip
        self.bias = None
        if self.use_bias:
            self.bias = self.add_weight(
                "bias", (self.units,), self.bias_initializer, regularizer=self.bias_regularizer
            )
        self.built = True

    def compute_output_shape(self, input_shape: tuple) -> tuple:
        return (*tuple(input_shape)[:-1], self.units)

    def forward(self, x: Any, training: bool = False) -> tuple[Any, Any]:
        self._require_built()
        w = self.kernel.raw_value()
        if self.compute_dtype != self.dtype:  # mixed precision: a 16-bit copy of the weights
            return self._forward_mixed(x, w)
        x = cast_input(x, self.dtype, array_module(w))
        if x.ndim == 0 or x.shape[-1] != w.shape[0]:
            raise ValueError(
                f"Dense layer {self.name!r} expects inputs whose last dimension is {w.shape[0]}; "
                f"found input shape {tuple(x.shape)}"
            )
        z = x @ w
        if self.bias is not None:
            z += self.bias.raw_value()
        y, act_cache = self.activation.forward(z)
        return y, (x, w, act_cache)

    def _forward_mixed(self, x: Any, w: Any) -> tuple[Any, Any]:
        """The forward pass in :attr:`compute_dtype` (matmuls accumulate in float32)."""
        x = self._autocast(x, array_module(w))
        if x.ndim == 0 or x.shape[-1] != w.shape[0]:
            raise ValueError(
                f"Dense layer {self.name!r} expects inputs whose last dimension is {w.shape[0]}; "
                f"found input shape {tuple(x.shape)}"
            )
        compute = x.dtype
        w = w.astype(compute)
        z = (x @ w).astype(compute, copy=False)
        if self.bias is not None:
            z = z + self.bias.raw_value().astype(compute)
        y, act_cache = self.activation.forward(z)
        return y, (x, w, act_cache)

    def backward(self, cache: Any, dy: Any) -> tuple[Any, list[Any]]:
        return self._backward(cache, dy, True)

    #: ``_backward`` can write the gradients into given arrays (``out=``).
    _grads_into = True

    def _backward(
        self, cache: Any, dy: Any, need_dx: bool, out: list[Any] | None = None
    ) -> tuple[Any, list[Any]]:
        x, w, act_cache = cache
        if self.compute_dtype != self.dtype:
            return self._backward_mixed(cache, dy, need_dx, out)
        xp = array_module(w)
        dy = cast_input(dy, self.dtype, xp)
        check_shape(f"Dense layer {self.name!r}", (*x.shape[:-1], self.units), dy.shape)
        dz = self.activation.backward(act_cache, dy)
        grads = []
        if self._trainable:
            x2 = x.reshape(-1, x.shape[-1])
            dz2 = dz.reshape(-1, self.units)
            if out is None:
                grads.append(x2.T @ dz2)
                if self.bias is not None:
                    grads.append(dz2.sum(axis=0))
            else:
                grads.append(xp.matmul(x2.T, dz2, out=out[0]))
                if self.bias is not None:
                    grads.append(xp.sum(dz2, axis=0, out=out[1]))
        dx = dz @ w.T if need_dx else None
        return dx, grads

    def _backward_mixed(
        self, cache: Any, dy: Any, need_dx: bool, out: list[Any] | None
    ) -> tuple[Any, list[Any]]:
        """Gradients of the mixed forward: computed in 16 bits (float32 matmul sums),
        handed back in the variables' dtype; ``dx`` in the compute dtype."""
        with np.errstate(over="ignore", invalid="ignore"):  # loss scaling finds overflows
            return self._backward_mixed_ignoring(cache, dy, need_dx, out)

    def _backward_mixed_ignoring(
        self, cache: Any, dy: Any, need_dx: bool, out: list[Any] | None
    ) -> tuple[Any, list[Any]]:
        x, w, act_cache = cache
        compute = x.dtype
        dy = self._autocast(dy, array_module(w))
        dz = self.activation.backward(act_cache, dy).astype(compute, copy=False)
        grads = []
        if self._trainable:
            x2, dz2 = x.reshape(-1, x.shape[-1]), dz.reshape(-1, self.units)
            grads.append((x2.T @ dz2).astype(self.dtype))
            if self.bias is not None:
                grads.append(dz2.astype(self.dtype).sum(axis=0))
            if out is not None:
                for target, g in zip(out, grads, strict=False):
                    target[...] = g
                grads = list(out[: len(grads)])
        dx = (dz @ w.T).astype(compute, copy=False) if need_dx else None
        return dx, grads

    def get_config(self) -> dict[str, Any]:
        config = super().get_config()
        config.update(
            units=self.units,
            activation=activations_mod.serialize(self.activation),
            use_bias=self.use_bias,
            kernel_initializer=initializers_mod.serialize(self.kernel_initializer),
            bias_initializer=initializers_mod.serialize(self.bias_initializer),
        )
        if self.kernel_regularizer is not None:
            config["kernel_regularizer"] = regularizers_mod.serialize(self.kernel_regularizer)
        if self.bias_regularizer is not None:
            config["bias_regularizer"] = regularizers_mod.serialize(self.bias_regularizer)
        return config


class Activation(Layer):
    """Applies an activation function (``tf.keras.layers.Activation``).

    Example:
        >>> import numpy as np
        >>> Activation("relu")(np.array([-1.0, 1.0]))
        array([0., 1.], dtype=float32)
    """

    def __init__(
        self, activation: str | activations_mod.ActivationFunction | None, **kwargs: Any
    ) -> None:
        super().__init__(**kwargs)
        self.activation = activations_mod.get(activation)
        self.built = True

    def forward(self, x: Any, training: bool = False) -> tuple[Any, Any]:
        x = self._autocast(x)
        y, cache = self.activation.forward(x)
        return y, (cache, x.shape)

    def backward(self, cache: Any, dy: Any) -> tuple[Any, list[Any]]:
        act_cache, shape = cache
        dy = self._autocast(dy)
        check_shape(f"Activation layer {self.name!r}", shape, dy.shape)
        return self.activation.backward(act_cache, dy), []

    def get_config(self) -> dict[str, Any]:
        config = super().get_config()
        config["activation"] = activations_mod.serialize(self.activation)
        return config


class Dropout(Layer):
    """Inverted dropout (``tf.keras.layers.Dropout``): in training, zero each input with
    probability ``rate`` and scale the rest by ``1 / (1 - rate)``; identity otherwise.

    Every replica (by its global replica id) has its own mask generator, and
    each call draws a new mask. With a ``seed`` the masks are reproducible:
    a new layer with the same seed draws the same sequence. Without one the
    seed comes from NumPy's global generator when the layer is made.

    Example:
        >>> import numpy as np
        >>> layer = Dropout(0.5, seed=0)
        >>> y = layer(np.ones(8), training=True)
        >>> sorted(set(y.tolist())) == [0.0, 2.0], layer(np.ones(2)).tolist()
        (True, [1.0, 1.0])
    """

    def __init__(self, rate: float, seed: int | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        if isinstance(rate, bool) or not isinstance(rate, (int, float, np.floating, np.integer)):
            raise TypeError(f"Dropout rate is {rate!r}; expected a number in [0, 1)")
        if not 0 <= float(rate) < 1:
            raise ValueError(f"Dropout rate is {rate!r}; expected a number in [0, 1)")
        if seed is not None and (not isinstance(seed, (int, np.integer)) or seed < 0):
            raise ValueError(f"Dropout seed is {seed!r}; expected a non-negative integer or None")
        self.rate = float(rate)
        self.seed = seed
        self._seed = int(np.random.randint(2**31 - 1)) if seed is None else int(seed)
        self._generators: dict[tuple[int, str], Any] = {}
        self._lock = threading.Lock()
        self.built = True

    def _generator(self, xp: Any) -> Any:
        """The mask generator of the current replica (made on first use)."""
        ctx = context.get_replica_context()
        replica = 0 if ctx is None else int(ctx.replica_id_in_sync_group)
        key = (replica, xp.__name__)
        gen = self._generators.get(key)
        if gen is None:
            with self._lock:
                gen = self._generators.get(key)
                if gen is None:
                    seq = np.random.SeedSequence([self._seed, replica])
                    if xp is np:
                        gen = np.random.default_rng(seq)
                    else:
                        gen = xp.random.RandomState(int(seq.generate_state(1, np.uint32)[0]))
                    self._generators[key] = gen
        return gen

    def forward(self, x: Any, training: bool = False) -> tuple[Any, Any]:
        x = self._autocast(x)
        if not training or self.rate == 0.0:
            return x, None
        xp = array_module(x)
        gen = self._generator(xp)
        draw_dtype = np.float64 if x.dtype == np.float64 else np.float32
        if xp is np:
            u = gen.random(x.shape, dtype=draw_dtype)
        else:
            u = gen.random_sample(x.shape, dtype=draw_dtype)
        scale = (u >= self.rate).astype(x.dtype) * x.dtype.type(1.0 / (1.0 - self.rate))
        return x * scale, scale

    def backward(self, cache: Any, dy: Any) -> tuple[Any, list[Any]]:
        dy = self._autocast(dy)
        if cache is None:
            return dy, []
        check_shape(f"Dropout layer {self.name!r}", cache.shape, dy.shape)
        return dy * cache, []

    def get_config(self) -> dict[str, Any]:
        config = super().get_config()
        config.update(rate=self.rate, seed=self.seed)
        return config


def Input(  # noqa: N802 - Keras's name
    shape: tuple | None = None,
    batch_size: int | None = None,
    dtype: DTypeLike | None = None,
    name: str | None = None,
) -> InputLayer:
    """The input of a model (``keras.Input``): an :class:`InputLayer` of ``shape`` (no batch).

    ``Sequential([Input((10,)), Dense(1)])`` builds at construction, as in Keras.
    There are no symbolic tensors here: ``Input`` is only for ``Sequential``.

    Example: ``model = Sequential([Input(shape=(784,)), Dense(10)])``.
    """
    if shape is None:
        raise ValueError("Input needs shape, the input shape without the batch size, e.g. (10,)")
    return InputLayer(input_shape=shape, batch_size=batch_size, dtype=dtype, name=name)


class Flatten(Layer):
    """Flattens each example to one dimension: ``(batch, d1, d2, ...)`` to ``(batch, d1*d2*...)``
    (``keras.layers.Flatten``); no weights. A 1-D input becomes ``(batch, 1)``.

    Example:
        >>> import numpy as np
        >>> Flatten()(np.zeros((2, 3, 4))).shape
        (2, 12)
    """

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.built = True

    def compute_output_shape(self, input_shape: tuple) -> tuple:
        rest = tuple(input_shape)[1:]
        size = None if any(d is None for d in rest) else int(np.prod(rest, dtype=np.int64))
        return (input_shape[0], size)

    def forward(self, x: Any, training: bool = False) -> tuple[Any, Any]:
        x = self._autocast(x)
        if x.ndim == 0:
            raise ValueError(f"Flatten layer {self.name!r} needs a batch of inputs, got a scalar")
        return x.reshape(x.shape[0], -1), tuple(x.shape)

    def backward(self, cache: Any, dy: Any) -> tuple[Any, list[Any]]:
        dy = self._autocast(dy)
        expected = (cache[0], int(np.prod(cache[1:], dtype=np.int64)))
        check_shape(f"Flatten layer {self.name!r}", expected, dy.shape)
        return dy.reshape(cache), []
