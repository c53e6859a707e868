"""``DistributedOptimizer``: any ``torch.optim`` optimizer, gradients averaged over replicas.

Gradients are reduced in *buckets* while backward runs: a hook on every
parameter (``register_post_accumulate_grad_hook``) notes when its gradient
is complete; when every gradient of a bucket is, the bucket's allreduce
(MEAN over the replicas, through the hpcdist engine, in place on the
gradient memory) is handed to a communication thread, so it overlaps the
rest of backward. Buckets follow the reverse order of the parameters (the
order backward produces gradients) and are always started in bucket order,
so every rank issues the same collectives in the same order. ``step()``
waits for the buckets (:meth:`synchronize`) and then steps.

The wrapped optimizer is the same object seen through a subclass of its
class: ``isinstance(opt, torch.optim.SGD)`` holds, learning-rate schedulers,
``state_dict``/``load_state_dict``, ``zero_grad`` and param groups behave as
they do without hpcdist.

Rules: between ``backward()`` and ``step()`` (or :meth:`synchronize`) run no
other hpcdist collective and do not read the gradients (they are being
averaged in place). With a ``GradScaler``, ``scaler.step(opt)`` works as
is: reading ``param_groups`` (as ``unscale_`` does) first waits for the
averaged gradients, so every rank sees the same infs and skips the same steps.

Example::

    opt = hdt.DistributedOptimizer(torch.optim.Adam(model.parameters()), model=model)
    loss.backward()      # buckets are reduced while this runs
    opt.step()           # waits for the last bucket, then Adam's update
"""

from __future__ import annotations

import queue
import threading
import weakref
from collections.abc import Callable
from typing import Any

import torch

from hpcdist.adapters import engine_for
from hpcdist.collectives import CommunicationOptions, ReduceOp
from hpcdist.collectives.choice import DEFAULT_BUCKET_BYTES
from hpcdist.distribute.sharding import check_sharding
from hpcdist.observe import timeline


def DistributedOptimizer(  # noqa: N802  (a class-like factory, named as in Horovod)
    optimizer: torch.optim.Optimizer,
    model: torch.nn.Module | None = None,
    strategy: Any = None,
    bytes_per_pack: int | None = None,
    backward_passes_per_step: int = 1,
    overlap: bool = True,
    timeout_seconds: float | None = 600.0,
    shard: str | None = None,
    compression: str | None = None,
    compression_filter: Callable[[Any], bool] | None = None,
) -> torch.optim.Optimizer:
    """Wrap ``optimizer`` so that its gradients are averaged over all replicas before a step.

    Args:
        optimizer: any ``torch.optim.Optimizer`` (state and param groups are kept).
        model: the module, to order buckets by its parameters (default: the
            optimizer's parameter order).
        strategy: whose replicas to average over (default: the current
            strategy, outside any scope every rank of the MPI world).
        bytes_per_pack: bucket size in bytes (default 4 MiB).
        backward_passes_per_step: backward passes accumulated locally before
            the gradients are reduced (gradient accumulation); ``step()`` is
            called once per that many passes.
        overlap: reduce buckets on a communication thread while backward
            runs (``False``: all buckets in ``step()``, on the calling thread).
        timeout_seconds: the communication thread's collectives fail with
            :class:`~hpcdist.errors.CollectiveTimeoutError` (raised by
            ``step()``) after this long instead of hanging, and wait sleeping
            rather than spinning (``None``: no timeout).
        shard: ``None`` (every rank keeps all optimizer state), ``"optimizer"``
            (ZeRO-1: each rank keeps the state of its 1/N slice of the flat
            parameters) or ``"gradients"`` (ZeRO-2: also only its slice of the
            averaged gradients); see :mod:`hpcdist.torch.sharded`.
        compression: ``"bf16"`` or ``"fp16"``: float32 gradients travel between
            nodes as 16-bit floats, summed in float32 (half the bytes);
            ``compression_filter(grad) -> bool`` picks which (e.g.
            ``lambda g: g.ndim > 1`` keeps biases and norms exact). See
            :class:`~hpcdist.CommunicationOptions`.

    Returns the same optimizer object, seen as a subclass of its class.

    Example: ``opt = hdt.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1))``.
    """
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise TypeError(
            f"DistributedOptimizer wraps a torch.optim.Optimizer; got {type(optimizer).__name__}"
        )
    if isinstance(optimizer, DistributedMixin):
        raise ValueError("this optimizer is already a DistributedOptimizer; wrap it once")
    if isinstance(backward_passes_per_step, bool) or int(backward_passes_per_step) < 1:
        raise ValueError(
            f"backward_passes_per_step is {backward_passes_per_step!r}; expected an int >= 1"
        )
    if bytes_per_pack is not None and int(bytes_per_pack) <= 0:
        raise ValueError(f"bytes_per_pack is {bytes_per_pack!r}; expected a positive int or None")
    stage = check_sharding(shard)
    wire = CommunicationOptions(compression=compression, compression_filter=compression_filter)
    if stage is not None:  # hpcdist.torch.sharded (registered below, imported by the package)
        args = (model, strategy, bytes_per_pack or DEFAULT_BUCKET_BYTES,
                int(backward_passes_per_step), overlap, timeout_seconds, wire)
        return _SHARDED[0](optimizer, args, stage, model)
    cls = type(f"Distributed{type(optimizer).__name__}", (DistributedMixin, type(optimizer)), {})
    wrapped: DistributedMixin = object.__new__(cls)
    wrapped.__dict__ = optimizer.__dict__  # one optimizer, two views of it
    wrapped._hd = Reducer(
        optimizer, model, strategy, bytes_per_pack or DEFAULT_BUCKET_BYTES,
        int(backward_passes_per_step), overlap, timeout_seconds, wire,
    )
    return wrapped


_SHARDED: list[Callable[..., torch.optim.Optimizer]] = []


def register_sharded(wrap: Callable[..., Any]) -> Callable[..., Any]:
    """Register the ZeRO wrapper (:mod:`hpcdist.torch.sharded`, which builds on this module)."""
    _SHARDED[:] = [wrap]
    return wrap


class DistributedMixin:
    """The methods a distributed optimizer adds to (or puts before) its class's."""

    _hd: Reducer

    def synchronize(self) -> None:
        """Wait until every gradient is averaged over the replicas (starts what has not started).

        Example: ``opt.synchronize(); torch.nn.utils.clip_grad_norm_(params, 1.0)``.
        """
        self.__dict__["_hd"].synchronize()

    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        """Wait for the averaged gradients, then take the wrapped optimizer's step."""
        if closure is not None:
            raise ValueError(
                "DistributedOptimizer.step takes no closure: its backward would run after the "
                "gradients were averaged. Run the closure (forward and backward) before step()"
            )
        self.__dict__["_hd"].synchronize()
        # the wrapped optimizer's class follows DistributedMixin in the MRO
        return super().step()  # type: ignore[misc]

    def __getattribute__(self, name: str) -> Any:
        if name == "param_groups":  # the gradients are read through them: wait first
            hd = object.__getattribute__(self, "__dict__").get("_hd")
            if hd is not None and hd.in_flight():
                hd.synchronize()
        return super().__getattribute__(name)


class Bucket:
    """Parameters whose gradients are reduced together, and the state of their reduction."""

    __slots__ = ("params", "waiting", "done", "error")

    def __init__(self, params: list[torch.nn.Parameter]) -> None:
        self.params = params
        self.waiting = len(params)
        self.done = threading.Event()
        self.error: BaseException | None = None


class Reducer:
    """The buckets of one distributed optimizer and the thread that reduces them."""

    def __init__(
        self,
        optimizer: torch.optim.Optimizer,
        model: torch.nn.Module | None,
        strategy: Any,
        bucket_bytes: int,
        passes: int,
        overlap: bool,
        timeout_seconds: float | None,
        compression: CommunicationOptions | None = None,
    ) -> None:
        params = [p for g in optimizer.param_groups for p in g["params"] if p.requires_grad]
        if model is not None:
            order = {id(p): i for i, p in enumerate(model.parameters())}
            params.sort(key=lambda p: order.get(id(p), -1))
        params = list(dict.fromkeys(params))  # a parameter in two groups: once
        self._passes = passes
        self._engine = engine_for(strategy, private=overlap)
        self._options = CommunicationOptions(
            bytes_per_pack=bucket_bytes,
            timeout_seconds=timeout_seconds if overlap and self._engine.size > 1 else None,
        ).merge(compression)
        self._buckets: list[Bucket] = []
        self._bucket_of: dict[int, int] = {}
        self._counts: dict[int, int] = {}
        current: list[torch.nn.Parameter] = []
        size = 0
        for p in reversed(params):  # backward produces the last layer's gradients first
            current.append(p)
            size += p.numel() * p.element_size()
            if size >= bucket_bytes:
                self._buckets.append(Bucket(current))
                current, size = [], 0
        if current:
            self._buckets.append(Bucket(current))
        for i, bucket in enumerate(self._buckets):
            for p in bucket.params:
                self._bucket_of[id(p)] = i
                self._counts[id(p)] = 0
                p.register_post_accumulate_grad_hook(self._grad_ready)
        self._next = 0  # the next bucket to start
        self._active = False
        self._queue: queue.SimpleQueue[Bucket | None] | None = None
        if overlap and self._engine.size > 1:
            self._queue = queue.SimpleQueue()
            thread = threading.Thread(
                target=_serve, args=(self._queue, self._engine, self._options),
                name="hpcdist-torch-comm", daemon=True,
            )
            thread.start()
            weakref.finalize(self, self._queue.put, None)  # the thread ends with the optimizer

    def in_flight(self) -> bool:
        return self._active

    def _grad_ready(self, p: torch.Tensor) -> None:
        key = id(p)
        self._counts[key] += 1
        if self._counts[key] != self._passes:
            return
        self._active = True
        bucket = self._buckets[self._bucket_of[key]]
        bucket.waiting -= 1
        if timeline.active:  # hook fired -> bucket ready -> reduced (hpcdist.observe.timeline)
            timeline.bucket_progress(self._bucket_of[key], bucket.waiting, len(bucket.params))
        if bucket.waiting == 0 and self._queue is not None:
            while self._next < len(self._buckets) and self._buckets[self._next].waiting == 0:
                self._launch(self._buckets[self._next])
                self._next += 1

    def _launch(self, bucket: Bucket) -> None:
        for p in bucket.params:
            if p.grad is None:  # unused in this step: it takes part with a zero gradient
                p.grad = torch.zeros_like(p)
        if self._queue is not None:
            self._queue.put(bucket)
        else:
            _reduce(self._engine, self._options, bucket)

    def synchronize(self) -> None:
        """Start the buckets not started yet (in order), wait for all, reset for the next step."""
        if not self._active and self._next == 0:
            if all(c == 0 for c in self._counts.values()):
                return  # no backward since the last step: nothing to reduce
        while self._next < len(self._buckets):
            self._launch(self._buckets[self._next])
            self._next += 1
        errors = []
        for bucket in self._buckets:
            bucket.done.wait()
            if bucket.error is not None:
                errors.append(bucket.error)
        self._reset()
        if errors:
            raise errors[0]

    def _reset(self) -> None:
        for bucket in self._buckets:
            bucket.waiting = len(bucket.params)
            bucket.done.clear()
            bucket.error = None
        for key in self._counts:
            self._counts[key] = 0
        self._next = 0
        self._active = False


def _reduce(engine: Any, options: CommunicationOptions, bucket: Bucket) -> None:
    """Average the bucket's gradients over the replicas, in place; note errors for the waiter."""
    try:
        grads = [p.grad for p in bucket.params]
        with timeline.span("reduced", "buckets", {"params": len(grads)}):
            engine.allreduce(grads, ReduceOp.MEAN, options, out=grads)
    except BaseException as err:  # handed to the thread that waits (synchronize)
        bucket.error = err
    finally:
        bucket.done.set()


def _serve(jobs: queue.SimpleQueue, engine: Any, options: CommunicationOptions) -> None:
    """The communication thread: reduce the buckets handed to it, in order, until ``None``."""
    while True:
        bucket = jobs.get()
        if bucket is None:
            return
        if callable(bucket):  # other work for this thread (hpcdist.torch.sharded)
            bucket()
        else:
            _reduce(engine, options, bucket)
