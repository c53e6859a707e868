"""Broadcasting a model's and an optimizer's state, and any picklable object.

Example::

    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)
    epoch = hvd.broadcast_object(epoch, root_rank=0)
"""

from __future__ import annotations

import io
import pickle
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np
import torch

import hpcdist.torch as hdt
from hpcdist.errors import (
    CollectiveMismatchError,
    HorovodInternalError,
    HorovodMismatchError,
    HpcdistError,
)
from hpcdist.horovod.common.process_sets import ProcessSet, global_process_set
from hpcdist.horovod.torch import mpi_ops


def broadcast_parameters(params: Any, root_rank: int) -> None:
    """Overwrite ``params`` (a ``state_dict`` or an iterable of ``(name, tensor)``) with
    ``root_rank``'s, in place, in one call; tensors are matched by sorted name."""
    if isinstance(params, Mapping):
        items = sorted(params.items(), key=lambda kv: str(kv[0]))
    elif isinstance(params, Iterable) and not isinstance(params, torch.Tensor):
        items = list(params)
        if not all(isinstance(p, tuple) and len(p) == 2 for p in items):
            items = [("", None)]  # an invalid shape: the error below, on every rank
    else:
        items = [("", params)]
    tensors = [p for _, p in items if isinstance(p, torch.Tensor)]
    if len(tensors) != len(items) and any(p is not None for _, p in items):
        bad = next(type(p).__name__ for _, p in items if not isinstance(p, torch.Tensor))
        tensors = [bad]  # travels as this rank's invalid argument
    elif len(tensors) != len(items):
        tensors = ["not a state_dict or (name, tensor) pairs"]
    mpi_ops._grouped_broadcast_(tensors, root_rank)


def broadcast_optimizer_state(optimizer: torch.optim.Optimizer, root_rank: int) -> None:
    """Give every rank ``root_rank``'s optimizer state (hyperparameters and per-parameter
    state; ranks without state yet get the root's), through ``hpcdist.torch``."""
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise TypeError(f"broadcast_optimizer_state takes a torch.optim.Optimizer; got "
                        f"{type(optimizer).__name__}")
    engine = global_process_set.group().engine()
    try:
        hdt.broadcast_optimizer_state(optimizer, root=root_rank, strategy=engine)
    except CollectiveMismatchError as err:
        raise HorovodMismatchError(str(err)) from err
    except HpcdistError as err:
        if isinstance(err, HorovodInternalError):
            raise
        raise HorovodInternalError(f"{type(err).__name__}: {err}") from err


def broadcast_object(obj: Any, root_rank: int = 0, name: str | None = None,
                     process_set: ProcessSet = global_process_set) -> Any:
    """``root_rank``'s ``obj`` (any picklable object) on every rank of the set."""
    me = process_set.runner().rank
    data = np.frombuffer(_dumps(obj), dtype=np.uint8) if me == root_rank else np.empty(0, np.uint8)
    length = torch.tensor([data.shape[0]], dtype=torch.int64)
    mpi_ops._grouped_broadcast_([length], root_rank, process_set)
    payload = torch.zeros(int(length[0]), dtype=torch.uint8)
    if me == root_rank:
        payload = torch.from_numpy(data.copy())
    mpi_ops._grouped_broadcast_([payload], root_rank, process_set)
    return obj if me == root_rank else pickle.loads(payload.numpy().tobytes())


def allgather_object(obj: Any, name: str | None = None,
                     process_set: ProcessSet = global_process_set) -> list[Any]:
    """Every rank's ``obj`` (any picklable object), in rank order."""
    data = torch.from_numpy(np.frombuffer(_dumps(obj), dtype=np.uint8).copy())
    sizes = mpi_ops.allgather(torch.tensor([data.shape[0]], dtype=torch.int64),
                              process_set=process_set)
    gathered = mpi_ops.allgather(data, process_set=process_set).numpy().tobytes()
    out, start = [], 0
    for n in sizes.tolist():
        out.append(pickle.loads(gathered[start:start + n]))
        start += n
    return out


def _dumps(obj: Any) -> bytes:
    buf = io.BytesIO()
    pickle.dump(obj, buf, protocol=pickle.HIGHEST_PROTOCOL)
    return buf.getvalue()
