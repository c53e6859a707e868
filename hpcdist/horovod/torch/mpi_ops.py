"""Horovod's tensor collectives for PyTorch, on hpcdist's engine.

Each collective has Horovod's signature and result: the plain form returns
a new tensor (and is differentiable, with Horovod's gradient), ``*_`` works
in place, ``*_async`` / ``*_async_`` return a handle for :func:`synchronize`
and :func:`poll`. They run on the process set's runner
(:mod:`hpcdist.horovod.common.runner`): in call order on every rank,
arguments compared across ranks first, so arguments that disagree or are
invalid on some ranks only raise :class:`~hpcdist.errors.HorovodMismatchError`
on every rank of the set.

Dtypes: uint8, int8, int16, int32, int64, float16, bfloat16, float32,
float64 and bool (bool: allreduce with Min/Max only; bfloat16 goes to the
engine as it is, which reduces it in float32 and rounds once). ``Average`` of
integers divides with floor, as Horovod does. Tensors on a GPU travel through host memory.

Example:
    >>> import torch, hpcdist.horovod.torch as hvd
    >>> hvd.init()
    >>> total = hvd.allreduce(torch.tensor([2.0, 4.0]), op=hvd.Sum)
    >>> total.tolist() == [2.0 * hvd.size(), 4.0 * hvd.size()]
    True
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch

from hpcdist.horovod.common import basics
from hpcdist.horovod.common.ops import (
    ENGINE_OP,
    OP_NAMES,
    Adasum,
    Average,
    Max,
    Min,
    Sum,
)
from hpcdist.horovod.common.process_sets import ProcessSet, global_process_set
from hpcdist.horovod.common.runner import Call, Pending
from hpcdist.horovod.torch.compression import Compression, Compressor
from hpcdist.horovod.torch.tensors import from_host as _tensor
from hpcdist.horovod.torch.tensors import to_host as _host

_OP_NAMES, _ENGINE_OP = OP_NAMES, ENGINE_OP
_DTYPES = (torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64, torch.float16,
           torch.bfloat16, torch.float32, torch.float64, torch.bool)
_DTYPE_TEXT = "uint8, int8, int16, int32, int64, float16, bfloat16, float32, float64, bool"

_handles: dict[int, tuple[Pending, Callable[[list[np.ndarray]], Any]]] = {}
_handle_ids = itertools.count(1)
_handle_lock = threading.Lock()

Finish = Callable[[list[np.ndarray]], Any]


# -- helpers -------------------------------------------------------------------------


def _pick_op(average: bool | None, op: int | None) -> int:
    if average is not None and op is not None:
        raise ValueError("pass op= or the deprecated average=, not both")
    if op is None:
        return Sum if average is False else Average
    if op not in _OP_NAMES:
        raise ValueError(f"op is {op!r}; expected one of hvd.Average, Sum, Adasum, Min, Max, "
                         "Product")
    return int(op)


def _check(tensors: Sequence[Any], what: str) -> list[torch.Tensor]:
    for t in tensors:
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{what} takes torch tensors; got {type(t).__name__}")
        if t.dtype not in _DTYPES:
            raise TypeError(f"{what} got a {t.dtype} tensor; supported dtypes: {_DTYPE_TEXT}")
        if t.is_sparse:
            raise TypeError(f"{what} got a sparse tensor; pass tensor.to_dense()")
    return list(tensors)


def _like(out: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """``out`` with ``like``'s dtype, shape and device."""
    if out.dtype != like.dtype:
        out = out.to(like.dtype)
    out = out.reshape(like.shape) if out.numel() == like.numel() else out
    return out if like.device.type == "cpu" else out.to(like.device)


def _back(a: np.ndarray, like: torch.Tensor, reduced: bool = False) -> torch.Tensor:
    """``a`` as a tensor of ``like``'s dtype and device (any shape)."""
    out = _tensor(a)
    if out.dtype != like.dtype:
        out = out.to(like.dtype)
    return out if like.device.type == "cpu" else out.to(like.device)


def _tag(tensors: Sequence[torch.Tensor], *extra: Any) -> str:
    return ",".join(str(t.dtype).removeprefix("torch.") for t in tensors) + "".join(
        f" {e}" for e in extra
    )


def _set_size(ps: ProcessSet) -> int:
    return ps.runner().size


def _start(kind: str, ps: ProcessSet, prepare: Callable[[], tuple[Call, Finish]]) -> int:
    """Build the call (its errors travel to every rank instead of raising here), submit."""
    runner = ps.runner()  # a rank outside the set: typed error here (no one waits for it)
    finish: Finish
    try:
        call, finish = prepare()
    except (TypeError, ValueError) as err:
        call, finish = Call(kind, error=f"{type(err).__name__}: {err}"), (lambda r: None)
    pending = runner.submit(call)
    with _handle_lock:
        handle = next(_handle_ids)
        _handles[handle] = (pending, finish)
    return handle


def poll(handle: int) -> bool:
    """Whether the asynchronous operation of ``handle`` has finished (then
    :func:`synchronize` returns at once)."""
    with _handle_lock:
        entry = _handles.get(handle)
    if entry is None:
        raise ValueError(f"handle {handle!r} is unknown or already synchronized")
    return entry[0].done()


def synchronize(handle: int) -> Any:
    """Wait for the asynchronous operation of ``handle``; its result (as the plain form's).

    Errors of the operation (on any rank) are raised here as
    :class:`~hpcdist.errors.HorovodInternalError` or one of its subclasses.
    """
    with _handle_lock:
        entry = _handles.pop(handle, None)
    if entry is None:
        return None
    pending, finish = entry
    return finish(pending.wait())


# -- allreduce ------------------------------------------------------------------------


def _allreduce_start(
    tensors: Sequence[Any], average: bool | None, op: int | None, prescale_factor: float,
    postscale_factor: float, process_set: ProcessSet, inplace: bool, grouped: bool,
) -> int:
    def prepare() -> tuple[Call, Finish]:
        how = _pick_op(average, op)
        ts = _check(tensors, "allreduce")
        for t in ts:
            if t.dtype == torch.bool and how not in (Min, Max):
                raise TypeError("allreduce of bool tensors takes op=hvd.Min or hvd.Max")
            if how == Adasum and not t.dtype.is_floating_point:
                raise TypeError(f"Adasum reduces floating tensors; got {t.dtype}")
        arrays = []
        for t in ts:
            adasum_bf16 = how == Adasum and t.dtype == torch.bfloat16
            a = _host(t.float() if adasum_bf16 else t, reduce=True)
            if prescale_factor != 1.0:
                a = (a * prescale_factor).astype(a.dtype)
            arrays.append(a)
        floats = all(t.dtype.is_floating_point for t in ts)
        engine_op = ("MEAN" if floats else "SUM") if how == Average else _ENGINE_OP[how]
        size = _set_size(process_set)
        tag = _tag(ts, _OP_NAMES[how], prescale_factor, postscale_factor)

        def finish(results: list[np.ndarray]) -> Any:
            outs = []
            for t, r in zip(ts, results, strict=True):
                out = _tensor(r)
                if how == Average and not floats:  # the engine summed: divide here
                    out = out / size if out.dtype.is_floating_point else out.floor_divide(size)
                if postscale_factor != 1.0:
                    out = out * postscale_factor
                out = _like(out, t)
                if inplace:
                    with torch.no_grad():
                        t.copy_(out)
                    out = t
                outs.append(out)
            return outs if grouped else outs[0]

        return Call("allreduce", arrays, op=engine_op, tag=tag), finish

    return _start("allreduce", process_set, prepare)


def allreduce_async(
    tensor: torch.Tensor, average: bool | None = None, name: str | None = None,
    op: int | None = None, prescale_factor: float = 1.0, postscale_factor: float = 1.0,
    process_set: ProcessSet = global_process_set,
) -> int:
    """Start an allreduce of ``tensor`` (a new result); :func:`synchronize` gives it."""
    return _allreduce_start([tensor], average, op, prescale_factor, postscale_factor,
                            process_set, inplace=False, grouped=False)


def allreduce_async_(
    tensor: torch.Tensor, average: bool | None = None, name: str | None = None,
    op: int | None = None, prescale_factor: float = 1.0, postscale_factor: float = 1.0,
    process_set: ProcessSet = global_process_set,
) -> int:
    """Start an in-place allreduce of ``tensor``."""
    return _allreduce_start([tensor], average, op, prescale_factor, postscale_factor,
                            process_set, inplace=True, grouped=False)


class _Allreduce(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, tensor: torch.Tensor, op: int, pre: float, post: float,
                ps: ProcessSet) -> torch.Tensor:
        ctx.args = (op, pre, post, ps)
        return synchronize(allreduce_async(tensor, op=op, prescale_factor=pre,
                                           postscale_factor=post, process_set=ps))

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> Any:
        op, pre, post, ps = ctx.args
        return (synchronize(allreduce_async(grad.contiguous(), op=op, prescale_factor=pre,
                                            postscale_factor=post, process_set=ps)),
                None, None, None, None)


def allreduce(
    tensor: torch.Tensor, average: bool | None = None, name: str | None = None,
    compression: type[Compressor] = Compression.none, op: int | None = None,
    prescale_factor: float = 1.0, postscale_factor: float = 1.0,
    process_set: ProcessSet = global_process_set,
) -> torch.Tensor:
    """``tensor`` reduced over the process set with ``op`` (default Average); differentiable:
    the gradient is the same allreduce of the output's gradient."""
    try:
        how = _pick_op(average, op)
    except ValueError:  # reported on every rank by the negotiated call
        how = None
    if how is None or not isinstance(tensor, torch.Tensor):
        return synchronize(allreduce_async(tensor, average, name, op, prescale_factor,
                                           postscale_factor, process_set))
    compressed, ctx = compression.compress(tensor)
    out = _Allreduce.apply(compressed, how, prescale_factor, postscale_factor, process_set)
    return compression.decompress(out, ctx)


def allreduce_(
    tensor: torch.Tensor, average: bool | None = None, name: str | None = None,
    op: int | None = None, prescale_factor: float = 1.0, postscale_factor: float = 1.0,
    process_set: ProcessSet = global_process_set,
) -> torch.Tensor:
    """Reduce ``tensor`` in place over the process set; returns it."""
    return synchronize(allreduce_async_(tensor, average, name, op, prescale_factor,
                                        postscale_factor, process_set))


def grouped_allreduce_async(
    tensors: Sequence[torch.Tensor], average: bool | None = None, name: str | None = None,
    op: int | None = None, prescale_factor: float = 1.0, postscale_factor: float = 1.0,
    process_set: ProcessSet = global_process_set,
) -> int:
    """Start one fused allreduce of every tensor of ``tensors`` (new results)."""
    return _allreduce_start(list(tensors), average, op, prescale_factor, postscale_factor,
                            process_set, inplace=False, grouped=True)


def grouped_allreduce_async_(
    tensors: Sequence[torch.Tensor], average: bool | None = None, name: str | None = None,
    op: int | None = None, prescale_factor: float = 1.0, postscale_factor: float = 1.0,
    process_set: ProcessSet = global_process_set,
) -> int:
    """Start one fused in-place allreduce of ``tensors``."""
    return _allreduce_start(list(tensors), average, op, prescale_factor, postscale_factor,
                            process_set, inplace=True, grouped=True)


class _GroupedAllreduce(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, op: int, pre: float, post: float, ps: ProcessSet,
                *tensors: torch.Tensor) -> Any:
        ctx.args = (op, pre, post, ps)
        return tuple(synchronize(grouped_allreduce_async(
            tensors, op=op, prescale_factor=pre, postscale_factor=post, process_set=ps)))

    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor) -> Any:
        op, pre, post, ps = ctx.args
        reduced = synchronize(grouped_allreduce_async(
            [g.contiguous() for g in grads], op=op, prescale_factor=pre,
            postscale_factor=post, process_set=ps))
        return (None, None, None, None, *reduced)


def grouped_allreduce(
    tensors: Sequence[torch.Tensor], average: bool | None = None, name: str | None = None,
    compression: type[Compressor] = Compression.none, op: int | None = None,
    prescale_factor: float = 1.0, postscale_factor: float = 1.0,
    process_set: ProcessSet = global_process_set,
) -> list[torch.Tensor]:
    """Every tensor of ``tensors`` reduced over the process set, in one fused call;
    differentiable."""
    items = list(tensors)
    try:
        how = _pick_op(average, op)
        _check(items, "grouped_allreduce")
    except (TypeError, ValueError):
        return synchronize(grouped_allreduce_async(items, average, name, op, prescale_factor,
                                                   postscale_factor, process_set))
    pairs = [compression.compress(t) for t in items]
    outs = _GroupedAllreduce.apply(how, prescale_factor, postscale_factor, process_set,
                                   *[p[0] for p in pairs])
    return [compression.decompress(o, p[1]) for o, p in zip(outs, pairs, strict=True)]


def grouped_allreduce_(
    tensors: Sequence[torch.Tensor], average: bool | None = None, name: str | None = None,
    op: int | None = None, prescale_factor: float = 1.0, postscale_factor: float = 1.0,
    process_set: ProcessSet = global_process_set,
) -> list[torch.Tensor]:
    """Reduce every tensor of ``tensors`` in place, in one fused call; returns them."""
    return synchronize(grouped_allreduce_async_(tensors, average, name, op, prescale_factor,
                                                postscale_factor, process_set))


# -- allgather ------------------------------------------------------------------------


def _allgather_start(tensors: Sequence[Any], process_set: ProcessSet, grouped: bool) -> int:
    def prepare() -> tuple[Call, Finish]:
        ts = _check(tensors, "allgather")
        arrays = [_host(t, reduce=False) for t in ts]

        def finish(results: list[np.ndarray]) -> Any:
            outs = [_back(r, t) for t, r in zip(ts, results, strict=True)]
            return outs if grouped else outs[0]

        return Call("allgather", arrays, tag=_tag(ts)), finish

    return _start("allgather", process_set, prepare)


def allgather_async(tensor: torch.Tensor, name: str | None = None,
                    process_set: ProcessSet = global_process_set) -> int:
    """Start an allgather of ``tensor`` (concatenated along dimension 0, in rank order)."""
    return _allgather_start([tensor], process_set, grouped=False)


def grouped_allgather_async(tensors: Sequence[torch.Tensor], name: str | None = None,
                            process_set: ProcessSet = global_process_set) -> int:
    """Start one allgather of every tensor of ``tensors``."""
    return _allgather_start(list(tensors), process_set, grouped=True)


def _rows_before(rows: int, ps: ProcessSet) -> tuple[int, int]:
    """(rows of the lower ranks, total rows) from an allgather of each rank's count."""
    counts = synchronize(allgather_async(torch.tensor([rows], dtype=torch.int64),
                                         process_set=ps))
    me = ps.runner().rank
    return int(counts[:me].sum()), int(counts.sum())


class _Allgather(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, tensor: torch.Tensor, ps: ProcessSet) -> torch.Tensor:
        ctx.ps = ps
        ctx.rows = tensor.shape[0] if tensor.dim() else 1
        ctx.shape = tensor.shape
        return synchronize(allgather_async(tensor, process_set=ps))

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> Any:
        summed = synchronize(allreduce_async(grad.contiguous(), op=Sum, process_set=ctx.ps))
        start, _ = _rows_before(ctx.rows, ctx.ps)
        return summed.narrow(0, start, ctx.rows).reshape(ctx.shape), None


def allgather(tensor: torch.Tensor, name: str | None = None,
              process_set: ProcessSet = global_process_set) -> torch.Tensor:
    """Every rank's ``tensor`` concatenated along dimension 0 in rank order (the first
    dimension may differ per rank); differentiable: a rank's gradient is its rows of
    the sum of every rank's output gradient."""
    if not isinstance(tensor, torch.Tensor):
        return synchronize(allgather_async(tensor, name, process_set))
    return _Allgather.apply(tensor, process_set)


def grouped_allgather(tensors: Sequence[torch.Tensor], name: str | None = None,
                      process_set: ProcessSet = global_process_set) -> list[torch.Tensor]:
    """:func:`allgather` of each tensor of ``tensors`` in one call."""
    items = list(tensors)
    if any(t.requires_grad for t in items if isinstance(t, torch.Tensor)):
        return [allgather(t, name, process_set) for t in items]
    return synchronize(grouped_allgather_async(items, name, process_set))


# -- broadcast ------------------------------------------------------------------------


def _broadcast_start(tensor: Any, root_rank: int, process_set: ProcessSet,
                     inplace: bool) -> int:
    def prepare() -> tuple[Call, Finish]:
        (t,) = _check([tensor], "broadcast")
        size = _set_size(process_set)
        if isinstance(root_rank, bool) or not isinstance(root_rank, int) or not (
            0 <= root_rank < size
        ):
            raise ValueError(f"root_rank is {root_rank!r}; expected a rank 0..{size - 1}")

        def finish(results: list[np.ndarray]) -> Any:
            out = _back(results[0], t).reshape(t.shape)
            if inplace:
                with torch.no_grad():
                    t.copy_(out)
                return t
            return out

        return Call("broadcast", [_host(t, reduce=False)], root=root_rank, tag=_tag([t])), finish

    return _start("broadcast", process_set, prepare)


def broadcast_async(tensor: torch.Tensor, root_rank: int, name: str | None = None,
                    process_set: ProcessSet = global_process_set) -> int:
    """Start a broadcast of ``root_rank``'s ``tensor`` (a new result)."""
    return _broadcast_start(tensor, root_rank, process_set, inplace=False)


def broadcast_async_(tensor: torch.Tensor, root_rank: int, name: str | None = None,
                     process_set: ProcessSet = global_process_set) -> int:
    """Start an in-place broadcast of ``root_rank``'s ``tensor``."""
    return _broadcast_start(tensor, root_rank, process_set, inplace=True)


class _Broadcast(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, tensor: torch.Tensor, root: int, ps: ProcessSet) -> torch.Tensor:
        ctx.args = (root, ps)
        return synchronize(broadcast_async(tensor, root, process_set=ps))

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> Any:
        root, ps = ctx.args
        summed = synchronize(allreduce_async(grad.contiguous(), op=Sum, process_set=ps))
        if ps.runner().rank != root:
            summed = torch.zeros_like(summed)
        return summed, None, None


def broadcast(tensor: torch.Tensor, root_rank: int, name: str | None = None,
              process_set: ProcessSet = global_process_set) -> torch.Tensor:
    """``root_rank``'s ``tensor`` on every rank; differentiable: the root's gradient is the
    sum of every rank's output gradient, the others' zero."""
    if not isinstance(tensor, torch.Tensor):
        return synchronize(broadcast_async(tensor, root_rank, name, process_set))
    return _Broadcast.apply(tensor, root_rank, process_set)


def broadcast_(tensor: torch.Tensor, root_rank: int, name: str | None = None,
               process_set: ProcessSet = global_process_set) -> torch.Tensor:
    """Overwrite ``tensor`` with ``root_rank``'s, in place; returns it."""
    return synchronize(broadcast_async_(tensor, root_rank, name, process_set))


# -- alltoall -------------------------------------------------------------------------


def alltoall_async(tensor: torch.Tensor, splits: Any = None, name: str | None = None,
                   process_set: ProcessSet = global_process_set) -> int:
    """Start an alltoall; :func:`synchronize` gives ``(output, received_splits)``."""
    def prepare() -> tuple[Call, Finish]:
        (t,) = _check([tensor], "alltoall")
        s = None
        if splits is not None:
            s = [int(v) for v in (splits.tolist() if isinstance(splits, torch.Tensor)
                                  else splits)]

        def finish(results: list[np.ndarray]) -> Any:
            return _back(results[0], t), torch.from_numpy(results[1].astype(np.int32))

        return Call("alltoall", [_host(t, reduce=False)], splits=s, tag=_tag([t])), finish

    return _start("alltoall", process_set, prepare)


class _Alltoall(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, tensor: torch.Tensor, splits: Any, ps: ProcessSet) -> Any:
        out, received = synchronize(alltoall_async(tensor, splits, process_set=ps))
        ctx.ps, ctx.received = ps, received
        ctx.mark_non_differentiable(received)
        return out, received

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor, _unused: Any) -> Any:
        back, _ = synchronize(alltoall_async(grad.contiguous(), ctx.received,
                                             process_set=ctx.ps))
        return back, None, None


def alltoall(tensor: torch.Tensor, splits: Any = None, name: str | None = None,
             process_set: ProcessSet = global_process_set) -> tuple[torch.Tensor, torch.Tensor]:
    """Send rows ``splits[j]`` of ``tensor`` (dimension 0; default equal parts) to rank
    ``j``; returns ``(rows received, in rank order; rows received from each rank)``.
    Differentiable: the gradient is the alltoall back with the received splits."""
    if not isinstance(tensor, torch.Tensor):
        return synchronize(alltoall_async(tensor, splits, name, process_set))
    return _Alltoall.apply(tensor, splits, process_set)


# -- reducescatter --------------------------------------------------------------------


def _reducescatter_start(tensors: Sequence[Any], op: int, process_set: ProcessSet,
                         prescale_factor: float, postscale_factor: float,
                         grouped: bool) -> int:
    def prepare() -> tuple[Call, Finish]:
        how = _pick_op(None, op)
        if how not in (Average, Sum):
            raise ValueError(f"reducescatter takes op=hvd.Average or hvd.Sum; got "
                             f"{_OP_NAMES[how]}")
        ts = _check(tensors, "reducescatter")
        for t in ts:
            if t.dtype == torch.bool:
                raise TypeError("reducescatter does not take bool tensors")
            if t.dim() == 0:
                raise ValueError("reducescatter needs tensors with at least one dimension")
        arrays = []
        for t in ts:
            a = _host(t, reduce=True)
            arrays.append((a * prescale_factor).astype(a.dtype) if prescale_factor != 1 else a)
        floats = all(t.dtype.is_floating_point for t in ts)
        engine_op = ("MEAN" if floats else "SUM") if how == Average else "SUM"
        size = _set_size(process_set)

        def finish(results: list[np.ndarray]) -> Any:
            outs = []
            for t, r in zip(ts, results, strict=True):
                out = _tensor(r)
                if how == Average and not floats:  # the engine summed: divide here
                    out = out / size if out.dtype.is_floating_point else out.floor_divide(size)
                if postscale_factor != 1.0:
                    out = out * postscale_factor
                outs.append(out.to(t.dtype) if t.device.type == "cpu" else out.to(t))
            return outs if grouped else outs[0]

        tag = _tag(ts, _OP_NAMES[how], prescale_factor, postscale_factor)
        return Call("reducescatter", arrays, op=engine_op, tag=tag), finish

    return _start("reducescatter", process_set, prepare)


def reducescatter_async(tensor: torch.Tensor, name: str | None = None, op: int = Average,
                        process_set: ProcessSet = global_process_set,
                        prescale_factor: float = 1.0, postscale_factor: float = 1.0) -> int:
    """Start a reducescatter of ``tensor``."""
    return _reducescatter_start([tensor], op, process_set, prescale_factor, postscale_factor,
                                grouped=False)


def grouped_reducescatter_async(
    tensors: Sequence[torch.Tensor], name: str | None = None, op: int = Average,
    process_set: ProcessSet = global_process_set, prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
) -> int:
    """Start a reducescatter of every tensor of ``tensors``."""
    return _reducescatter_start(list(tensors), op, process_set, prescale_factor,
                                postscale_factor, grouped=True)


class _Reducescatter(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, tensor: torch.Tensor, op: int, ps: ProcessSet, pre: float,
                post: float) -> torch.Tensor:
        ctx.args = (op, ps, pre, post)
        return synchronize(reducescatter_async(tensor, op=op, process_set=ps,
                                               prescale_factor=pre, postscale_factor=post))

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> Any:
        op, ps, pre, post = ctx.args
        gathered = synchronize(allgather_async(grad.contiguous(), process_set=ps))
        scale = pre * post / (ps.runner().size if op == Average else 1)
        return (gathered * scale if scale != 1 else gathered), None, None, None, None


def reducescatter(tensor: torch.Tensor, name: str | None = None,
                  compression: type[Compressor] = Compression.none, op: int = Average,
                  process_set: ProcessSet = global_process_set, prescale_factor: float = 1.0,
                  postscale_factor: float = 1.0) -> torch.Tensor:
    """This rank's block (dimension 0, split as evenly as possible, lower ranks one row
    more) of ``tensor`` reduced over the set with ``op`` (Average or Sum);
    differentiable: the gradient is the allgather of the output gradients."""
    if not isinstance(tensor, torch.Tensor):
        return synchronize(reducescatter_async(tensor, name, op, process_set))
    compressed, ctx = compression.compress(tensor)
    out = _Reducescatter.apply(compressed, op, process_set, prescale_factor, postscale_factor)
    return compression.decompress(out, ctx)


def grouped_reducescatter(
    tensors: Sequence[torch.Tensor], name: str | None = None,
    compression: type[Compressor] = Compression.none, op: int = Average,
    process_set: ProcessSet = global_process_set, prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
) -> list[torch.Tensor]:
    """:func:`reducescatter` of each tensor of ``tensors`` in one call."""
    pairs = [compression.compress(t) if isinstance(t, torch.Tensor) else (t, None)
             for t in tensors]
    outs = synchronize(grouped_reducescatter_async(
        [p[0] for p in pairs], name, op, process_set, prescale_factor, postscale_factor))
    return [compression.decompress(o, p[1]) for o, p in zip(outs, pairs, strict=True)]


# -- barrier, join --------------------------------------------------------------------


def barrier(process_set: ProcessSet = global_process_set) -> None:
    """Wait until every rank of the set has reached this barrier."""
    process_set.runner().submit(Call("barrier")).wait()


def join(device: int = -1) -> int:
    """Say this rank has no more data: until every rank has joined, it takes part in the
    others' collectives and ``DistributedOptimizer`` steps with zeros (no rows for
    allgather and alltoall). Returns the rank that joined last."""
    basics.rank()  # not initialized: the typed error
    # every runner of the global set (the collectives', each DistributedOptimizer's) joins
    pending = [runner.join() for runner in global_process_set.all_runners()]
    results = [p.wait() for p in pending]
    return int(results[0])


def sparse_allreduce_async(tensor: Any, name: str | None = None, op: int | None = None,
                           process_set: ProcessSet = global_process_set) -> int:
    """Refused: hpcdist reduces dense tensors (pass ``tensor.to_dense()``, or
    ``sparse_as_dense=True`` to DistributedOptimizer)."""
    raise TypeError("sparse_allreduce_async: hpcdist reduces dense tensors; pass "
                    "tensor.to_dense() to allreduce_async, or sparse_as_dense=True to "
                    "DistributedOptimizer")


def _grouped_broadcast_(tensors: Sequence[torch.Tensor], root_rank: int,
                        process_set: ProcessSet = global_process_set) -> list[torch.Tensor]:
    """Overwrite each tensor with ``root_rank``'s, in place, in one negotiated call."""
    items = list(tensors)

    def prepare() -> tuple[Call, Finish]:
        ts = _check(items, "broadcast")
        size = _set_size(process_set)
        if isinstance(root_rank, bool) or not isinstance(root_rank, int) or not (
            0 <= root_rank < size
        ):
            raise ValueError(f"root_rank is {root_rank!r}; expected a rank 0..{size - 1}")

        def finish(results: list[np.ndarray]) -> Any:
            with torch.no_grad():
                for t, r in zip(ts, results, strict=True):
                    t.copy_(_back(r, t).reshape(t.shape))
            return ts

        arrays = [_host(t, reduce=False) for t in ts]
        return Call("broadcast", arrays, root=root_rank, tag=_tag(ts)), finish

    return synchronize(_start("broadcast", process_set, prepare))
