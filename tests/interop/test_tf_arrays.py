"""TensorFlow tensors through the engine and hpcdist.tensorflow, one process."""

from __future__ import annotations

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
import tensorflow as tf  # noqa: E402

import hpcdist.tensorflow as hdtf  # noqa: E402
from hpcdist.collectives import Collectives  # noqa: E402
from hpcdist.runtime import mpi  # noqa: E402


def test_engine_returns_tf_tensors() -> None:
    c = Collectives(mpi().COMM_SELF)
    out = c.allreduce([tf.constant([1.0, 2.0]), tf.Variable([3, 4])], "SUM")
    assert all(tf.is_tensor(t) for t in out)
    assert out[0].numpy().tolist() == [1.0, 2.0] and out[1].numpy().tolist() == [3, 4]
    assert tf.is_tensor(c.allgather(tf.constant([1.0])))


def test_bfloat16_reduces_and_returns_as_bfloat16() -> None:
    t = tf.constant([1.0, 2.0**-8, -3.5], tf.bfloat16)
    (out,) = Collectives(mpi().COMM_SELF).allreduce([t], "MEAN")
    assert tf.is_tensor(out) and out.dtype == tf.bfloat16
    assert out.numpy().astype(np.float32).tolist() == [1.0, 2.0**-8, -3.5]


def test_gradients_reduce_in_a_tf_function_and_keep_none() -> None:
    v, unused = tf.Variable([1.0, 2.0]), tf.Variable([0.0])

    @tf.function
    def grads():
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(v * v)
        return hdtf.DistributedGradientTape(tape).gradient(loss, [v, unused])

    g, none = grads()
    assert none is None and g.shape == (2,) and g.numpy().tolist() == [2.0, 4.0]


def test_keras_optimizer_wrapper_keeps_its_class() -> None:
    opt = hdtf.DistributedOptimizer(keras.optimizers.SGD(0.5))
    assert isinstance(opt, keras.optimizers.SGD)
    v = keras.Variable(np.ones(2, np.float32))
    opt.apply_gradients([(tf.constant([2.0, 2.0]), v)])
    assert np.allclose(keras.ops.convert_to_numpy(v), [0.0, 0.0])
    with pytest.raises(TypeError, match="keras.optimizers.Optimizer"):
        hdtf.DistributedOptimizer(object())
