"""Broadcasting a model's and an optimizer's state from one rank, and a tensor allreduce.

Example::

    hdt.broadcast_parameters(model, root=0)       # parameters and buffers, in place
    hdt.broadcast_optimizer_state(optimizer, root=0)
    mean_loss = hdt.allreduce(loss.detach(), op="MEAN")
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import torch

from hpcdist.adapters import engine_for
from hpcdist.collectives import ReduceOp
from hpcdist.errors import ShardingError


def allreduce(tensor: torch.Tensor, op: ReduceOp | str = "MEAN", strategy: Any = None) -> Any:
    """``tensor`` reduced over the workers of ``strategy`` (default: current, else every rank).

    The engine reads the tensor's memory in place; the result is a new
    tensor on the same device. A tensor that requires grad must be detached.

    Example: ``hdt.allreduce(torch.tensor([loss.item()]), "SUM")``.
    """
    return engine_for(strategy).allreduce([tensor], op)[0]


def _named_tensors(source: Any) -> list[tuple[str, torch.Tensor]]:
    if isinstance(source, torch.nn.Module):
        return list(source.state_dict(keep_vars=True).items())
    if isinstance(source, Mapping):
        return list(source.items())
    if isinstance(source, Iterable):
        items = list(source)
        if all(isinstance(i, tuple) and len(i) == 2 for i in items):
            return items
        return [(str(i), t) for i, t in enumerate(items)]
    raise TypeError(
        f"broadcast_parameters got {type(source).__name__}; expected a torch.nn.Module, a "
        "state_dict (name -> tensor) or an iterable of tensors or (name, tensor) pairs"
    )


def broadcast_parameters(module_or_state_dict: Any, root: int = 0, strategy: Any = None) -> None:
    """Overwrite the tensors of ``module_or_state_dict`` with rank ``root``'s, in place.

    A module gives its parameters and buffers (its ``state_dict``); a dict
    or an iterable gives its tensors. Every rank must pass the same names,
    shapes and dtypes (a mismatch is the engine's clear error on all ranks).

    Example: ``hdt.broadcast_parameters(model, root=0)`` right after building the model.
    """
    named = [(n, t) for n, t in _named_tensors(module_or_state_dict) if torch.is_tensor(t)]
    if not named:
        return
    tensors = [t.detach() for _, t in sorted(named, key=lambda item: item[0])]
    results = engine_for(strategy).broadcast(tensors, root=root)
    with torch.no_grad():
        for t, r in zip(tensors, results, strict=True):
            t.copy_(r)


def broadcast_optimizer_state(optimizer: Any, root: int = 0, strategy: Any = None) -> None:
    """Give every rank rank ``root``'s optimizer state (hyperparameters and per-parameter state).

    Ranks whose state is not yet made (no step taken) receive the root's.
    The structure travels once as a small pickled description, the tensors
    through the engine's broadcast.

    Example: ``hdt.broadcast_optimizer_state(optimizer, root=0)`` after loading a checkpoint
    on rank 0.
    """
    if hasattr(optimizer, "shard_layout"):  # every rank decides alike: no collective yet
        raise ShardingError(
            "broadcast_optimizer_state: this optimizer is sharded (DistributedOptimizer(shard="
            "...)); each rank's state is its own slice, so there is nothing to broadcast. "
            "broadcast_parameters(model) is enough at the start; resume with hdt.load_sharded"
        )
    engine = engine_for(strategy)
    if engine.size == 1:
        return
    state = optimizer.state_dict() if engine.rank == root else None
    spec = None
    if state is not None:
        spec = _describe(state)
    spec = engine.comm.bcast(spec, root=root)
    tensors = _tensors(state) if state is not None else [
        torch.empty(shape, dtype=getattr(torch, dtype)) for shape, dtype in spec["tensors"]
    ]
    received = engine.broadcast(tensors, root=root) if tensors else []
    if engine.rank == root:
        return
    rebuilt = _rebuild(spec["tree"], iter(received))
    optimizer.load_state_dict(rebuilt)


def _describe(state: Any) -> dict[str, Any]:
    shapes: list[tuple[tuple[int, ...], str]] = []

    def walk(x: Any) -> Any:
        if torch.is_tensor(x):
            shapes.append((tuple(x.shape), str(x.dtype).removeprefix("torch.")))
            return ("__tensor__", len(shapes) - 1)
        if isinstance(x, Mapping):
            return {k: walk(v) for k, v in x.items()}
        if isinstance(x, (list, tuple)):
            return type(x)(walk(v) for v in x)
        return x

    return {"tree": walk(state), "tensors": shapes}


def _tensors(state: Any) -> list[torch.Tensor]:
    out: list[torch.Tensor] = []

    def walk(x: Any) -> None:
        if torch.is_tensor(x):
            out.append(x.detach().cpu().contiguous())
        elif isinstance(x, Mapping):
            for v in x.values():
                walk(v)
        elif isinstance(x, (list, tuple)):
            for v in x:
                walk(v)

    walk(state)
    return out


def _rebuild(tree: Any, tensors: Any) -> Any:
    if isinstance(tree, tuple) and len(tree) == 2 and tree[0] == "__tensor__":
        return next(tensors)
    if isinstance(tree, Mapping):
        return {k: _rebuild(v, tensors) for k, v in tree.items()}
    if isinstance(tree, (list, tuple)):
        return type(tree)(_rebuild(v, tensors) for v in tree)
    return tree
