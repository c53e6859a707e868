"""bfloat16 tensors and compressed gradients of the framework adapters on several ranks.

The route is forced to MPI (``HPCDIST_COLLECTIVES=mpi``) so that the compressed
transport runs even though the ranks share a node; the references are built on
every rank from every rank's local gradients (gathered with mpi4py).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import hpcdist.torch as hdt
from hpcdist import arrays
from hpcdist.arrays import BFLOAT16
from hpcdist.collectives import Collectives, CommunicationOptions
from hpcdist.runtime import mpi, world

pytestmark = pytest.mark.mpi(min_size=2)


@pytest.fixture
def over_mpi(monkeypatch):
    monkeypatch.setenv("HPCDIST_COLLECTIVES", "mpi")


def _gather(x: np.ndarray) -> list[np.ndarray]:
    return mpi().COMM_WORLD.allgather(np.array(x, copy=True))


def _compressed_mean(parts: list[np.ndarray]) -> np.ndarray:
    """Each rank's values rounded to bf16, summed in float32 in rank order, rounded once,
    divided by the number of ranks in float32."""
    acc = parts[0].astype(BFLOAT16).astype(np.float32)
    for p in parts[1:]:
        acc = acc + p.astype(BFLOAT16).astype(np.float32)
    return acc.astype(BFLOAT16).astype(np.float32) / np.float32(len(parts))


def test_torch_bf16_tensor_reduces_in_place_bitwise() -> None:
    rank, size = world().rank, world().size
    g = torch.Generator().manual_seed(3 + rank)
    t = torch.randn(5000, generator=g).to(torch.bfloat16)
    assert arrays.import_array(t).ctypes.data == t.data_ptr()  # no copy on the way in
    parts = _gather(arrays.import_array(t))
    Collectives().allreduce([t], "SUM", out=[t])
    acc = parts[0].astype(np.float32)
    for p in parts[1:]:
        acc = acc + p.astype(np.float32)
    np.testing.assert_array_equal(
        arrays.import_array(t).view(np.uint16), acc.astype(BFLOAT16).view(np.uint16)
    )
    assert size == len(parts)


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 4))


@pytest.mark.parametrize("overlap", [True, False])
def test_torch_distributed_optimizer_compresses_weights_not_biases(over_mpi, overlap) -> None:
    rank = world().rank
    model = _model()
    opt = hdt.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.1), model=model, overlap=overlap,
        compression="bf16", compression_filter=lambda g: g.ndim > 1,
    )
    g = torch.Generator().manual_seed(10 + rank)
    x, y = torch.randn(16, 64, generator=g), torch.randn(16, 4, generator=g)
    torch.nn.functional.mse_loss(model(x), y).backward()
    local = [p.grad.detach().clone().numpy() for p in model.parameters()]
    opt.synchronize()
    exact = Collectives().allreduce(local[1::2], "MEAN")  # the biases, uncompressed
    for i, p in enumerate(model.parameters()):
        got = p.grad.numpy()
        if p.ndim > 1:
            np.testing.assert_array_equal(got, _compressed_mean(_gather(local[i])))
        else:
            # float32 MEAN (MPI's summation order may follow the fused length): far
            # closer than bf16's 2**-8 rounding would leave it
            np.testing.assert_allclose(got, exact[i // 2], rtol=1e-6, atol=1e-7)


def test_torch_bf16_model_trains_with_bf16_gradients(over_mpi) -> None:
    """A bf16 model: its bf16 gradients are reduced as bf16 (no compression needed)."""
    rank = world().rank
    model = _model().to(torch.bfloat16)
    opt = hdt.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05), model=model)
    g = torch.Generator().manual_seed(20 + rank)
    x = torch.randn(16, 64, generator=g).to(torch.bfloat16)
    torch.nn.functional.mse_loss(model(x).float(), torch.zeros(16, 4)).backward()
    local = [arrays.import_array(p.grad.detach().clone()) for p in model.parameters()]
    opt.step()
    w = arrays.import_array(model[0].weight.grad)
    parts = _gather(local[0])
    acc = parts[0].astype(np.float32)
    for p in parts[1:]:
        acc = acc + p.astype(np.float32)
    expected = (acc / np.float32(len(parts))).astype(BFLOAT16)
    np.testing.assert_array_equal(w.view(np.uint16), expected.view(np.uint16))


def test_jax_all_reduce_with_compression(over_mpi) -> None:
    import jax.numpy as jnp  # lazy: keeps this file's torch tests free of JAX start-up

    import hpcdist.jax as hdj

    rank = world().rank
    rng = np.random.default_rng(rank)
    w = rng.standard_normal((32, 16)).astype(np.float32)
    b = jnp.asarray(rng.standard_normal(16).astype(np.float32)).astype(jnp.bfloat16)
    out = hdj.all_reduce({"w": jnp.asarray(w), "b": b}, compression="bf16")
    np.testing.assert_array_equal(np.asarray(out["w"]), _compressed_mean(_gather(w)))
    assert out["b"].dtype == jnp.bfloat16
    parts = _gather(np.asarray(b))
    acc = parts[0].astype(np.float32)
    for p in parts[1:]:
        acc = acc + p.astype(np.float32)
    expected = (acc / np.float32(len(parts))).astype(BFLOAT16)
    np.testing.assert_array_equal(np.asarray(out["b"]).view(np.uint16), expected.view(np.uint16))


def test_tensorflow_gradients_with_compression(over_mpi) -> None:
    import tensorflow as tf  # lazy: optional framework, started only for this test

    import hpcdist.tensorflow as hdtf

    rank = world().rank
    rng = np.random.default_rng(40 + rank)
    g = rng.standard_normal((8, 8)).astype(np.float32)
    (out,) = hdtf.allreduce_gradients([tf.constant(g)], compression="fp16")
    acc = _gather(g)
    total = acc[0].astype(np.float16).astype(np.float32)
    for p in acc[1:]:
        total = total + p.astype(np.float16).astype(np.float32)
    expected = total.astype(np.float16).astype(np.float32) / np.float32(len(acc))
    np.testing.assert_array_equal(out.numpy(), expected)


def test_wrong_compression_is_a_typed_error_before_any_traffic() -> None:
    with pytest.raises(ValueError, match="compression is 'int4'"):
        hdt.DistributedOptimizer(torch.optim.SGD(_model().parameters(), lr=0.1), compression="int4")
    with pytest.raises(TypeError, match="compression_filter"):
        CommunicationOptions(compression="bf16", compression_filter=3)
