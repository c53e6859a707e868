"""JAX arrays through the engine and hpcdist.jax, one process."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

import hpcdist as hd
import hpcdist.jax as hdj
from hpcdist import arrays
from hpcdist.collectives import Collectives
from hpcdist.runtime import mpi


def test_engine_reads_a_cpu_array_in_place_and_returns_jax() -> None:
    a = jnp.arange(6.0)
    assert arrays.import_array(a).ctypes.data == a.unsafe_buffer_pointer()
    out = Collectives(mpi().COMM_SELF).allreduce([a], "SUM")[0]
    assert isinstance(out, jax.Array) and np.array_equal(np.asarray(out), np.arange(6.0))


def test_bfloat16_arrives_without_a_copy() -> None:
    a = jnp.array([1.0, 2.0**-8, -3.5], jnp.bfloat16)
    view = arrays.import_array(a)
    assert view.dtype == arrays.BFLOAT16 and view.ctypes.data == a.unsafe_buffer_pointer()
    (out,) = Collectives(mpi().COMM_SELF).allreduce([a], "SUM")
    assert isinstance(out, jax.Array) and out.dtype == jnp.bfloat16
    assert np.array_equal(np.asarray(out).view(np.uint16), np.asarray(a).view(np.uint16))


def test_pytree_collectives_inside_and_outside_run() -> None:
    tree = {"w": jnp.ones((2, 2)), "b": [jnp.zeros(3), 2.0]}
    out = hdj.all_reduce(tree, "SUM")
    assert jax.tree_util.tree_structure(out) == jax.tree_util.tree_structure(tree)
    assert isinstance(out["w"], jax.Array) and float(out["b"][1]) == 2.0
    s = hd.MirroredStrategy(["/cpu:0"])
    inside = s.run(lambda: hdj.all_reduce(tree, "MEAN"))
    assert isinstance(inside["w"], jax.Array) and np.array_equal(inside["w"], np.ones((2, 2)))
    gathered = s.run(lambda: hdj.all_gather({"x": jnp.arange(3)}))
    assert isinstance(gathered["x"], jax.Array) and gathered["x"].shape == (3,)
    assert hdj.broadcast(tree)["w"].shape == (2, 2)
