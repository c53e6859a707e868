"""A Horovod script, unchanged: a CNN on synthetic data, printing img/sec like Horovod's
synthetic benchmark.

It is written for Horovod (``import horovod.torch as hvd``) and runs on hpcdist with no
edit::

    mpirun -np 2 python -m hpcdist.horovod examples/horovod/pytorch_synthetic_benchmark.py
    hpcdist run -np 2 python -m hpcdist.horovod examples/horovod/pytorch_synthetic_benchmark.py
"""

import argparse
import timeit

import horovod.torch as hvd
import numpy as np
import torch
import torch.nn.functional as F  # noqa: N812

parser = argparse.ArgumentParser(description="PyTorch synthetic benchmark (Horovod)")
parser.add_argument("--fp16-allreduce", action="store_true", help="fp16 compression")
parser.add_argument("--no-sync-bn", action="store_true", help="plain BatchNorm per rank")
parser.add_argument("--batch-size", type=int, default=32, help="input batch size")
parser.add_argument("--num-warmup-batches", type=int, default=2)
parser.add_argument("--num-batches-per-iter", type=int, default=5)
parser.add_argument("--num-iters", type=int, default=5)
parser.add_argument("--width", type=int, default=32, help="channels of the first layer")


def make_model(width, sync_bn):
    """A small CNN for 32x32 RGB images, 10 classes."""
    norm = hvd.SyncBatchNorm if sync_bn else torch.nn.BatchNorm2d
    return torch.nn.Sequential(
        torch.nn.Conv2d(3, width, 3, padding=1, bias=False), norm(width), torch.nn.ReLU(),
        torch.nn.Conv2d(width, 2 * width, 3, stride=2, padding=1, bias=False),
        norm(2 * width), torch.nn.ReLU(),
        torch.nn.Conv2d(2 * width, 4 * width, 3, stride=2, padding=1, bias=False),
        norm(4 * width), torch.nn.ReLU(),
        torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(4 * width, 10),
    )


def main(args):
    hvd.init()
    torch.manual_seed(42)
    model = make_model(args.width, sync_bn=not args.no_sync_bn)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01 * hvd.size(), momentum=0.9)
    compression = hvd.Compression.fp16 if args.fp16_allreduce else hvd.Compression.none
    optimizer = hvd.DistributedOptimizer(
        optimizer, named_parameters=model.named_parameters(), compression=compression,
        op=hvd.Average,
    )
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)

    data = torch.randn(args.batch_size, 3, 32, 32)
    target = torch.randint(0, 10, (args.batch_size,))

    def benchmark_step():
        optimizer.zero_grad()
        loss = F.cross_entropy(model(data), target)
        loss.backward()
        optimizer.step()

    def log(s):
        if hvd.rank() == 0:
            print(s, flush=True)

    norm = "BatchNorm" if args.no_sync_bn else "SyncBatchNorm"
    log(f"Model: CNN (width {args.width}, {norm})")
    log(f"Batch size: {args.batch_size}")
    log(f"Number of CPUs: {hvd.size()}")
    log("Running warmup...")
    timeit.timeit(benchmark_step, number=args.num_warmup_batches)
    log("Running benchmark...")
    img_secs = []
    for x in range(args.num_iters):
        t = timeit.timeit(benchmark_step, number=args.num_batches_per_iter)
        img_sec = args.batch_size * args.num_batches_per_iter / t
        log(f"Iter #{x}: {img_sec:.1f} img/sec per CPU")
        img_secs.append(img_sec)
    img_sec_mean = np.mean(img_secs)
    img_sec_conf = 1.96 * np.std(img_secs)
    log(f"Img/sec per CPU: {img_sec_mean:.1f} +-{img_sec_conf:.1f}")
    log(f"Total img/sec on {hvd.size()} CPU(s): {hvd.size() * img_sec_mean:.1f} "
        f"+-{hvd.size() * img_sec_conf:.1f}")
    # every rank holds the same weights after the averaged steps
    weights = torch.cat([p.detach().flatten() for p in model.parameters()])
    gathered = hvd.allgather(weights.unsqueeze(0))
    log(f"Weights equal on every rank: {bool((gathered == gathered[0]).all())}")


if __name__ == "__main__":
    main(parser.parse_args())
