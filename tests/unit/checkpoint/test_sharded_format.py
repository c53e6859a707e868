"""The sharded checkpoint format in one process: ranks written in turn, read at other sizes."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

from hpcdist.checkpoint import sharded
from hpcdist.distribute.sharding import FlatShardLayout, overlaps
from hpcdist.errors import CheckpointCorruptError, CheckpointError, CheckpointNotFoundError

SIZES = [7, 3, 12, 5]
BUCKETS = [[3, 2], [1, 0]]
NAMES = ["d.w", "d.b", "c.w", "c.b"]
SHAPES = [[7], [3], [3, 4], [5]]


def _full(seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.normal(size=n).astype(np.float32) for n in SIZES]


def _shard(layout: FlatShardLayout, rank: int, full: list[np.ndarray]) -> np.ndarray:
    out = np.zeros(layout.shard_size, np.float32)
    for s in layout.segments(rank):
        out[s.at : s.at + s.length] = full[s.param][s.start : s.start + s.length]
    return out


def _write(directory: str, n: int) -> tuple[list[np.ndarray], list[np.ndarray]]:
    layout = FlatShardLayout(SIZES, BUCKETS, n)
    params, moments = _full(1), _full(2)
    for rank in reversed(range(n)):  # rank 0 last: it writes the manifest
        vectors = {"param": _shard(layout, rank, params), "m": _shard(layout, rank, moments)}
        sharded.save(directory, layout, rank, NAMES, SHAPES, vectors,
                     {"step": np.float32(9)}, barrier=lambda: None)
    return params, moments


def test_every_element_is_in_exactly_one_shard() -> None:
    for n in (1, 2, 3, 4, 7, 40):
        layout = FlatShardLayout(SIZES, BUCKETS, n)
        seen = [np.zeros(s, int) for s in SIZES]
        for r in range(n):
            for s in layout.segments(r):
                seen[s.param][s.start : s.start + s.length] += 1
        assert all((x == 1).all() for x in seen)
        assert layout.shard_size <= sum(SIZES) / n + len(BUCKETS)


@pytest.mark.parametrize(("saved", "loaded"), [(2, 3), (4, 1), (3, 4), (1, 2)])
def test_reshard_is_bitwise(tmp_path, saved: int, loaded: int) -> None:
    params, moments = _write(str(tmp_path), saved)
    layout = FlatShardLayout(SIZES, [[3], [2, 1], [0]], loaded)  # other buckets too
    for rank in range(loaded):
        vectors, scalars, manifest = sharded.load(str(tmp_path), layout, rank, NAMES, SHAPES,
                                                  np.float32)
        assert manifest["world_size"] == saved
        assert vectors["param"].tobytes() == _shard(layout, rank, params).tobytes()
        assert vectors["m"].tobytes() == _shard(layout, rank, moments).tobytes()
        assert scalars["step"] == np.float32(9) and scalars["step"].dtype == np.float32


def test_overlaps_find_every_piece() -> None:
    a = FlatShardLayout(SIZES, BUCKETS, 3)
    b = FlatShardLayout(SIZES, BUCKETS, 2)
    total = sum(n for q in range(3) for _, _, n in overlaps(b.segments(0), a.segments(q)))
    assert total == sum(s.length for s in b.segments(0))


def test_wrong_model_dtype_and_files_are_typed_errors(tmp_path) -> None:
    d = str(tmp_path)
    with pytest.raises(CheckpointNotFoundError):
        sharded.read_manifest(d)
    _write(d, 2)
    layout = FlatShardLayout(SIZES, BUCKETS, 2)
    with pytest.raises(CheckpointError, match="another model"):
        sharded.load(d, layout, 0, ["x", *NAMES[1:]], SHAPES, np.float32)
    with pytest.raises(CheckpointError, match="another model"):
        sharded.load(d, layout, 0, NAMES, [[7], [3], [4, 3], [5]], np.float32)
    with pytest.raises(CheckpointError, match="float64"):
        sharded.load(d, layout, 0, NAMES, SHAPES, np.float64)
    np.save(os.path.join(d, "rank-00001", "m.npy"), np.zeros(3, np.float32))
    with pytest.raises(CheckpointCorruptError, match="manifest says"):
        sharded.load(d, layout, 1, NAMES, SHAPES, np.float32)
    os.remove(os.path.join(d, "rank-00001", "m.npy"))
    with pytest.raises(CheckpointCorruptError, match="missing"):
        sharded.load(d, layout, 1, NAMES, SHAPES, np.float32)
    path = os.path.join(d, "manifest.json")
    m = json.loads(open(path).read())
    m["segments"] = m["segments"][:1]
    with open(path, "w") as f:
        json.dump(m, f)
    with pytest.raises(CheckpointCorruptError, match="one segment list per rank"):
        sharded.read_manifest(d)
