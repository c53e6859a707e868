"""ParameterServerStrategy checkpoints: each ps writes its shard; restore brings values and
optimizer slots back; a damaged shard is refused on the chief while the ps keeps serving.

At least 3 ranks: rank 0 is the ps, the others workers (worker 0 is the lead that saves).
Every client goes through the same ``pause_clients`` blocks, so no rank waits alone.
"""

from __future__ import annotations

import os
import shutil
import tempfile

import numpy as np
import pytest

import hpcdist as hd
from hpcdist.cluster.mpi import MPIClusterResolver
from hpcdist.distribute.partitioners import FixedShardsPartitioner
from hpcdist.distribute.ps.checkpoint import (
    flush_ps_requests,
    is_ps_strategy,
    pause_clients,
    restore_ps_shards,
    save_ps_shards,
)
from hpcdist.distribute.ps.strategy import ParameterServerStrategy
from hpcdist.errors import CheckpointCorruptError, CheckpointError
from hpcdist.optimizers import Adam

pytestmark = [pytest.mark.mpi(min_size=3), pytest.mark.timeout(120)]


def world():
    from mpi4py import MPI

    return MPI.COMM_WORLD


def shared_dir() -> str:
    """A new temporary directory named by world rank 0 (its name sent as bytes, no pickle)."""
    from mpi4py import MPI

    comm = world()
    buf = np.zeros(4096, np.uint8)
    if comm.Get_rank() == 0:
        name = tempfile.mkdtemp(prefix="hpcdist-ps-ckpt-").encode()
        buf[: len(name)] = np.frombuffer(name, np.uint8)
    comm.Bcast([buf, MPI.BYTE], root=0)
    return bytes(buf[buf != 0]).decode()


def make(**kwargs):
    """``(strategy, workers_comm)``; the comm is None on the ps."""
    comm = world()
    resolver = MPIClusterResolver(jobs={"ps": 1, "worker": comm.Get_size() - 1})
    is_ps = resolver.task_type == "ps"
    workers = comm.Split(1 if is_ps else 0, comm.Get_rank())
    strategy = ParameterServerStrategy(resolver, exit_after_serving=False, **kwargs)
    if is_ps:
        workers.Free()
        return strategy, None
    return strategy, workers


def read(variables) -> list[np.ndarray]:
    return [np.array(v.numpy()) for v in variables]


def test_save_train_restore_brings_back_values_and_slots():
    directory = shared_dir()
    strategy, workers = make(variable_partitioner=FixedShardsPartitioner(2))
    if workers is None:
        assert strategy.is_ps and is_ps_strategy(strategy)
        assert strategy.served["failed_clients"] == []
        shutil.rmtree(directory, ignore_errors=True)
        return
    lead = strategy.extended.should_checkpoint
    assert lead == (workers.Get_rank() == 0)
    rng = np.random.default_rng(workers.Get_rank())
    with strategy.scope():
        w = hd.Variable(np.arange(6.0).reshape(3, 2), name="w")
        emb = hd.Variable(np.linspace(0, 1, 10).reshape(5, 2), name="emb")  # two shards
        opt = Adam(learning_rate=0.05)
    params = [w, emb]

    def train(grads):
        strategy.run(lambda: opt.apply_gradients(list(zip(grads, params, strict=True))))

    for _ in range(3):  # every worker: Adam's m, v and step become non-trivial
        train([rng.normal(size=(3, 2)), rng.normal(size=(5, 2))])
    probe = [np.full((3, 2), 0.3), np.full((5, 2), -0.2)]
    prefix = os.path.join(directory, "ckpt-1")
    with pause_clients(strategy, workers):
        if lead:
            fragment = save_ps_shards(strategy, prefix, [w, emb, opt])
            saved_values = read(params)
            saved_step = int(opt.iterations.numpy())
    with pause_clients(strategy, workers):  # one known step from the saved point
        if lead:
            train(probe)
            flush_ps_requests(strategy)
            after_probe = read(params)
    for _ in range(4):  # everyone trains on: values, slots and steps move away
        train([rng.normal(size=(3, 2)), rng.normal(size=(5, 2))])
    with pause_clients(strategy):  # a communicator of the clients made for the pause
        if lead:
            assert sorted(fragment["files"]) == ["ckpt-1.ps-0.npz"]
            assert (
                os.path.getsize(prefix + ".ps-0.npz")
                == fragment["files"]["ckpt-1.ps-0.npz"]["bytes"]
            )
            entries = fragment["ps_variables"]
            names = ["emb/part_0", "emb/part_1", opt.iterations.name, "w/part_0", "w/part_1"]
            assert sorted(entries) == sorted(names)
            assert set(entries["w/part_0"]["keys"]["slots"]["0"]) == {"m", "v"}
            assert entries["emb/part_1"]["steps"]["0"] == 3 * workers.Get_size()
            assert entries[opt.iterations.name]["keys"]["slots"] == {}
            moved = read(params)
            assert not np.array_equal(moved[0], saved_values[0])
            restore_ps_shards(strategy, prefix, fragment)
            for got, want in zip(read(params), saved_values, strict=True):
                np.testing.assert_array_equal(got, want)
            assert int(opt.iterations.numpy()) == saved_step
            train(probe)  # the same step again: equal only if m, v and the steps came back
            flush_ps_requests(strategy)
            for got, want in zip(read(params), after_probe, strict=True):
                np.testing.assert_array_equal(got, want)
            # with fresh slots, Adam's first step moves every element by ~lr: not what we saw
            fresh_step = saved_values[0] - 0.05 * np.sign(probe[0])
            assert not np.allclose(after_probe[0], fresh_step, atol=1e-6)
    workers.Barrier()
    strategy.shutdown()
    workers.Free()


def test_a_flipped_byte_is_refused_on_the_chief_and_the_ps_keeps_serving():
    directory = shared_dir()
    strategy, workers = make()
    if workers is None:
        assert strategy.served["failed_clients"] == []  # the ps served to the end
        shutil.rmtree(directory, ignore_errors=True)
        return
    lead = strategy.extended.should_checkpoint
    with strategy.scope():
        v = hd.Variable(np.arange(4.0), name="v")
        opt = Adam(learning_rate=0.1)
    strategy.run(lambda: opt.apply_gradients([(np.ones(4), v)]))
    prefix = os.path.join(directory, "ckpt-2")
    with pause_clients(strategy, workers):
        if lead:
            fragment = save_ps_shards(strategy, prefix, [v, opt])
            path = prefix + ".ps-0.npz"
            data = bytearray(open(path, "rb").read())
            data[len(data) // 3] ^= 0x10
            open(path, "wb").write(bytes(data))
            before = v.numpy().copy()
            with pytest.raises(CheckpointCorruptError, match="ckpt-2.ps-0.npz is corrupt") as e:
                restore_ps_shards(strategy, prefix, fragment)
            assert "ps task 0" in str(e.value) and "sha256" in str(e.value)
            np.testing.assert_array_equal(v.numpy(), before)  # nothing was changed
            os.remove(path)
            with pytest.raises(CheckpointCorruptError, match="is missing"):
                restore_ps_shards(strategy, prefix, fragment)
            blocker = os.path.join(directory, "a-file")
            open(blocker, "w").close()  # a directory that cannot be made: the ps's write fails
            with pytest.raises(CheckpointError, match="ps task 0: SAVE: .*a-file") as e:
                save_ps_shards(strategy, os.path.join(blocker, "ckpt-3"), [v])
            assert not isinstance(e.value, CheckpointCorruptError)
    strategy.run(lambda: opt.apply_gradients([(np.ones(4), v)]))  # the ps still serves
    flush_ps_requests(strategy)
    workers.Barrier()
    assert int(opt.iterations.numpy()) == 2 * workers.Get_size()
    workers.Barrier()
    strategy.shutdown()
    workers.Free()
