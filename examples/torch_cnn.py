"""A PyTorch CNN on scikit-learn's digits, distributed with hpcdist.torch.

Run it as ``mpirun -n 2 python examples/torch_cnn.py`` (or plain ``python`` on
one rank). Each rank trains one replica of the same small CNN on its 1/N share
of every global batch; ``hdt.DistributedOptimizer`` averages the gradients over
the ranks (bucket by bucket, while backward runs) and ``broadcast_parameters``
gives every rank rank 0's start weights. The digits (8x8 images) ship with
scikit-learn, so nothing is downloaded. ``--min-accuracy`` fails the run when
the test accuracy is lower.
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np
import torch
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split

import hpcdist.torch as hdt
from hpcdist.runtime import world


def load(seed: int) -> tuple[torch.Tensor, ...]:
    """Digits as 1x8x8 float32 images in [0, 1], split 80/20 into train and test."""
    digits = load_digits()
    x = (digits.images / 16.0).astype(np.float32)[:, None]
    y = digits.target.astype(np.int64)
    parts = train_test_split(x, y, test_size=0.2, random_state=seed, stratify=y)
    return tuple(torch.from_numpy(p) for p in parts)


def cnn() -> torch.nn.Module:
    return torch.nn.Sequential(
        torch.nn.Conv2d(1, 16, 3, padding=1), torch.nn.ReLU(),
        torch.nn.Conv2d(16, 32, 3, padding=1), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
        torch.nn.Flatten(), torch.nn.Linear(32 * 4 * 4, 64), torch.nn.ReLU(),
        torch.nn.Linear(64, 10),
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=12)
    parser.add_argument("--batch-size", type=int, default=64, help="global batch size")
    parser.add_argument("--learning-rate", type=float, default=3e-3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--min-accuracy", type=float, default=0.0)
    args = parser.parse_args(argv)

    w = world()
    torch.manual_seed(args.seed + w.rank)  # different on every rank until the broadcast
    x_train, x_test, y_train, y_test = load(args.seed)
    model = cnn()
    optimizer = hdt.DistributedOptimizer(
        torch.optim.Adam(model.parameters(), lr=args.learning_rate), model=model
    )
    hdt.broadcast_parameters(model, root=0)
    hdt.broadcast_optimizer_state(optimizer, root=0)
    if w.rank == 0:
        print(f"digits: {len(x_train)} train / {len(x_test)} test, {w.size} ranks, "
              f"global batch {args.batch_size}")
    local = args.batch_size // w.size
    start = time.perf_counter()
    for epoch in range(args.epochs):
        order = torch.randperm(len(x_train), generator=torch.Generator().manual_seed(epoch))
        model.train()
        total = torch.zeros(2, dtype=torch.float64)
        for first in range(0, len(order) - args.batch_size + 1, args.batch_size):
            mine = order[first + w.rank * local : first + (w.rank + 1) * local]
            optimizer.zero_grad()
            loss = torch.nn.functional.cross_entropy(model(x_train[mine]), y_train[mine])
            loss.backward()
            optimizer.step()
            total += torch.tensor([loss.item() * len(mine), len(mine)], dtype=torch.float64)
        total = hdt.allreduce(total, "SUM")
        if w.rank == 0:
            print(f"epoch {epoch + 1}: loss {total[0] / total[1]:.4f}")
    model.eval()
    with torch.no_grad():
        mine = slice(w.rank, None, w.size)  # each rank scores every N-th test example
        right = (model(x_test[mine]).argmax(1) == y_test[mine]).sum().double()
        seen = torch.tensor(len(y_test[mine]), dtype=torch.float64)
    counts = hdt.allreduce(torch.stack([right, seen]), "SUM")
    accuracy = float(counts[0] / counts[1])
    if w.rank == 0:
        print(f"test accuracy: {accuracy:.4f}")
        print(f"wall time: {time.perf_counter() - start:.2f} s")
    if accuracy < args.min_accuracy:
        print(f"test accuracy {accuracy:.4f} is below --min-accuracy {args.min_accuracy}",
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
