"""PyTorch tensors through the engine and the Strategy API, one process: zero-copy and bad input."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
import torch

import hpcdist as hd
from hpcdist import arrays
from hpcdist.collectives import Collectives
from hpcdist.collectives import engine as engine_module
from hpcdist.errors import ArrayInteropError
from hpcdist.runtime import mpi


@pytest.fixture()
def engine() -> Collectives:
    return Collectives(mpi().COMM_SELF)


def test_import_hpcdist_imports_no_framework() -> None:
    code = (
        "import sys, hpcdist, hpcdist.arrays, hpcdist.adapters, hpcdist.distribute; "
        "bad = [m for m in ('torch', 'jax', 'tensorflow') if m in sys.modules]; "
        "print(bad); sys.exit(1 if bad else 0)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr


def test_import_array_shares_memory() -> None:
    t = torch.arange(6, dtype=torch.float32).reshape(2, 3)
    view = arrays.import_array(t)
    assert isinstance(view, np.ndarray)
    assert view.ctypes.data == t.data_ptr()
    view[0, 0] = 42.0
    assert t[0, 0].item() == 42.0


def test_engine_reads_the_tensor_memory_in_place(engine, monkeypatch) -> None:
    seen: list[int] = []  # the addresses of the NumPy arrays the engine reduces from
    real, real_plain = engine_module._host_arrays, engine_module._plain_host_arrays

    def spy(tensors, operation):
        items, places = real(tensors, operation)
        seen.extend(a.ctypes.data for a in items)
        return items, places

    def plain_spy(tensors):  # the fast path for a list of plain NumPy arrays
        places = real_plain(tensors)
        if places is not None:
            seen.extend(a.ctypes.data for a in tensors)
        return places

    monkeypatch.setattr(engine_module, "_host_arrays", spy)
    monkeypatch.setattr(engine_module, "_plain_host_arrays", plain_spy)
    a, b = torch.ones(5, dtype=torch.float64), torch.arange(4, dtype=torch.int32)
    out = engine.allreduce([a, b], "SUM")
    assert seen == [a.data_ptr(), b.data_ptr()]
    assert isinstance(out[0], torch.Tensor) and out[0].dtype == torch.float64
    assert torch.equal(out[1], b)


def test_out_writes_into_the_tensor(engine) -> None:
    t = torch.full((3,), 2.0)
    ptr = t.data_ptr()
    result = engine.allreduce([t], "MEAN", out=[t])
    assert result[0] is t and t.data_ptr() == ptr
    assert torch.equal(t, torch.full((3,), 2.0))


def test_result_tensor_shares_the_result_buffer() -> None:
    like = torch.zeros(1)
    result = np.arange(4.0)
    t = arrays.export_like(like, result)
    assert isinstance(t, torch.Tensor) and t.data_ptr() == result.ctypes.data


def test_every_engine_operation_returns_tensors(engine) -> None:
    t = torch.arange(4, dtype=torch.float32)
    assert isinstance(engine.allgather(t), torch.Tensor)
    assert isinstance(engine.reduce_scatter(t, "SUM"), torch.Tensor)
    (b,) = engine.broadcast([t], root=0)
    assert isinstance(b, torch.Tensor) and torch.equal(b, t)


def test_requires_grad_is_refused(engine) -> None:
    w = torch.ones(3, requires_grad=True)
    with pytest.raises(ArrayInteropError, match="requires grad.*detach"):
        engine.allreduce([w], "SUM")
    assert torch.equal(engine.allreduce([w.detach()], "SUM")[0], torch.ones(3))


def test_non_contiguous_view_is_refused(engine) -> None:
    t = torch.arange(12.0).reshape(3, 4).t()
    with pytest.raises(ArrayInteropError, match="non-contiguous.*contiguous\\(\\)"):
        engine.allreduce([t], "SUM")


def test_bfloat16_arrives_without_a_copy_and_returns_as_bfloat16(engine) -> None:
    t = torch.tensor([1.0, 2.0**-8, -3.5], dtype=torch.bfloat16)
    view = arrays.import_array(t)
    assert view.dtype == arrays.BFLOAT16 and view.ctypes.data == t.data_ptr()
    (out,) = engine.allreduce([t], "MEAN")
    assert out.dtype is torch.bfloat16 and torch.equal(out, t)
    target = torch.zeros(3, dtype=torch.bfloat16)
    engine.allreduce([t], "SUM", out=[target])  # written in place through the view
    assert torch.equal(target, t)


def test_bfloat16_on_a_gpu_is_refused_with_a_fix() -> None:
    class FakeCuda:  # only the attributes _from_torch reads before the device check
        requires_grad = False
        layout = torch.strided
        dtype = torch.bfloat16
        device = torch.device("cuda", 0)

        def is_contiguous(self) -> bool:
            return True

        def is_conj(self) -> bool:
            return False

        def is_neg(self) -> bool:
            return False

    with pytest.raises(ArrayInteropError, match="bfloat16 on a GPU.*float"):
        arrays._from_torch(FakeCuda())


def test_single_tensor_instead_of_list(engine) -> None:
    with pytest.raises(TypeError, match="list of arrays"):
        engine.allreduce(torch.ones(3), "SUM")


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA GPUs (none here)")
def test_tensor_on_another_gpu_is_refused(engine) -> None:  # pragma: no cover - GPU only
    torch.cuda.set_device(0)
    with pytest.raises(ArrayInteropError, match="another GPU"):
        engine.allreduce([torch.ones(2, device="cuda:1")], "SUM")


def test_strategy_reduce_and_gather_give_tensors() -> None:
    s = hd.MirroredStrategy(["/cpu:0", "/cpu:1"])
    v = s.experimental_distribute_values_from_function(
        lambda ctx: torch.full((2,), float(ctx.replica_id_in_sync_group + 1))
    )
    total = s.reduce("SUM", v, axis=None)
    assert isinstance(total, torch.Tensor) and torch.equal(total, torch.full((2,), 3.0))
    mean = s.reduce("MEAN", v, axis=0)
    assert isinstance(mean, torch.Tensor) and mean.item() == pytest.approx(1.5)
    gathered = s.gather(v, axis=0)
    assert isinstance(gathered, torch.Tensor) and gathered.tolist() == [1.0, 1.0, 2.0, 2.0]


def test_replica_context_collectives_give_tensors() -> None:
    s = hd.MirroredStrategy(["/cpu:0", "/cpu:1"])

    def fn():
        ctx = hd.get_replica_context()
        x = torch.full((2,), float(ctx.replica_id_in_sync_group))
        return ctx.all_reduce("SUM", {"x": x}), ctx.all_gather(x, axis=0)

    reduced, gathered = s.run(fn)
    for r in s.experimental_local_results(reduced):
        assert isinstance(r["x"], torch.Tensor) and r["x"].tolist() == [1.0, 1.0]
    for g in s.experimental_local_results(gathered):
        assert isinstance(g, torch.Tensor) and g.tolist() == [0.0, 0.0, 1.0, 1.0]


def test_dataset_from_tensor_slices_takes_tensors_without_copy() -> None:
    x = torch.arange(12.0).reshape(6, 2)
    ds = hd.data.Dataset.from_tensor_slices((x, torch.arange(6)))
    assert ds._arrays[0].ctypes.data == x.data_ptr()
    batches = list(ds.batch(3))
    assert np.array_equal(batches[1][0], x[3:].numpy())


def test_hpcdist_optimizer_takes_torch_gradients() -> None:
    s = hd.MirroredStrategy(["/cpu:0"])
    with s.scope():
        v = hd.Variable(np.ones(3))
        opt = hd.optimizers.SGD(learning_rate=0.5)
    s.run(lambda: opt.apply_gradients([(torch.full((3,), 2.0, dtype=torch.float64), v)]))
    assert np.allclose(np.asarray(v.read_value()), 0.0)
