"""Checkpoints under MultiWorkerMirroredStrategy (``mpirun -n 2`` / ``-n 4``).

Only the chief writes; every rank restores bitwise the same state (even after
each rank scribbled its own values over it); per-worker meta comes back to its
own worker; damaged files raise the same error on every rank, and the manager
falls back to the previous checkpoint on every rank.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
import warnings

import numpy as np
import pytest

import hpcdist as hd
from hpcdist.checkpoint import Checkpoint, CheckpointManager
from hpcdist.checkpoint import format as fmt
from hpcdist.checkpoint import state_file as state_file_module
from hpcdist.errors import CheckpointCorruptError
from hpcdist.optimizers import SGD, Adam
from hpcdist.runtime import world

pytestmark = [pytest.mark.mpi(min_size=2), pytest.mark.timeout(120)]

SHAPES = [(4, 3), (3,)]
_STRATEGIES: dict[int, hd.MultiWorkerMirroredStrategy] = {}


def strategy(replicas: int) -> hd.MultiWorkerMirroredStrategy:
    if replicas not in _STRATEGIES:
        devices = [f"/cpu:{i}" for i in range(replicas)]
        _STRATEGIES[replicas] = hd.MultiWorkerMirroredStrategy(devices=devices)
    return _STRATEGIES[replicas]


def allgather(x) -> np.ndarray:
    """Every rank's array (same shape and dtype everywhere), buffer-mode."""
    comm = world().comm
    x = np.ascontiguousarray(x)
    out = np.empty((comm.Get_size(), *x.shape), x.dtype)
    comm.Allgather(x, out)
    return out


def digest(text: str) -> np.ndarray:
    return np.frombuffer(hashlib.sha256(text.encode()).digest(), np.uint8).copy()


@pytest.fixture
def shared_dir():
    comm = world().comm
    buf = np.zeros(4096, np.uint8)
    if comm.Get_rank() == 0:
        path = tempfile.mkdtemp(prefix="hpcdist-ckpt-").encode()
        buf[: len(path)] = np.frombuffer(path, np.uint8)
    comm.Bcast(buf, root=0)
    path = buf.tobytes().rstrip(b"\0").decode()
    yield path
    comm.Barrier()
    if comm.Get_rank() == 0:
        shutil.rmtree(path, ignore_errors=True)


def grads_of(step: int, replica: int) -> list[np.ndarray]:
    rng = np.random.default_rng(1000 * step + replica)
    return [rng.standard_normal(s) * (replica + 1) for s in SHAPES]


def build(s, kind, seed):
    rng = np.random.default_rng(seed)
    with s.scope():
        variables = [hd.Variable(rng.standard_normal(shape), name=f"v{i}")
                     for i, shape in enumerate(SHAPES)]  # fmt: skip
        opt = SGD(0.05, momentum=0.9) if kind == "sgd" else Adam(0.01)
    return variables, opt


def run_steps(s, variables, opt, steps):
    def replica_fn(step):
        rid = hd.get_replica_context().replica_id_in_sync_group
        return opt.apply_gradients(zip(grads_of(step, rid), variables, strict=True))

    for step in steps:
        s.run(replica_fn, args=(step,))


@pytest.mark.parametrize("replicas", [1, 2])
@pytest.mark.parametrize("kind", ["sgd", "adam"])
def test_only_the_chief_writes_and_training_resumes_identically(
    shared_dir, replicas, kind, monkeypatch
):
    s = strategy(replicas)
    rank = world().rank
    variables, opt = build(s, kind, 0)
    run_steps(s, variables, opt, range(6))
    reference = np.concatenate([v.numpy().ravel() for v in variables])

    variables, opt = build(s, kind, 0)
    run_steps(s, variables, opt, range(3))
    writes: list[str] = []
    real = fmt.atomic_write

    def counting(path, fn):
        writes.append(os.path.basename(path))
        return real(path, fn)

    real_hashed = fmt.atomic_write_hashed

    def counting_hashed(path, fn):
        writes.append(os.path.basename(path))
        return real_hashed(path, fn)

    monkeypatch.setattr(fmt, "atomic_write", counting)
    monkeypatch.setattr(fmt, "atomic_write_hashed", counting_hashed)
    monkeypatch.setattr(state_file_module, "atomic_write", counting)  # the state file
    path = Checkpoint(vars=variables, opt=opt).save(os.path.join(shared_dir, "run"))
    monkeypatch.undo()
    assert path == os.path.join(shared_dir, "run-1")  # the same path on every rank
    counts = allgather(np.array([len(writes)], np.int64))[:, 0]
    assert counts[0] == 3 and not counts[1:].any(), counts  # data, manifest, state file
    if rank == 0:
        assert sorted(writes) == ["checkpoint", "run-1.data.npz", "run-1.index.json"]

    fresh, fresh_opt = build(s, kind, 123)
    for v in fresh:  # each rank scribbles its own values over its copy (no sync here)
        v.assign(np.full(v.shape, float(rank + 7)))
    status = Checkpoint(vars=fresh, opt=fresh_opt).restore(path)
    assert int(fresh_opt.iterations) == 3
    assert status.save_counter == 1
    restored = np.concatenate([v.numpy().ravel() for v in fresh])
    everyone = allgather(restored)
    assert (everyone == everyone[0]).all()
    run_steps(s, fresh, fresh_opt, range(3, 6))
    status.assert_consumed()
    for v in fresh:
        comps = [c.numpy() for c in v.values]
        assert all(np.array_equal(c, comps[0]) for c in comps)
    final = np.concatenate([v.numpy().ravel() for v in fresh])
    assert final.tobytes() == reference.tobytes()
    assert (allgather(final) == final).all()


class RankState:
    """Per-worker state: meta differs on every rank."""

    def __init__(self, value):
        self.value = value

    def _checkpoint_state(self):
        return {}, {"rank_value": self.value, "huge": 7**100 + self.value}

    def _restore_checkpoint_state(self, arrays, meta):
        assert meta["huge"] == 7**100 + meta["rank_value"]
        self.value = meta["rank_value"]


def test_per_worker_meta_round_trip(shared_dir):
    s = strategy(1)
    comm = world().comm
    rank, size = comm.Get_rank(), comm.Get_size()
    with s.scope():
        w = hd.Variable(np.arange(3.0))
    rng = np.random.default_rng(rank)  # each worker's own stream
    mine = RankState(100 + rank)
    ckpt = Checkpoint(w=w, rng=rng, mine=mine)
    path = ckpt.write(os.path.join(shared_dir, "meta"))
    expected = rng.random(4)
    rng.random(50)
    mine.value = -1
    ckpt.read(path).assert_consumed()
    got = rng.random(4)
    np.testing.assert_array_equal(got, expected)
    assert mine.value == 100 + rank
    streams = allgather(got)
    assert len({row.tobytes() for row in streams}) == size  # the streams really differ
    if rank == 0:
        with open(path + ".index.json") as f:
            m = json.load(f)
        assert m["num_workers"] == size
        assert [pw["mine"]["rank_value"] for pw in m["meta"]["per_worker"]] == [
            100 + r for r in range(size)
        ]


def test_sync_on_read_variable_saves_the_aggregate(shared_dir):
    s = strategy(2)
    with s.scope():
        v = hd.Variable(
            0.0,
            synchronization=hd.VariableSynchronization.ON_READ,
            aggregation=hd.VariableAggregation.SUM,
        )

    def set_mine():
        rid = hd.get_replica_context().replica_id_in_sync_group
        v.assign(float(rid + 1))

    s.run(set_mine)
    n = s.num_replicas_in_sync
    total = n * (n + 1) / 2
    assert float(v.read_value()) == total
    path = Checkpoint(v=v).write(os.path.join(shared_dir, "sor"))
    s.run(lambda: v.assign(0.0))
    Checkpoint(v=v).read(path)
    assert float(v.read_value()) == total


def test_a_damaged_file_raises_on_every_rank_and_the_manager_falls_back(shared_dir):
    s = strategy(1)
    comm = world().comm
    rank = comm.Get_rank()
    with s.scope():
        w = hd.Variable(np.zeros(5))
    manager = CheckpointManager(Checkpoint(w=w), shared_dir, max_to_keep=3)
    for step in (1, 2):
        w.assign(np.full(5, float(step)))
        manager.save()
    newest = manager.latest_checkpoint
    if rank == 0:
        data = newest + ".data.npz"
        raw = bytearray(open(data, "rb").read())
        raw[len(raw) // 2] ^= 0x10
        open(data, "wb").write(bytes(raw))
    comm.Barrier()
    w.assign(np.full(5, -1.0))
    with pytest.raises(CheckpointCorruptError, match=r"ckpt-2\.data\.npz' has SHA-256") as info:
        Checkpoint(w=w).restore(newest)
    messages = allgather(digest(str(info.value)))
    assert (messages == messages[0]).all()  # the same error text on every rank
    assert w.numpy().tolist() == [-1.0] * 5  # nothing was assigned

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        restored = manager.restore_or_initialize()
    assert restored == os.path.join(shared_dir, "ckpt-1")
    assert w.numpy().tolist() == [1.0] * 5
    damaged = [c for c in caught if "ckpt-2' is damaged" in str(c.message)]
    assert len(damaged) == (1 if rank == 0 else 0)  # the chief reports it, once
