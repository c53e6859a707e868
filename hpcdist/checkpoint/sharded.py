"""Sharded checkpoints: every rank writes its own slice; any world size reads them back.

A sharded optimizer (ZeRO-1/ZeRO-2, :mod:`hpcdist.distribute.sharding`)
holds, per rank, shard-long flat vectors: its slice of the parameters and
of each per-element optimizer state (Adam's moments), plus scalar state
(the step count). :func:`save` writes them in parallel, without gathering
anything on rank 0::

    DIR/manifest.json          written last, by rank 0: the checkpoint is complete
    DIR/rank-00000/param.npy   each rank's shard-long vectors, one .npy per name
    DIR/rank-00000/exp_avg.npy
    DIR/rank-00001/...

The manifest holds the flat layout (parameter names and shapes in flat
order, buckets, world size, slice sizes, every rank's segments), the dtype,
the names of the vectors, the scalars and the byte size of every file::

    {"format": "hpcdist-sharded-checkpoint", "version": 1, "world_size": 2,
     "dtype": "<f4", "params": [{"name": "0.weight", "shape": [64, 10]}, ...],
     "buckets": [[5, 4], [3, 2, 1, 0]], "slice_sizes": [...], "shard_size": 1234,
     "segments": [[[param, start, length, at], ...], ...], "vectors": ["param", ...],
     "scalars": {"step": {"value": 50.0, "dtype": "<f4"}}, "files": {...}, "meta": {}}

:func:`load` reads, for the layout of the loading job (any world size, any
bucket size), the parts of the saved slices that fall into this rank's new
slices (each saved segment overlapping a new one; the ``.npy`` files are
memory-mapped, never unpickled), so the values come back bit for bit.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from hpcdist.distribute.sharding import FlatShardLayout, Segment, overlaps
from hpcdist.errors import CheckpointCorruptError, CheckpointError, CheckpointNotFoundError
from hpcdist.optimizers import sharded as zero
from hpcdist.runtime.atomic import atomic_write

FORMAT = "hpcdist-sharded-checkpoint"
VERSION = 1
MANIFEST = "manifest.json"


def _rank_dir(directory: str, rank: int) -> str:
    return os.path.join(directory, f"rank-{rank:05d}")


def _file(directory: str, rank: int, name: str) -> str:
    return os.path.join(_rank_dir(directory, rank), f"{name}.npy")


def _check_name(name: str) -> str:
    if not name or not all(c.isalnum() or c in "_-." for c in name) or name.startswith("."):
        raise CheckpointError(f"vector name {name!r}: expected letters, digits, '_', '-', '.'")
    return name


def _npy_writer(vec: np.ndarray) -> Callable[[Any], None]:
    def write(f: Any) -> None:
        np.save(f, vec, allow_pickle=False)

    return write


def save(
    directory: str,
    layout: FlatShardLayout,
    rank: int,
    names: Sequence[str],
    shapes: Sequence[Sequence[int]],
    vectors: dict[str, np.ndarray],
    scalars: dict[str, np.ndarray],
    barrier: Callable[[], None],
    meta: dict | None = None,
) -> None:
    """Write this rank's ``vectors`` (shard-long, one dtype) and, on rank 0, the manifest.

    Collective: every rank of ``layout`` calls it; ``barrier`` is the ranks'
    barrier (the manifest is written after every rank's files and before
    any rank returns).
    """
    if len({str(v.dtype) for v in vectors.values()}) > 1:
        raise CheckpointError("the vectors of a sharded checkpoint must share one dtype")
    os.makedirs(_rank_dir(directory, rank), exist_ok=True)
    for name, vec in vectors.items():
        vec = np.ascontiguousarray(vec)
        if vec.shape != (layout.shard_size,):
            raise CheckpointError(
                f"vector {name!r} has shape {vec.shape}; expected ({layout.shard_size},), the shard"
            )
        atomic_write(_file(directory, rank, _check_name(name)), _npy_writer(vec))
    barrier()
    if rank == 0:
        dtype = next(iter(vectors.values())).dtype.str if vectors else "<f4"
        files = {}
        for q in range(layout.world_size):
            for name in vectors:
                path = _file(directory, q, name)
                files[os.path.relpath(path, directory)] = os.path.getsize(path)
        manifest = {
            "format": FORMAT, "version": VERSION, "world_size": layout.world_size,
            "dtype": dtype,
            "params": [{"name": str(n), "shape": [int(d) for d in s]}
                       for n, s in zip(names, shapes, strict=True)],
            "buckets": layout.buckets, "slice_sizes": layout.slice_sizes,
            "shard_size": layout.shard_size,
            "segments": [[list(s) for s in layout.segments(q)] for q in range(layout.world_size)],
            "vectors": sorted(vectors),
            "scalars": {k: {"value": np.asarray(v).item(), "dtype": np.asarray(v).dtype.str}
                        for k, v in scalars.items()},
            "files": files, "meta": meta or {},
        }
        text = json.dumps(manifest, indent=1).encode()
        atomic_write(os.path.join(directory, MANIFEST), lambda f: f.write(text))
    barrier()


def read_manifest(directory: str) -> dict:
    """The manifest of the sharded checkpoint in ``directory``, checked for its form."""
    path = os.path.join(directory, MANIFEST)
    if not os.path.exists(path):
        raise CheckpointNotFoundError(
            f"no sharded checkpoint in {directory!r}: {MANIFEST} does not exist (the save did "
            "not complete, or this is not a sharded checkpoint)"
        )
    try:
        with open(path, "rb") as f:
            m = json.loads(f.read())
        ok = (m.get("format") == FORMAT and m.get("version") == VERSION
              and isinstance(m.get("segments"), list) and len(m["segments"]) == m["world_size"])
    except (ValueError, KeyError, TypeError, AttributeError) as err:
        raise CheckpointCorruptError(f"{path}: not a readable manifest ({err})") from err
    if not ok:
        raise CheckpointCorruptError(
            f"{path}: expected format {FORMAT!r} version {VERSION} with one segment list per rank"
        )
    return m


def load(
    directory: str,
    layout: FlatShardLayout,
    rank: int,
    names: Sequence[str],
    shapes: Sequence[Sequence[int]],
    dtype: Any,
) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray], dict]:
    """This rank's shard-long vectors for ``layout``, the scalars and the manifest.

    The model described by ``names`` and ``shapes`` (in ``layout``'s flat
    order) must be the saved one, parameter for parameter (by name); the
    world size and buckets may differ. Raises :class:`CheckpointError` for a
    model or dtype that does not match, :class:`CheckpointCorruptError` for
    files that do not match the manifest.
    """
    m = read_manifest(directory)
    saved = {p["name"]: (i, tuple(p["shape"])) for i, p in enumerate(m["params"])}
    mine = {str(n): tuple(int(d) for d in s) for n, s in zip(names, shapes, strict=True)}
    if set(saved) != set(mine) or any(saved[n][1] != s for n, s in mine.items()):
        diff = sorted(n for n in set(saved) | set(mine)
                      if n not in saved or n not in mine or saved[n][1] != mine[n])
        raise CheckpointError(
            f"the sharded checkpoint in {directory!r} holds another model: parameters "
            f"{diff[:5]} differ in name or shape ({len(m['params'])} saved, {len(mine)} here). "
            "Load it into the model it was saved from"
        )
    if np.dtype(m["dtype"]) != np.dtype(dtype):
        raise CheckpointError(
            f"the sharded checkpoint holds {np.dtype(m['dtype'])} values; this model has "
            f"{np.dtype(dtype)}. Cast the model to the saved dtype before loading"
        )
    to_saved = [saved[str(n)][0] for n in names]
    wanted = [Segment(to_saved[s.param], s.start, s.length, s.at) for s in layout.segments(rank)]
    need = sum(s.length for s in wanted)
    vectors = {}
    for name in m["vectors"]:
        out = np.zeros(layout.shard_size, dtype=np.dtype(dtype))
        filled = 0
        for q, segs in enumerate(m["segments"]):
            copies = overlaps(wanted, [Segment(*s) for s in segs])
            if not copies:
                continue
            arr = _open(directory, q, _check_name(name), m)
            for src, dst, n in copies:
                out[dst : dst + n] = arr[src : src + n]
                filled += n
        if filled != need:
            raise CheckpointCorruptError(
                f"{directory}: the saved segments cover {filled} of the {need} elements of this "
                f"rank's slice of {name!r}; the manifest's segments are inconsistent"
            )
        vectors[name] = out
    scalars = {k: np.asarray(v["value"], dtype=np.dtype(v["dtype"]))
               for k, v in m["scalars"].items()}
    return vectors, scalars, m


def _open(directory: str, rank: int, name: str, m: dict) -> np.ndarray:
    path = _file(directory, rank, name)
    try:
        arr = np.load(path, mmap_mode="r", allow_pickle=False)
    except FileNotFoundError as err:
        raise CheckpointCorruptError(f"{path}: missing (the manifest lists it)") from err
    except ValueError as err:
        raise CheckpointCorruptError(f"{path}: not a readable .npy file ({err})") from err
    if arr.shape != (m["shard_size"],) or arr.dtype != np.dtype(m["dtype"]):
        raise CheckpointCorruptError(
            f"{path}: holds {arr.dtype}{arr.shape}; the manifest says "
            f"{np.dtype(m['dtype'])}({m['shard_size']},)"
        )
    return arr


def save_optimizer(directory: str, optimizer: Any, meta: dict | None = None) -> None:
    """Write a sharded :mod:`hpcdist.optimizers` optimizer (ZeRO-1/2 under a strategy).

    Every worker writes its slices of the variables and slots, one
    checkpoint per dtype in ``directory/<dtype>/``; ``iterations`` is a
    scalar. Collective over the strategy's workers.

    Example: ``hd.checkpoint.sharded.save_optimizer("ckpt/5", model.optimizer)``.
    """
    step = np.int64(optimizer.current_step())
    for group, state in zero.states(optimizer):
        flat = group.params[0].flat
        vectors = {"param": np.asarray(state.shard_of(flat))}
        vectors.update({f"slot.{k}": np.asarray(v) for k, v in state.slots.items()})
        save(os.path.join(directory, np.dtype(group.dtype).name), state.layout, state.rank,
             [str(v.name) for v in group.variables], [list(v.shape) for v in group.variables],
             vectors, {"iterations": step}, state.engine.barrier, meta)


def load_optimizer(directory: str, optimizer: Any) -> None:
    """Load :func:`save_optimizer`'s checkpoint, written at any number of workers.

    The optimizer must be built (``optimizer.build(variables)``) under a
    sharded strategy; the variables and slots get the saved values, bit for bit.
    """
    step = None
    for group, state in zero.states(optimizer):
        where = os.path.join(directory, np.dtype(group.dtype).name)
        vectors, scalars, _ = load(
            where, state.layout, state.rank, [str(v.name) for v in group.variables],
            [list(v.shape) for v in group.variables], group.dtype,
        )
        params = group.params[0]
        params.ensure()
        params.make_private()
        flat = params.flat
        param = vectors.pop("param")
        for lo, hi, at in state.ranges:
            flat[lo:hi] = param[at : at + hi - lo]
        state.gather_into(flat)
        for name in state.slots:
            if f"slot.{name}" not in vectors:
                raise CheckpointError(
                    f"{where}: no slot {name!r} saved (it has {sorted(vectors)}); restore "
                    "into an optimizer with the same settings"
                )
            state.slots[name][:] = vectors[f"slot.{name}"]
        step = int(scalars["iterations"])
    if step is not None:
        optimizer.iterations.assign(np.int64(step))


def consolidated_slots(optimizer: Any) -> dict[str, list[np.ndarray]]:
    """Every variable's full slot values of a sharded optimizer (collective: all-gathers).

    Returns ``{slot name: [one array per variable, in creation order]}``, the
    values the unsharded optimizer's slot variables would hold.
    """
    out: dict[str, list[np.ndarray]] = {}
    per_var: dict[int, dict[str, np.ndarray]] = {}
    for group, state in zero.states(optimizer):
        for name, vec in state.slots.items():
            full = np.zeros(group.offsets[-1], dtype=group.dtype)
            for lo, hi, at in state.ranges:
                full[lo:hi] = np.asarray(vec[at : at + hi - lo])
            state.gather_into(full)
            for j, v in enumerate(group.variables):
                a, z = group.offsets[j], group.offsets[j + 1]
                per_var.setdefault(id(v), {})[name] = full[a:z].reshape(v.shape)
    for v in optimizer.ordered_variables:
        for name, value in per_var.get(id(v), {}).items():
            out.setdefault(name, []).append(value)
    return out

