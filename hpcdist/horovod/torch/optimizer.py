"""Horovod's ``DistributedOptimizer``, built on :func:`hpcdist.torch.DistributedOptimizer`.

hpcdist's optimizer does the work (buckets reduced on a communication
thread while backward runs, in place on the gradient memory); this module
maps Horovod's arguments onto it: ``op`` (Average or Sum),
``compression`` (fp16/bf16: gradients rounded to the wire dtype before the
reduction and cast back after), ``gradient_predivide_factor`` (divide
before the sum, multiply after), ``backward_passes_per_step``,
``num_groups`` (bucket size = total gradient bytes / num_groups),
``sparse_as_dense`` and ``process_set`` (gradients reduced over the set's
ranks only). The buckets' reductions are negotiated calls on a runner of the
process set of their own (:mod:`hpcdist.horovod.common.runner`), so that a rank
that called ``hvd.join()`` takes part in the others' steps with zero gradients.

Example::

    opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters(),
                                   compression=hvd.Compression.fp16, op=hvd.Average)
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import Any

import torch

import hpcdist.torch as hdt
from hpcdist.collectives import Collectives, CommunicationOptions, ReduceOp
from hpcdist.horovod.common.ops import Adasum, Average, Sum
from hpcdist.horovod.common.process_sets import ProcessSet, global_process_set
from hpcdist.horovod.common.runner import Call, Runner
from hpcdist.horovod.torch.compression import Compression, Compressor
from hpcdist.horovod.torch.tensors import from_host, to_host
from hpcdist.runtime import mpi


class _GradientEngine(Collectives):
    """The engine the optimizer's buckets use: Horovod's op, compression and predivide
    around the plain engine's allreduce (subclassed per configuration, so that
    the private duplicate hpcdist.torch makes keeps them)."""

    wire: torch.dtype | None = None
    summed: bool = False
    predivide: float = 1.0
    runner: Runner | None = None  # the process set's runner for this optimizer (join-aware)

    def allreduce(self, tensors: Any, op: ReduceOp | str,
                  options: CommunicationOptions | None = None, *, out: Any = None) -> list[Any]:
        op = ReduceOp.from_any(op)
        if self.summed and op is ReduceOp.MEAN:
            op = ReduceOp.SUM
        plain = not all(isinstance(t, torch.Tensor) for t in tensors)  # the engine's own call
        if plain or (self.runner is None and self.wire is None and self.predivide == 1.0):
            return super().allreduce(tensors, op, options, out=out)
        sent = []
        for t in tensors:
            s = t / self.predivide if self.predivide != 1.0 else t
            if self.wire is not None and s.dtype.is_floating_point and s.dtype != self.wire:
                s = s.to(self.wire)  # the engine reduces 16-bit floats in float32, rounds once
            sent.append(s)
        if self.runner is not None:  # negotiated: ranks that joined take part with zeros
            arrays = [to_host(s) for s in sent]
            results = self.runner.run(Call("allreduce", arrays, op=op.value,
                                           tag="DistributedOptimizer"))
            got = [from_host(r) for r in results]
        else:
            got = super().allreduce(sent, op, options)
        targets = list(out) if out is not None else [torch.empty_like(t) for t in tensors]
        with torch.no_grad():
            for target, g in zip(targets, got, strict=True):
                target.copy_(g * self.predivide if self.predivide != 1.0 else g)
        return targets


class _HorovodMethods:
    """What Horovod's optimizer has beyond hpcdist's: ``skip_synchronize``."""

    @contextlib.contextmanager
    def skip_synchronize(self) -> Iterator[None]:
        """``step()`` inside it does not synchronize again (after an explicit
        ``synchronize()``; hpcdist's ``step`` never reduces twice anyway)."""
        yield


def DistributedOptimizer(  # noqa: N802  (Horovod's name)
    optimizer: torch.optim.Optimizer,
    named_parameters: Any = None,
    compression: type[Compressor] = Compression.none,
    backward_passes_per_step: int = 1,
    op: int = Average,
    gradient_predivide_factor: float = 1.0,
    num_groups: int = 0,
    groups: Sequence[Sequence[torch.Tensor]] | None = None,
    sparse_as_dense: bool = False,
    process_set: ProcessSet = global_process_set,
) -> torch.optim.Optimizer:
    """``optimizer`` with its gradients averaged (``op=Average``) or summed (``Sum``) over
    the process set before each ``step()``: Horovod's arguments, hpcdist's optimizer.

    ``op=Adasum`` is refused (use ``hvd.allreduce(..., op=hvd.Adasum)`` on gradients
    yourself); a sparse gradient needs ``sparse_as_dense=True``.
    """
    if op == Adasum:
        raise ValueError(
            "DistributedOptimizer(op=hvd.Adasum) is not supported by hpcdist.horovod: use "
            "op=hvd.Average or hvd.Sum, or reduce gradients yourself with "
            "hvd.allreduce(grad, op=hvd.Adasum)"
        )
    if op not in (Average, Sum):
        raise ValueError(f"op is {op!r}; DistributedOptimizer takes hvd.Average or hvd.Sum")
    if gradient_predivide_factor != 1.0 and op != Average:
        raise ValueError("gradient_predivide_factor needs op=hvd.Average")
    if gradient_predivide_factor <= 0:
        raise ValueError(f"gradient_predivide_factor is {gradient_predivide_factor}; expected > 0")
    if compression not in (Compression.none, Compression.fp16, Compression.bf16):
        raise ValueError(f"compression is {compression!r}; expected hvd.Compression.none, "
                         "fp16 or bf16")
    params = [p for g in optimizer.param_groups for p in g["params"]]
    if named_parameters is not None:
        named = list(named_parameters)
        if not all(isinstance(p, tuple) and len(p) == 2 for p in named):
            raise ValueError("named_parameters should be a sequence of (name, parameter) tuples")
        names = [n for n, _ in named]
        if len(set(names)) != len(names):
            dups = sorted({n for n in names if names.count(n) > 1})
            raise ValueError(f"parameter names in named_parameters must be unique; repeated: "
                             f"{dups}")
        known = {id(p) for _, p in named}
        unnamed = sum(1 for p in params if id(p) not in known)
        if unnamed:
            raise ValueError(f"named_parameters was given, but {unnamed} parameters of the "
                             "optimizer are not in it; pass model.named_parameters() of the "
                             "model the optimizer trains")
    if groups is not None:
        owned = {id(p) for p in params}
        if any(id(p) not in owned for g in groups for p in g):
            raise ValueError("groups lists a tensor that is not a parameter of the optimizer")
    if num_groups < 0:
        raise ValueError(f"num_groups is {num_groups}; expected >= 0")
    bucket = None
    if num_groups > 0:
        total = sum(p.numel() * p.element_size() for p in params if p.requires_grad)
        bucket = max(1, -(-total // num_groups))
    if sparse_as_dense:
        for p in params:
            if p.requires_grad:
                p.register_post_accumulate_grad_hook(_densify)
    wires: dict[Any, torch.dtype] = {Compression.fp16: torch.float16,
                                     Compression.bf16: torch.bfloat16}
    engine_class = type("HorovodGradientEngine", (_GradientEngine,), {
        "wire": wires.get(compression),
        "summed": op == Sum,
        "predivide": float(gradient_predivide_factor),
        "runner": process_set.new_runner() if process_set.included() else None,
    })
    included = process_set.included()
    if included is None:
        process_set.runner()  # not initialized or not added: the typed error
    comm = process_set.group().engine().comm if included else mpi().COMM_SELF
    wrapped = hdt.DistributedOptimizer(
        optimizer, strategy=engine_class(comm), bytes_per_pack=bucket,
        backward_passes_per_step=backward_passes_per_step,
    )
    cls = type(wrapped)
    wrapped.__class__ = type(cls.__name__, (_HorovodMethods, cls), {})
    return wrapped


def _densify(p: torch.Tensor) -> None:
    if p.grad is not None and p.grad.is_sparse:
        p.grad = p.grad.to_dense()
