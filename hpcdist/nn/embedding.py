"""``Embedding``: integer ids to rows of a trained table (``keras.layers.Embedding``).

The forward pass gathers rows; the backward pass scatter-adds the output
gradient into a dense gradient of the table (rows used twice get both
contributions). Under a mirrored strategy the table is mirrored like any
weight and the optimizer sums the dense gradients of all replicas in its one
allreduce. Under a mixed-precision policy the rows come out in the 16-bit
compute dtype (the same values as gathering from a 16-bit copy of the table,
without copying the table) and the gradient is scattered in float32 into the
float32 table's gradient. (For tables too large to mirror, shard them over parameter servers:
:func:`hpcdist.nn.embedding_lookup` of a ``ShardedVariable``.)

Example:
    >>> import numpy as np
    >>> emb = Embedding(4, 2, embeddings_initializer="ones")
    >>> emb(np.array([[0, 3, 3]])).shape
    (1, 3, 2)
    >>> y, cache = emb.forward(np.array([3, 3]))
    >>> emb.backward(cache, np.ones((2, 2)))[1][0].tolist()
    [[0.0, 0.0], [0.0, 0.0], [0.0, 0.0], [2.0, 2.0]]
"""

from __future__ import annotations

from typing import Any

import numpy as np
from numpy.typing import DTypeLike

from hpcdist.arrays import array_module, asarray, is_cupy, to_host
from hpcdist.nn import initializers as initializers_mod
from hpcdist.nn import mixed_precision
from hpcdist.nn import regularizers as regularizers_mod
from hpcdist.nn.layers import Layer, check_shape

__all__ = ["Embedding"]


def _positive_int(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value <= 0:
        raise ValueError(f"Embedding {name} is {value!r}; expected a positive integer")
    return int(value)


class Embedding(Layer):
    """Maps integer ids in ``[0, input_dim)`` to vectors of size ``output_dim``.

    Inputs of any shape ``S`` (integers, or floats holding integers) give
    outputs of shape ``S + (output_dim,)``. ``embeddings_initializer``
    defaults to Keras's ``"uniform"`` (``RandomUniform(-0.05, 0.05)``);
    ``embeddings_regularizer`` adds a penalty of the table to the loss.
    An id outside ``[0, input_dim)`` is an error (Keras on GPUs silently
    returns zeros).

    Example: ``Sequential([Input((20,)), Embedding(10000, 64), Flatten(), Dense(1)])``.
    """

    def __init__(
        self,
        input_dim: int,
        output_dim: int,
        embeddings_initializer: initializers_mod.InitializerLike = "uniform",
        embeddings_regularizer: regularizers_mod.RegularizerLike = None,
        input_shape: tuple | None = None,
        dtype: DTypeLike | None = None,
        name: str | None = None,
        trainable: bool = True,
    ) -> None:
        super().__init__(trainable=trainable, name=name, dtype=dtype, input_shape=input_shape)
        self.input_dim = _positive_int("input_dim", input_dim)
        self.output_dim = _positive_int("output_dim", output_dim)
        self.embeddings_initializer = initializers_mod.get(embeddings_initializer)
        self.embeddings_regularizer = regularizers_mod.get(embeddings_regularizer)

    def build(self, input_shape: tuple) -> None:
        self.embeddings = self.add_weight(
            "embeddings", (self.input_dim, self.output_dim), self.embeddings_initializer,
            regularizer=self.embeddings_regularizer,
        )  # fmt: skip
        self.built = True

    def compute_output_shape(self, input_shape: tuple) -> tuple:
        return (*tuple(input_shape), self.output_dim)

    def _ids(self, x: Any, xp: Any) -> Any:
        ids = asarray(x.raw_value() if hasattr(x, "raw_value") else x)
        if xp is np and is_cupy(ids):
            ids = to_host(ids)
        elif xp is not np and not is_cupy(ids):
            ids = xp.asarray(ids)
        if ids.dtype.kind == "f":
            as_int = ids.astype(np.int64)
            if ids.size and bool(xp.any(as_int != ids)):
                raise ValueError(
                    f"Embedding layer {self.name!r} got non-integer ids; pass integer ids"
                )
            ids = as_int
        elif ids.dtype.kind not in "iu":
            raise TypeError(
                f"Embedding layer {self.name!r} got inputs of dtype {ids.dtype}; expected "
                "integer ids"
            )
        if ids.size and bool(xp.any((ids < 0) | (ids >= self.input_dim))):
            raise ValueError(
                f"Embedding layer {self.name!r} has input_dim {self.input_dim}, so ids must be in "
                f"[0, {self.input_dim}); got ids from {int(ids.min())} to {int(ids.max())}"
            )
        return ids

    def forward(self, x: Any, training: bool = False) -> tuple[Any, Any]:
        self._require_built()
        table = self.embeddings.raw_value()
        xp = array_module(table)
        ids = self._ids(x, xp)
        compute = mixed_precision.compute_array_dtype(self.compute_dtype, xp)
        rows = xp.take(table, ids, axis=0).astype(compute, copy=False)  # rounding commutes
        return rows, (ids, table.shape, table.dtype, compute)

    def backward(self, cache: Any, dy: Any) -> tuple[Any, list[Any]]:
        ids, shape, dtype, compute = cache
        xp = array_module(ids)
        dy = xp.asarray(dy).astype(compute, copy=False)  # the gradient of a compute-dtype output
        check_shape(f"Embedding layer {self.name!r}", (*ids.shape, self.output_dim), dy.shape)
        grads = []
        if self._trainable:
            g = xp.zeros(shape, dtype)  # the variable's dtype: float32 master weights
            rows = ids.reshape(-1)
            flat_dy = dy.reshape(-1, self.output_dim).astype(dtype, copy=False)
            if xp is np:
                np.add.at(g, rows, flat_dy)
            else:
                import cupyx  # lazy: optional GPU dependency (CuPy)

                cupyx.scatter_add(g, rows, flat_dy)
            grads.append(g)
        # ids are not differentiable: the gradient of the input is zero
        return xp.zeros(ids.shape, compute), grads

    def get_config(self) -> dict[str, Any]:
        config = super().get_config()
        config.update(
            input_dim=self.input_dim,
            output_dim=self.output_dim,
            embeddings_initializer=initializers_mod.serialize(self.embeddings_initializer),
            embeddings_regularizer=regularizers_mod.serialize(self.embeddings_regularizer),
        )
        return config
