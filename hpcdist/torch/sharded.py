"""ZeRO-1 and ZeRO-2 for :func:`~hpcdist.torch.DistributedOptimizer` (``shard=``).

The parameters are seen as one flat space in bucket order, cut into one
slice per rank (:class:`hpcdist.distribute.sharding.FlatShardLayout`). Each
rank keeps a *shard*: a flat tensor of its slice of the parameters, a flat
tensor of its slice of the averaged gradients, and a *local optimizer* of
the wrapped optimizer's class stepping over views of the shard (one view per
run of one param group), so its state (Adam's moments) covers 1/N of the
parameters.

* ``shard="optimizer"`` (ZeRO-1): gradients are all-reduced in buckets while
  backward runs, as without sharding; ``step()`` copies this rank's slice of
  them into the shard.
* ``shard="gradients"`` (ZeRO-2): each bucket is packed and reduce-scattered
  while backward runs; the rank keeps its block of the averaged bucket and
  frees the bucket's ``.grad`` tensors (they are ``None`` after backward).

After the local step the updated shards are all-gathered into every rank's
parameters, per bucket on the communication thread: ``step()`` returns at
once and the model's next forward (a forward pre-hook), ``model.state_dict()``,
the next ``step()`` or :meth:`wait_parameters` wait for it. Without ``model=``
or ``overlap``, ``step()`` gathers every shard in one call on its own thread
and copies each rank's segments straight into the parameters.

``state_dict()`` holds this rank's shard state (the local optimizer's
``state_dict``, plus an ``"hpcdist_shard"`` entry naming the layout) and
loads back only at the same world size and layout;
:meth:`consolidated_state_dict` (collective) gives the unsharded state dict
the wrapped optimizer would have; :func:`save_sharded` and
:func:`load_sharded` write checkpoints (every rank its slice) and load them at
any world size (:mod:`hpcdist.checkpoint.sharded`).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, cast

import numpy as np
import torch

from hpcdist.arrays import import_array
from hpcdist.checkpoint import sharded as fmt
from hpcdist.collectives import CommunicationOptions, ReduceOp
from hpcdist.distribute.sharding import FlatShardLayout, Segment
from hpcdist.errors import ShardingError
from hpcdist.torch.optimizer import Bucket, DistributedMixin, Reducer, register_sharded


def _numpy(t: torch.Tensor) -> Any:
    return import_array(t.detach())


class ShardedReducer(Reducer):
    """The buckets, the flat shard and the local optimizer of one sharded DistributedOptimizer."""

    def __init__(
        self, optimizer: torch.optim.Optimizer, model: torch.nn.Module | None, strategy: Any,
        bucket_bytes: int, passes: int, overlap: bool, timeout_seconds: float | None,
        compression: CommunicationOptions | None = None, *, stage: str,
    ) -> None:
        super().__init__(
            optimizer, model, strategy, bucket_bytes, passes, overlap, timeout_seconds,
            compression,
        )
        self.stage = stage
        self.outer = optimizer
        self.params: list[torch.nn.Parameter] = [p for b in self._buckets for p in b.params]
        kinds = {(p.dtype, p.device) for p in self.params}
        if len(kinds) > 1:
            raise ShardingError(
                f"shard={stage!r} needs every parameter of one dtype and device; found "
                f"{sorted(str(k) for k in kinds)}. Cast the model (model.float()) or use shard=None"
            )
        if not self.params:
            raise ShardingError(f"shard={stage!r}: the optimizer has no parameter requiring grad")
        dtype, device = self.params[0].dtype, self.params[0].device
        index = {id(p): i for i, p in enumerate(self.params)}
        self.layout = FlatShardLayout(
            [p.numel() for p in self.params],
            [[index[id(p)] for p in b.params] for b in self._buckets],
            self._engine.size,
        )
        self.rank = self._engine.rank
        self._everyone = [self.layout.segments(r) for r in range(self.layout.world_size)]
        self.mine: list[Segment] = self._everyone[self.rank]
        size = self.layout.shard_size
        self.flat = torch.zeros(size, dtype=dtype, device=device)
        self.flat_grad = torch.zeros(size, dtype=dtype, device=device)
        group_of = {id(p): g for g, grp in enumerate(optimizer.param_groups) for p in grp["params"]}
        runs: list[list[int]] = []  # [group, lo, hi]: views of one param group
        for seg in self.mine:
            g = group_of[id(self.params[seg.param])]
            if runs and runs[-1][0] == g and runs[-1][2] == seg.at:
                runs[-1][2] = seg.at + seg.length
            else:
                runs.append([g, seg.at, seg.at + seg.length])
        if not runs:  # more ranks than elements: an empty view keeps the optimizer valid
            runs.append([0, 0, 0])
        self.pieces: list[tuple[int, int, int, torch.nn.Parameter]] = []
        for g, lo, hi in runs:
            piece = torch.nn.Parameter(self.flat[lo:hi])  # shares the shard's memory
            piece.grad = self.flat_grad[lo:hi]
            self.pieces.append((g, lo, hi, piece))
        groups = []
        for g, grp in enumerate(optimizer.param_groups):
            hyper = {k: v for k, v in grp.items() if k != "params"}
            groups.append({**hyper, "params": [p for gg, _, _, p in self.pieces if gg == g]})
        try:
            self.local = type(optimizer)(groups, **optimizer.defaults)
        except (TypeError, ValueError) as err:
            raise ShardingError(
                f"shard={stage!r} makes a {type(optimizer).__name__} over this rank's slice "
                f"with {type(optimizer).__name__}(param_groups, **defaults), which failed: {err}. "
                "Use a torch.optim optimizer whose defaults are its keyword arguments"
            ) from err
        self._ready = [threading.Event() for _ in self._buckets]  # bucket b's params gathered
        for event in self._ready:
            event.set()
        self._gather_error: BaseException | None = None
        self._scatter_buf: torch.Tensor | None = None  # ZeRO-2: a bucket packed for the engine
        if model is not None:  # each module waits for the buckets of its own parameters
            bucket_of = {id(p): b for b, members in enumerate(self.layout.buckets)
                         for p in (self.params[i] for i in members)}
            for module in model.modules():
                mine = sorted({bucket_of[id(p)] for p in module.parameters(recurse=False)
                               if id(p) in bucket_of})
                if mine:
                    module.register_forward_pre_hook(
                        lambda *_, bs=tuple(mine): self._wait_buckets(bs)
                    )
            model.register_state_dict_pre_hook(lambda *_, **__: self.wait_parameters())

    # -- backward: ZeRO-2 reduce-scatters the buckets --------------------------------------------
    def _launch(self, bucket: Bucket) -> None:
        if self.stage != "gradients":
            super()._launch(bucket)
            return
        for p in bucket.params:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        job = _Job(self._scatter, bucket)
        if self._queue is not None:
            cast("Any", self._queue).put(job)  # a job, not a bucket: _serve runs it
        else:
            job()

    def _scatter(self, bucket: Bucket) -> None:
        """Average ``bucket`` over the ranks, keep this rank's block, free the bucket's grads."""
        try:
            b = self._buckets.index(bucket)
            lo, hi = self.layout.bucket_of_shard(b)
            total = self.layout.bucket_sizes[b]
            need = (hi - lo) * self.layout.world_size
            if self._scatter_buf is None or self._scatter_buf.numel() < need:
                # one buffer for every bucket (the jobs run one at a time): no fresh
                # pages to fault in each step, and at most one bucket of extra memory
                longest = max(self.layout.bucket_of_shard(k)[1] - self.layout.bucket_of_shard(k)[0]
                              for k in range(len(self._buckets)))
                self._scatter_buf = torch.empty(longest * self.layout.world_size,
                                                dtype=self.flat.dtype, device=self.flat.device)
            buf = self._scatter_buf[:need]
            torch.cat([p.grad.reshape(-1) for p in bucket.params], out=buf[:total])
            buf[total:].zero_()
            part = self._engine.reduce_scatter(_numpy(buf), ReduceOp.MEAN, self._options)
            self.flat_grad[lo:hi].copy_(torch.as_tensor(part))
            for p in bucket.params:
                p.grad = None
        except BaseException as err:  # handed to the thread that waits (synchronize)
            bucket.error = err
        finally:
            bucket.done.set()

    # -- the step ------------------------------------------------------------------------------
    @torch.no_grad()
    def step(self) -> None:
        """Synchronize the gradients, step the local optimizer, start the parameters' all-gather."""
        self.synchronize()
        self.wait_parameters()
        for seg in self.mine:
            p = self.params[seg.param]
            self.flat[seg.at : seg.at + seg.length].copy_(
                p.reshape(-1)[seg.start : seg.start + seg.length]
            )
            if self.stage == "optimizer":
                dst = self.flat_grad[seg.at : seg.at + seg.length]
                if p.grad is None:
                    dst.zero_()
                else:
                    dst.copy_(p.grad.reshape(-1)[seg.start : seg.start + seg.length])
        for g, grp in enumerate(self.outer.param_groups):  # lr schedulers change the outer groups
            for local in self.local.param_groups:
                if local["params"] and any(gg == g and p is local["params"][0]
                                           for gg, _, _, p in self.pieces):
                    local.update({k: v for k, v in grp.items() if k != "params"})
        self.local.step()
        if self._queue is None or self._hooked_model is None:
            self._gather()  # on this thread (the communication thread is idle now)
            self.wait_parameters()
            return
        for event in self._ready:
            event.clear()
        # the last bucket holds the first layers: gathered first, for the next forward
        for b in reversed(range(len(self._buckets))):
            cast("Any", self._queue).put(_Job(self._gather_bucket, b))  # _serve runs jobs

    _hooked_model: torch.nn.Module | None = None

    def _gather_bucket(self, b: int) -> None:
        """All-gather bucket ``b``'s slices into its parameters (on the comm thread)."""
        try:
            lo, hi = self.layout.bucket_of_shard(b)
            part = _numpy(self.flat[lo:hi])
            flat = torch.as_tensor(self._engine.allgather(part, 0, self._options))
            pos = 0
            with torch.no_grad():
                for i in self.layout.buckets[b]:
                    p = self.params[i]
                    n = p.numel()
                    p.view(-1).copy_(flat[pos : pos + n])
                    pos += n
        except BaseException as err:
            self._gather_error = err
        finally:
            self._ready[b].set()

    def _gather(self) -> None:
        """All-gather every rank's whole shard on this thread, in one call, and copy each
        rank's segments straight into the parameters (every rank calls it)."""
        for event in self._ready:
            event.clear()
        try:
            shard = self.layout.shard_size
            rows = torch.as_tensor(self._engine.allgather(_numpy(self.flat), 0, self._options))
            with torch.no_grad():
                for r, segments in enumerate(self._everyone):
                    row = rows[r * shard : (r + 1) * shard]
                    for seg in segments:
                        p = self.params[seg.param].view(-1)
                        p[seg.start : seg.start + seg.length].copy_(
                            row[seg.at : seg.at + seg.length]
                        )
        except BaseException as err:
            self._gather_error = err
        finally:
            for event in self._ready:
                event.set()

    def _wait_buckets(self, buckets: tuple[int, ...]) -> None:
        for b in buckets:
            self._ready[b].wait()
        if self._gather_error is not None:
            self.wait_parameters()

    def wait_parameters(self) -> None:
        """Wait for the parameters' all-gather started by the last step (raise its error)."""
        for event in self._ready:
            event.wait()
        err, self._gather_error = self._gather_error, None
        if err is not None:
            raise err

    # -- state ----------------------------------------------------------------------------------
    def describe(self) -> dict:
        return {"stage": self.stage, "world_size": self.layout.world_size, "rank": self.rank,
                "sizes": self.layout.sizes, "buckets": self.layout.buckets}

    def shard_state(self) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
        """``(elementwise state as shard-long vectors, scalar state)`` of the local optimizer."""
        vectors: dict[str, torch.Tensor] = {}
        scalars: dict[str, Any] = {}
        for _, lo, hi, piece in self.pieces:
            for key, value in self.local.state.get(piece, {}).items():
                if torch.is_tensor(value) and value.dim() == 1 and value.numel() == hi - lo:
                    if key not in vectors:
                        vectors[key] = torch.zeros_like(self.flat, dtype=value.dtype)
                    vectors[key][lo:hi].copy_(value)
                else:
                    scalars.setdefault(key, value)
        return vectors, scalars

    def set_shard_state(self, vectors: dict[str, torch.Tensor], scalars: dict[str, Any]) -> None:
        """Make the local optimizer's state from shard-long vectors and scalars."""
        for _, lo, hi, piece in self.pieces:
            state: dict[str, Any] = {}
            for key, value in scalars.items():
                state[key] = value.clone() if torch.is_tensor(value) else value
            for key, vec in vectors.items():
                state[key] = vec[lo:hi].clone()
            self.local.state[piece] = state

    def gather_full(self, vec: torch.Tensor) -> list[torch.Tensor]:
        """Every parameter's values of shard-long ``vec`` (collective: all-gather)."""
        full = torch.as_tensor(self._engine.allgather(_numpy(vec.contiguous()), 0))
        rows = full.view(self.layout.world_size, self.layout.shard_size)
        out = []
        for b, members in enumerate(self.layout.buckets):
            lo, hi = self.layout.bucket_of_shard(b)
            flat = rows[:, lo:hi].reshape(-1)
            pos = 0
            for i in members:
                n = self.layout.sizes[i]
                out.append((i, flat[pos : pos + n].clone().view_as(self.params[i])))
                pos += n
        out.sort(key=lambda t: t[0])
        return [t for _, t in out]


class _Job:
    """A callable the communication thread runs instead of an all-reduce."""

    __slots__ = ("fn", "args")

    def __init__(self, fn: Callable[..., None], *args: Any) -> None:
        self.fn = fn
        self.args = args

    def __call__(self) -> None:
        self.fn(*self.args)


class _Sharded(DistributedMixin):
    """The methods a sharded distributed optimizer puts before its class's."""

    _hd: ShardedReducer

    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        """Wait for this rank's averaged gradients, step its slice, all-gather the parameters."""
        if closure is not None:
            raise ValueError(
                "DistributedOptimizer.step takes no closure: run forward and backward before step()"
            )
        self.__dict__["_hd"].step()
        return None

    @property
    def local_optimizer(self) -> torch.optim.Optimizer:
        """The optimizer that steps this rank's slice (its state is this rank's share)."""
        return self.__dict__["_hd"].local

    @property
    def shard_layout(self) -> FlatShardLayout:
        """The flat layout: buckets, slice sizes and every rank's segments."""
        return self.__dict__["_hd"].layout

    def shard_gradients(self) -> torch.Tensor:
        """This rank's slice of the averaged gradients (after backward and synchronize)."""
        return self.__dict__["_hd"].flat_grad

    def wait_parameters(self) -> None:
        """Wait until the last step's all-gather has written every parameter."""
        self.__dict__["_hd"].wait_parameters()

    def state_dict(self) -> dict[str, Any]:
        """This rank's shard state: the local optimizer's ``state_dict`` and the layout."""
        hd = self.__dict__["_hd"]
        hd.wait_parameters()
        out = hd.local.state_dict()
        out["hpcdist_shard"] = hd.describe()
        return out

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Load a ``state_dict()`` of this rank taken at the same world size and layout."""
        hd = self.__dict__["_hd"]
        saved = state_dict.get("hpcdist_shard")
        if saved != hd.describe():
            raise ShardingError(
                "this state dict is not this rank's shard of this layout: expected "
                f"{_brief(hd.describe())}, found {_brief(saved)}. Load an unsharded state dict "
                "into the unwrapped optimizer before wrapping, or use "
                "hpcdist.torch.load_sharded for a checkpoint of another world size"
            )
        rest = {k: v for k, v in state_dict.items() if k != "hpcdist_shard"}
        hd.local.load_state_dict(rest)
        for g, grp in enumerate(hd.outer.param_groups):
            for local in hd.local.param_groups:
                if local["params"] and any(gg == g and p is local["params"][0]
                                           for gg, _, _, p in hd.pieces):
                    grp.update({k: v for k, v in local.items() if k != "params"})

    def consolidated_state_dict(self) -> dict[str, Any]:
        """The unsharded state dict the wrapped optimizer would have (collective: every rank).

        Its ``state`` holds each parameter's full tensors (e.g. Adam's
        ``exp_avg``), indexed as ``torch.optim`` indexes them (by position
        over the param groups); every rank gets it.
        """
        hd = self.__dict__["_hd"]
        hd.wait_parameters()
        vectors, scalars = hd.shard_state()
        keys = _agreed_keys(hd, sorted(vectors))
        full = {}
        for key in keys:
            vec = vectors.get(key, torch.zeros_like(hd.flat))
            full[key] = hd.gather_full(vec)
        position: dict[int, int] = {}
        for grp in hd.outer.param_groups:
            for p in grp["params"]:
                position.setdefault(id(p), len(position))
        state: dict[int, dict[str, Any]] = {}
        if keys:
            for i, p in enumerate(hd.params):
                entry = {k: (v.clone() if torch.is_tensor(v) else v) for k, v in scalars.items()}
                entry.update({k: full[k][i] for k in keys})
                state[position[id(p)]] = entry
        groups = []
        for grp in hd.outer.param_groups:
            groups.append({**{k: v for k, v in grp.items() if k != "params"},
                           "params": [position[id(p)] for p in grp["params"]]})
        return {"state": state, "param_groups": groups}


def _agreed_keys(hd: ShardedReducer, keys: list[str]) -> list[str]:
    """The state keys of every rank (a rank that owns nothing has none)."""
    counts = hd._engine.allreduce([np.array([len(keys)], dtype=np.int64)], ReduceOp.MAX)[0]
    if int(counts[0]) != len(keys):
        raise ShardingError(
            f"the ranks' optimizer state has {int(counts[0])} per-element tensors somewhere but "
            f"{len(keys)} here; step every rank the same number of times before consolidating"
        )
    return keys


def _brief(d: Any) -> str:
    if not isinstance(d, dict):
        return repr(d)
    return (f"stage={d.get('stage')!r}, world_size={d.get('world_size')}, rank={d.get('rank')}, "
            f"{len(d.get('sizes', []))} parameters")


@register_sharded
def wrap(optimizer: torch.optim.Optimizer,
         reducer_args: tuple[Any, Any, int, int, bool, float | None, Any], stage: str,
         model: torch.nn.Module | None) -> torch.optim.Optimizer:
    """``optimizer`` seen as a sharded distributed optimizer of its class."""
    cls = type(f"Distributed{type(optimizer).__name__}", (_Sharded, type(optimizer)), {})
    wrapped: _Sharded = object.__new__(cls)
    wrapped.__dict__ = optimizer.__dict__
    reducer = ShardedReducer(optimizer, *reducer_args, stage=stage)
    reducer._hooked_model = model
    wrapped._hd = reducer
    return wrapped


def _reducer_of(optimizer: Any) -> ShardedReducer:
    hd = getattr(optimizer, "__dict__", {}).get("_hd")
    if not isinstance(hd, ShardedReducer):
        raise ShardingError(
            "sharded checkpoints hold a sharded optimizer's state; this optimizer is "
            f"{type(optimizer).__name__}. Wrap it with DistributedOptimizer(..., shard='optimizer')"
        )
    return hd


def _names(hd: ShardedReducer) -> tuple[list[str], list[list[int]]]:
    """Every parameter's name (the model's, else its position in the optimizer) in flat order."""
    named = {}
    if hd._hooked_model is not None:
        named = {id(p): n for n, p in hd._hooked_model.named_parameters()}
    position: dict[int, int] = {}
    for grp in hd.outer.param_groups:
        for p in grp["params"]:
            position.setdefault(id(p), len(position))
    names = [named.get(id(p), f"param.{position[id(p)]}") for p in hd.params]
    return names, [list(p.shape) for p in hd.params]


def save_sharded(
    directory: str, optimizer: torch.optim.Optimizer, meta: dict | None = None
) -> None:
    """Write a sharded checkpoint: every rank its slice of the parameters and optimizer state.

    Collective over the optimizer's ranks; no rank gathers the others'
    values. The format is :mod:`hpcdist.checkpoint.sharded`'s.

    Example: ``hdt.save_sharded("ckpt/step-100", opt)`` on every rank.
    """
    hd = _reducer_of(optimizer)
    hd.wait_parameters()
    with torch.no_grad():
        for seg in hd.mine:
            hd.flat[seg.at : seg.at + seg.length].copy_(
                hd.params[seg.param].reshape(-1)[seg.start : seg.start + seg.length]
            )
    vectors, scalars = hd.shard_state()
    arrays = {"param": hd.flat.detach().cpu().numpy()}
    arrays.update({k: v.detach().cpu().numpy() for k, v in vectors.items()})
    plain = {k: (v.detach().cpu().numpy() if torch.is_tensor(v) else v) for k, v in scalars.items()}
    names, shapes = _names(hd)
    fmt.save(directory, hd.layout, hd.rank, names, shapes, arrays, plain,
             hd._engine.barrier, meta)


def load_sharded(directory: str, optimizer: torch.optim.Optimizer) -> dict:
    """Load a sharded checkpoint written at any world size into the parameters and the state.

    Collective. Each rank reads the parts of the saved slices that fall
    into its own slice, then the parameters are all-gathered; the values are
    bitwise those saved. Returns the checkpoint's manifest.

    Example: ``hdt.load_sharded("ckpt/step-100", opt)`` on every rank (any number of ranks).
    """
    hd = _reducer_of(optimizer)
    hd.wait_parameters()
    names, shapes = _names(hd)
    dtype = torch.empty(0, dtype=hd.flat.dtype).numpy().dtype
    vectors, scalars, manifest = fmt.load(directory, hd.layout, hd.rank, names, shapes, dtype)
    with torch.no_grad():
        hd.flat.copy_(torch.from_numpy(vectors.pop("param")))
    hd._gather()  # on this thread: every rank is here
    hd.wait_parameters()
    tensors = {k: torch.from_numpy(v).to(hd.flat.device) for k, v in vectors.items()}
    hd.set_shard_state(tensors, {k: torch.as_tensor(v) for k, v in scalars.items()})
    return manifest
