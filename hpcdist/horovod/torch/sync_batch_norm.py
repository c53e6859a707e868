"""``SyncBatchNorm``: batch normalization over the global batch of every rank.

In training, each rank's per-channel sum, sum of squares and count are
summed over the process set with one differentiable allreduce
(:func:`~hpcdist.horovod.torch.allreduce`, ``op=Sum``), so the forward pass
equals ``BatchNorm`` over the concatenated batch and autograd gives its
exact gradient (the allreduce's gradient is the allreduce of the
gradients). Running statistics use the unbiased global variance, as
``torch.nn.BatchNorm`` does. In eval mode it is a plain batch norm.

Example::

    model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), hvd.SyncBatchNorm(8))
"""

from __future__ import annotations

import torch
import torch.nn.functional as F  # noqa: N812

from hpcdist.horovod.common.ops import Sum
from hpcdist.horovod.common.process_sets import ProcessSet, global_process_set
from hpcdist.horovod.torch.mpi_ops import allreduce


class SyncBatchNorm(torch.nn.modules.batchnorm._BatchNorm):
    """Batch normalization whose statistics cover every rank's batch (Horovod's
    ``hvd.SyncBatchNorm``; input ``(N, C, ...)``)."""

    def __init__(self, num_features: int, eps: float = 1e-5, momentum: float | None = 0.1,
                 affine: bool = True, track_running_stats: bool = True,
                 process_set: ProcessSet = global_process_set) -> None:
        super().__init__(num_features, eps, momentum, affine, track_running_stats)
        self.process_set = process_set

    def _check_input_dim(self, x: torch.Tensor) -> None:
        if x.dim() < 2:
            raise ValueError(f"SyncBatchNorm expects input of shape (N, C, ...); got {x.dim()}-D")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self._check_input_dim(x)
        use_batch = self.training or not self.track_running_stats
        if not use_batch:
            return F.batch_norm(x, self.running_mean, self.running_var, self.weight, self.bias,
                                False, 0.0, self.eps)
        dims = [0, *range(2, x.dim())]
        count = torch.tensor([x.numel() / max(x.shape[1], 1)], dtype=x.dtype, device=x.device)
        local = torch.cat([x.sum(dims), (x * x).sum(dims), count])
        total = allreduce(local, op=Sum, process_set=self.process_set)
        c = x.shape[1]
        n = total[2 * c]
        mean = total[:c] / n
        var = (total[c:2 * c] / n - mean * mean).clamp_min(0)
        if self.training and self.track_running_stats:
            self._update_running(mean.detach(), var.detach(), float(n.detach()))
        shape = [1, c] + [1] * (x.dim() - 2)
        y = (x - mean.view(shape)) * torch.rsqrt(var.view(shape) + self.eps)
        if self.affine:
            y = y * self.weight.view(shape) + self.bias.view(shape)
        return y

    def _update_running(self, mean: torch.Tensor, var: torch.Tensor, n: float) -> None:
        assert self.running_mean is not None and self.running_var is not None
        assert self.num_batches_tracked is not None
        self.num_batches_tracked.add_(1)
        momentum = self.momentum
        if momentum is None:  # cumulative moving average
            momentum = 1.0 / float(self.num_batches_tracked)
        unbiased = var * (n / max(n - 1, 1))
        with torch.no_grad():
            self.running_mean.mul_(1 - momentum).add_(mean * momentum)
            self.running_var.mul_(1 - momentum).add_(unbiased * momentum)
