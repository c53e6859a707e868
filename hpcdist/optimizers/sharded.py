"""ZeRO-1 and ZeRO-2 for :mod:`hpcdist.optimizers` (a strategy's ``experimental_sharding``).

The variables of one dtype already live in one flat buffer (the optimizer's
``_Group``); it is cut in buckets of ``bytes_per_pack`` bytes and laid out
by :class:`hpcdist.distribute.sharding.FlatShardLayout`. Each worker keeps
its optimizer slots (Adam's ``m`` and ``v``) only for its slice of every
bucket, as flat arrays of the shard's size (no slot variables exist, so
``get_slot`` has none); ``iterations`` stays a mirrored variable.

* ``"optimizer"`` (ZeRO-1): the gradients are all-reduced as without
  sharding (the same single batched call, so the result is the same bit for
  bit); each worker updates its slice.
* ``"gradients"`` (ZeRO-2): each bucket of gradients is reduce-scattered
  (summed); the worker holds only its slice of the reduced gradients (no
  full-size reduced or packed gradient buffer is kept).

Then every worker's updated slice is all-gathered into the flat parameter
buffer (one ``allgather`` per dtype), so every replica's variables hold the
same values. Clipping works on slices: ``clipvalue`` per element,
``clipnorm`` and ``global_clipnorm`` with the squared sums of the slices
summed over the workers.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from hpcdist.arrays import array_module, asarray
from hpcdist.collectives.choice import DEFAULT_BUCKET_BYTES
from hpcdist.collectives.engine import Collectives
from hpcdist.collectives.ops import ReduceOp
from hpcdist.distribute.sharding import FlatShardLayout
from hpcdist.errors import ShardingError
from hpcdist.optimizers.clipping import global_scale, kernels_for
from hpcdist.optimizers.flat import empty_like, on_device_of
from hpcdist.runtime import mpi


def sharding_of(strategy: Any) -> str | None:
    """The sharding stage a strategy asks its optimizers for (``None``: none)."""
    if strategy is None:
        return None
    return getattr(strategy.extended, "experimental_sharding", None)


def _engine(strategy: Any) -> Collectives:
    engine = strategy.extended.collectives
    return engine if engine is not None else Collectives(mpi().COMM_SELF)


class ShardState:
    """One dtype group's layout, this worker's slot slices and its slice of the gradients."""

    def __init__(
        self, group: Any, engine: Collectives, stage: str | None, slot_initial: dict
    ) -> None:
        self.stage = stage
        self.engine = engine
        offsets = group.offsets
        sizes = [offsets[j + 1] - offsets[j] for j in range(len(offsets) - 1)]
        item = np.dtype(group.dtype).itemsize
        bucket_bytes = engine.options.bytes_per_pack or DEFAULT_BUCKET_BYTES
        buckets: list[list[int]] = [[]]
        size = 0
        for j, n in enumerate(sizes):
            buckets[-1].append(j)
            size += n * item
            if size >= bucket_bytes and j + 1 < len(sizes):
                buckets.append([])
                size = 0
        self.layout = FlatShardLayout(sizes, buckets, engine.size)
        self.rank = engine.rank
        self.starts = [offsets[b[0]] for b in buckets]  # each bucket's start in the flat buffer
        lay = self.layout
        self.ranges: list[tuple[int, int, int]] = []  # (flat lo, flat hi, shard lo): my slices
        for b, start in enumerate(self.starts):
            s = lay.slice_sizes[b]
            lo = min(start + self.rank * s, start + lay.bucket_sizes[b])
            hi = min(start + (self.rank + 1) * s, start + lay.bucket_sizes[b])
            self.ranges.append((lo, hi, lay.slice_offsets[b]))
        proto = group.params[0].flat
        xp = array_module(proto)
        with on_device_of(proto):
            self.slots = {
                name: xp.full(lay.shard_size, value, dtype=group.dtype)
                for name, value in slot_initial.items()
            }
            self.grad = xp.zeros(lay.shard_size, dtype=group.dtype)

    def shard_of(self, flat: Any) -> Any:
        """This worker's slices of a flat buffer, as a shard-long vector (padding zero)."""
        out = empty_like(flat, self.layout.shard_size)
        out[:] = 0
        for lo, hi, at in self.ranges:
            out[at : at + hi - lo] = flat[lo:hi]
        return out

    def gather_into(self, flat: Any) -> None:
        """All-gather every worker's slices of ``flat`` (a flat buffer) into ``flat``."""
        lay = self.layout
        if lay.world_size == 1:
            return
        rows = asarray(self.engine.allgather(self.shard_of(flat))).reshape(
            lay.world_size, lay.shard_size
        )
        for b, start in enumerate(self.starts):
            lo, hi = lay.bucket_of_shard(b)
            n = lay.bucket_sizes[b]
            flat[start : start + n] = rows[:, lo:hi].reshape(-1)[:n]

    def scatter_gradients(self, buckets: list[Any]) -> None:
        """ZeRO-2: sum each (padded) bucket over the workers, keep this worker's block."""
        for b, buf in enumerate(buckets):
            lo, hi = self.layout.bucket_of_shard(b)
            if self.layout.world_size == 1:
                self.grad[lo:hi] = buf
            else:
                self.grad[lo:hi] = asarray(self.engine.reduce_scatter(buf, ReduceOp.SUM))


def state_of(opt: Any, group: Any, engine: Collectives, stage: str | None) -> ShardState:
    """The shard state of ``group`` (made, with fresh slots, when missing or outgrown)."""
    state = opt._shards.get(group.dtype)
    sizes = [group.offsets[j + 1] - group.offsets[j] for j in range(len(group.offsets) - 1)]
    if state is None or state.layout.sizes != sizes:
        initial = {name: opt._slot_initial_value(name) for name in group.slot_names}
        state = opt._shards[group.dtype] = ShardState(group, engine, stage, initial)
    return state


def states(opt: Any) -> list[tuple[Any, ShardState]]:
    """Every dtype group of a built sharded optimizer with its shard state (made if missing)."""
    if opt._sharding is None or not opt._order:
        raise ShardingError(
            f"optimizer {opt.name!r} is not sharded or not built: create it in the scope of "
            "MultiWorkerMirroredStrategy(experimental_sharding=...) and call "
            "optimizer.build(model.trainable_variables) (or take a step) first"
        )
    strategy = opt._order[0].distribute_strategy
    engine = _engine(strategy)
    return [(g, state_of(opt, g, engine, opt._sharding)) for _, g in sorted(
        opt._groups.items(), key=lambda kv: str(kv[0]))]


def _padded_buckets(state: ShardState, group: Any, idx: list, grads: list) -> list[Any]:
    """The gradients of ``group`` bucket by bucket, each padded to a multiple of the workers."""
    lay = state.layout
    proto = group.params[0].flat
    out = []
    for b, members in enumerate(lay.buckets):
        buf = empty_like(proto, lay.slice_sizes[b] * lay.world_size)
        pos = 0
        for j in members:
            n = lay.sizes[j]
            i = idx[j]
            if i is None:
                buf[pos : pos + n] = 0
            else:
                buf[pos : pos + n] = asarray(grads[i]).reshape(-1)
            pos += n
        buf[pos:] = 0
        out.append(buf)
    return out


def apply(
    opt: Any, strategy: Any, work: list, replica_grads: list[list[Any]], lr: float, step: int,
    alias_ok: bool,
) -> None:
    """Reduce (ZeRO-1) or reduce-scatter (ZeRO-2), clip, update this worker's slices, gather."""
    stage = sharding_of(strategy)
    if len(replica_grads) != 1:
        raise ShardingError(
            f"experimental_sharding={stage!r} shards over workers with one replica each; this "
            f"worker has {len(replica_grads)} replicas. Start one rank per device"
        )
    engine = _engine(strategy)
    states = [state_of(opt, group, engine, stage) for group, _, _ in work]
    if stage == "optimizer":
        packed = [opt._pack(group, 0, idx, replica_grads[0], alias_ok) for group, idx, _ in work]
        reduced = strategy.extended.reduce_leaves(ReduceOp.SUM, packed)
        opt._clip(work, reduced)
        for state, g in zip(states, reduced, strict=True):
            state.grad[:] = state.shard_of(asarray(g))
    else:
        for state, (group, idx, _) in zip(states, work, strict=True):
            state.scatter_gradients(_padded_buckets(state, group, idx, replica_grads[0]))
        _clip_shards(opt, engine, work, states)
    for state, (group, _, runs) in zip(states, work, strict=True):
        _update(opt, state, group, runs, opt.hyper_parameters(lr, step, group.dtype))


def _clip_shards(opt: Any, engine: Collectives, work: list, states: list[ShardState]) -> None:
    """Clip slices of the reduced gradients as the unsharded optimizer clips the whole."""
    if opt.clipvalue is not None:
        for state in states:
            kernels_for(state.grad).clip_values(state.grad, opt.clipvalue)
        return
    if opt.clipnorm is None and opt.global_clipnorm is None:
        return
    parts = []  # squared sums per (group, variable) of this worker's slices
    for state, (_, idx, _) in zip(states, work, strict=True):
        k = kernels_for(state.grad)
        sums = np.zeros(len(idx), np.float64)
        for seg in state.layout.segments(state.rank):
            sums[seg.param] += k.sum_squares(state.grad[seg.at : seg.at + seg.length])
        parts.append(sums)
    totals = engine.allreduce([np.concatenate(parts)], ReduceOp.SUM)[0] if parts else []
    if opt.global_clipnorm is not None:
        mask = np.concatenate([[i is not None for i in idx] for _, idx, _ in work])
        factor = global_scale(math.sqrt(float(np.sum(totals[mask]))), opt.global_clipnorm)
        if factor != 1.0:
            for state in states:
                kernels_for(state.grad).scale(state.grad, factor)
        return
    pos = 0
    for state, (_, idx, _) in zip(states, work, strict=True):
        k = kernels_for(state.grad)
        for seg in state.layout.segments(state.rank):
            norm = math.sqrt(float(totals[pos + seg.param]))
            if idx[seg.param] is not None and norm > opt.clipnorm:
                k.scale(state.grad[seg.at : seg.at + seg.length], opt.clipnorm / norm)
        pos += len(idx)


def _update(opt: Any, state: ShardState, group: Any, runs: list, hyper: Any) -> None:
    """The fused update on this worker's slices (where variables have gradients), then gather."""
    params = group.params[0]
    params.ensure()
    params.make_private()  # a snapshot someone holds keeps its values
    p = params.flat
    k = kernels_for(p)
    offsets = group.offsets
    with on_device_of(p):
        for lo, hi, at in state.ranges:
            for a, b in runs:
                x, z = max(lo, offsets[a]), min(hi, offsets[b])
                if x >= z:
                    continue
                s = at + x - lo
                slots = {name: buf[s : s + z - x] for name, buf in state.slots.items()}
                seg = p[x:z]
                opt._update(k, seg, seg, state.grad[s : s + z - x], slots, hyper)
        state.gather_into(p)
