"""Horovod's ``horovod.tensorflow`` API on hpcdist (TensorFlow 2, eager or ``tf.function``),
over :mod:`hpcdist.tensorflow`: ``import hpcdist.horovod.tensorflow as hvd``.

``allreduce``, ``allgather``, ``broadcast`` and ``broadcast_variables`` run on the
process set's runner (arguments compared across ranks first, as in
:mod:`hpcdist.horovod.torch`); inside a ``tf.function`` they run as a
``tf.numpy_function``. :func:`DistributedGradientTape` reduces a tape's gradients
through ``hpcdist.tensorflow.allreduce_gradients``.

Example::

    import hpcdist.horovod.tensorflow as hvd
    hvd.init()
    with tf.GradientTape() as tape:
        loss = loss_fn(y, model(x))
    tape = hvd.DistributedGradientTape(tape)
    grads = tape.gradient(loss, model.trainable_variables)
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import tensorflow as tf

from hpcdist.errors import HorovodInternalError, HostsUpdatedInterrupt
from hpcdist.horovod.common.basics import (
    cross_rank,
    cross_size,
    init,
    is_homogeneous,
    is_initialized,
    local_rank,
    local_size,
    mpi_built,
    mpi_enabled,
    mpi_threads_supported,
    rank,
    shutdown,
    size,
)
from hpcdist.horovod.common.ops import ENGINE_OP, OP_NAMES, Adasum, Average, Max, Min, Product, Sum
from hpcdist.horovod.common.process_sets import (
    ProcessSet,
    add_process_set,
    global_process_set,
    remove_process_set,
)
from hpcdist.horovod.common.runner import Call
from hpcdist.tensorflow import allreduce_gradients

__all__ = [
    "Adasum", "Average", "Compression", "DistributedGradientTape", "HorovodInternalError",
    "HostsUpdatedInterrupt", "Max", "Min", "ProcessSet", "Product", "Sum", "add_process_set",
    "allgather", "allreduce", "broadcast", "broadcast_variables", "cross_rank", "cross_size",
    "global_process_set", "init", "is_homogeneous", "is_initialized", "local_rank",
    "local_size", "mpi_built", "mpi_enabled", "mpi_threads_supported", "rank",
    "remove_process_set", "shutdown", "size",
]


class Compression:
    """Horovod's TensorFlow compressors: ``none`` and ``fp16`` (``compress``/``decompress``)."""

    class none:  # noqa: N801  (Horovod's name)
        """Sends tensors as they are."""

        @staticmethod
        def compress(tensor: Any) -> tuple[Any, Any]:
            return tensor, None

        @staticmethod
        def decompress(tensor: Any, ctx: Any) -> Any:
            return tensor

    class fp16:  # noqa: N801  (Horovod's name)
        """Floating tensors travel as float16 and come back in their own dtype."""

        @staticmethod
        def compress(tensor: Any) -> tuple[Any, Any]:
            if tensor.dtype.is_floating and tensor.dtype != tf.float16:
                return tf.cast(tensor, tf.float16), tensor.dtype
            return tensor, None

        @staticmethod
        def decompress(tensor: Any, ctx: Any) -> Any:
            return tensor if ctx is None else tf.cast(tensor, ctx)


def _run(call: Call, ps: ProcessSet) -> list[np.ndarray]:
    return list(ps.runner().submit(call).wait())


def _eager_or_graph(fn: Any, tensor: Any, dtype: Any) -> Any:
    if tf.executing_eagerly():
        return tf.convert_to_tensor(fn(np.asarray(tensor)))
    return tf.numpy_function(fn, [tensor], dtype, stateful=True)


def allreduce(tensor: Any, average: bool | None = None, device_dense: str = "",
              device_sparse: str = "", compression: Any = Compression.none,
              op: int | None = None, prescale_factor: float = 1.0,
              postscale_factor: float = 1.0, name: str | None = None,
              process_set: ProcessSet = global_process_set) -> Any:
    """``tensor`` reduced over the process set with ``op`` (default Average)."""
    if average is not None and op is not None:
        raise ValueError("pass op= or the deprecated average=, not both")
    how = (Sum if average is False else Average) if op is None else op
    if how not in OP_NAMES:
        raise ValueError(f"op is {op!r}; expected hvd.Average, Sum, Adasum, Min, Max, Product")
    tensor = tf.convert_to_tensor(tensor)
    sent, ctx = compression.compress(tensor)
    set_size = process_set.runner().size

    def reduce(a: np.ndarray) -> np.ndarray:
        a = np.ascontiguousarray(a)
        floats = a.dtype.kind == "f"
        if prescale_factor != 1.0:
            a = (a * prescale_factor).astype(a.dtype)
        engine_op = ("MEAN" if floats else "SUM") if how == Average else ENGINE_OP[how]
        (r,) = _run(Call("allreduce", [a], op=engine_op, tag=f"tf {OP_NAMES[how]}"), process_set)
        if how == Average and not floats:
            r = r // set_size
        if postscale_factor != 1.0:
            r = (r * postscale_factor).astype(a.dtype)
        return np.asarray(r, dtype=a.dtype).reshape(a.shape)

    out = _eager_or_graph(reduce, sent, sent.dtype)
    if not tf.executing_eagerly():
        out.set_shape(sent.shape)
    return compression.decompress(out, ctx)


def allgather(tensor: Any, name: str | None = None,
              process_set: ProcessSet = global_process_set) -> Any:
    """Every rank's ``tensor`` concatenated along dimension 0 (which may differ per rank)."""
    tensor = tf.convert_to_tensor(tensor)

    def gather(a: np.ndarray) -> np.ndarray:
        (r,) = _run(Call("allgather", [np.ascontiguousarray(a)], tag="tf"), process_set)
        return np.array(r)

    return _eager_or_graph(gather, tensor, tensor.dtype)


def broadcast(tensor: Any, root_rank: int, name: str | None = None,
              process_set: ProcessSet = global_process_set) -> Any:
    """``root_rank``'s ``tensor`` on every rank of the set."""
    tensor = tf.convert_to_tensor(tensor)

    def bcast(a: np.ndarray) -> np.ndarray:
        (r,) = _run(Call("broadcast", [np.ascontiguousarray(a)], root=root_rank, tag="tf"),
                    process_set)
        return np.array(r).reshape(a.shape)

    return _eager_or_graph(bcast, tensor, tensor.dtype)


def broadcast_variables(variables: Sequence[Any], root_rank: int,
                        process_set: ProcessSet = global_process_set) -> None:
    """Assign ``root_rank``'s values to ``variables`` on every rank, in one call."""
    variables = list(variables)
    arrays = [np.ascontiguousarray(v.numpy()) for v in variables]
    got = _run(Call("broadcast", arrays, root=root_rank, tag="tf variables"), process_set)
    for v, value in zip(variables, got, strict=True):
        v.assign(np.asarray(value).reshape(v.shape))


class _Tape:
    """A ``tf.GradientTape`` whose ``gradient`` reduces over the process set."""

    def __init__(self, tape: Any, compression: Any, op: int, predivide: float,
                 process_set: ProcessSet) -> None:
        self._tape, self._compression, self._op = tape, compression, op
        self._predivide, self._ps = predivide, process_set

    def gradient(self, target: Any, sources: Any, *args: Any, **kwargs: Any) -> Any:
        grads = self._tape.gradient(target, sources, *args, **kwargs)
        flat = tf.nest.flatten(grads)
        pairs = [self._compression.compress(g / self._predivide if self._predivide != 1.0
                                            else g) if g is not None else (None, None)
                 for g in flat]
        engine = self._ps.group().engine()
        reduced = allreduce_gradients([p[0] for p in pairs],
                                      "SUM" if self._op == Sum else "MEAN", engine)
        out = [None if r is None else self._compression.decompress(r, p[1]) * self._predivide
               if self._predivide != 1.0 else self._compression.decompress(r, p[1])
               for r, p in zip(reduced, pairs, strict=True)]
        return tf.nest.pack_sequence_as(grads, out)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._tape, name)

    def __enter__(self) -> _Tape:
        self._tape.__enter__()
        return self

    def __exit__(self, *exc: Any) -> Any:
        return self._tape.__exit__(*exc)


def DistributedGradientTape(  # noqa: N802  (Horovod's name)
    gradtape: Any, device_dense: str = "", device_sparse: str = "",
    compression: Any = Compression.none, sparse_as_dense: bool = False, op: int = Average,
    gradient_predivide_factor: float = 1.0, num_groups: int = 0, groups: Any = None,
    process_set: ProcessSet = global_process_set,
) -> Any:
    """Wrap ``gradtape`` so that ``gradient(...)`` is averaged (``op=Average``) or summed
    (``Sum``) over the process set (``IndexedSlices`` are made dense)."""
    if op not in (Average, Sum):
        raise ValueError(f"op is {op!r}; DistributedGradientTape takes hvd.Average or hvd.Sum")
    if gradient_predivide_factor != 1.0 and op != Average:
        raise ValueError("gradient_predivide_factor needs op=hvd.Average")
    return _Tape(gradtape, compression, op, float(gradient_predivide_factor), process_set)
