"""PyTorch models on hpcdist: broadcast the start state, all-reduce the gradients.

One MPI rank trains one model replica. :func:`broadcast_parameters` and
:func:`broadcast_optimizer_state` give every rank the root's start state;
:func:`DistributedOptimizer` wraps any ``torch.optim`` optimizer so that the
gradients are averaged over all replicas (through the hpcdist collectives
engine, reading the gradient memory in place) while backward still runs;
with ``shard="optimizer"`` / ``"gradients"`` (ZeRO-1/ZeRO-2) each rank keeps
only its slice of the optimizer state (and gradients), and
:func:`save_sharded` / :func:`load_sharded` checkpoint it at any world size.

Importing :mod:`hpcdist` never imports PyTorch; importing this module does.

Example::

    import torch, hpcdist.torch as hdt
    model = Net()
    opt = hdt.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), model=model)
    hdt.broadcast_parameters(model, root=0)
    hdt.broadcast_optimizer_state(opt, root=0)
    for x, y in local_batches:
        opt.zero_grad()
        loss_fn(model(x), y).backward()
        opt.step()
"""

from hpcdist.torch.broadcast import allreduce, broadcast_optimizer_state, broadcast_parameters
from hpcdist.torch.optimizer import DistributedOptimizer
from hpcdist.torch.sharded import load_sharded, save_sharded

__all__ = [
    "DistributedOptimizer",
    "allreduce",
    "broadcast_optimizer_state",
    "broadcast_parameters",
    "load_sharded",
    "save_sharded",
]
