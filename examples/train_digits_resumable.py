"""The digits MLP in a custom loop that survives preemption: checkpoint on a signal, resume.

Run it as ``mpirun -n 2 python examples/train_digits_resumable.py --checkpoint-dir ckpt``
or through ``slurm/requeue.sbatch``. When any rank gets ``SIGTERM`` or
``SIGUSR1`` (``scancel --signal=USR1 <job>``, or SLURM's ``--signal=USR1@90``
before the time limit), every rank saves a checkpoint at the same step and the
job exits with status ``PREEMPTION_EXIT_CODE`` (42); started again with the
same ``--checkpoint-dir`` it goes on from that step. The resumed run ends with
the same parameters, bit for bit, as one that was never stopped: the model
and the optimizer (Adam's moments and step count) are in the checkpoint, the
handler's run counter says which step comes next, and the order of the
examples is a function of (seed, epoch) alone. ``--save-params out.npz``
writes the final weights for such a comparison.
"""

from __future__ import annotations

import argparse
import sys
import time
from functools import lru_cache

import numpy as np
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split

import hpcdist as hd
from hpcdist.arrays import to_host
from hpcdist.checkpoint import Checkpoint, CheckpointManager
from hpcdist.checkpoint.preemption import (
    PREEMPTION_EXIT_CODE,
    PreemptionCheckpointHandler,
    TerminationConfig,
)
from hpcdist.nn import Dense, Sequential


def load(seed: int) -> tuple[np.ndarray, ...]:
    """Digits as float32 pixels in [0, 1], split 80/20 into train and test (stratified)."""
    digits = load_digits()
    x = (digits.data / 16.0).astype(np.float32)
    y = digits.target.astype(np.int64)
    return tuple(train_test_split(x, y, test_size=0.2, random_state=seed, stratify=y))


def parse(argv: list[str] | None) -> argparse.Namespace:
    """The command line options."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoint-dir", required=True, help="where to save and resume from")
    parser.add_argument("--epochs", type=int, default=20)
    parser.add_argument("--batch-size", type=int, default=64, help="global batch size")
    parser.add_argument("--learning-rate", type=float, default=2e-3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--save-params", help="write the final weights to this .npz (chief)")
    parser.add_argument("--min-accuracy", type=float, default=0.0)
    parser.add_argument(
        "--sleep-per-step",
        type=float,
        default=0.0,
        help="seconds to wait after each step: stretches a demo (or test) job so that "
        "there is time to signal it; the results do not change",
    )
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    x_train, x_test, y_train, y_test = load(args.seed)
    np.random.seed(args.seed)  # the initial weights (worker 0's are broadcast to all)
    strategy = hd.MultiWorkerMirroredStrategy()
    chief = strategy.extended.should_checkpoint
    replicas = strategy.num_replicas_in_sync
    batch = args.batch_size
    with strategy.scope():
        model = Sequential(
            [
                Dense(128, activation="relu", input_shape=(64,)),
                Dense(64, activation="relu"),
                Dense(10),
            ]
        )
        optimizer = hd.optimizers.Adam(learning_rate=args.learning_rate)
        loss_object = hd.nn.losses.SparseCategoricalCrossentropy(
            from_logits=True, reduction=hd.nn.losses.Reduction.NONE
        )

    def compute_loss(labels, logits):
        per_example = loss_object(labels, logits)
        return hd.nn.compute_average_loss(per_example, global_batch_size=batch)

    grad_fn = hd.nn.value_and_grad(model, compute_loss)

    def train_step(x, y):
        loss, grads = grad_fn(x, y)
        optimizer.apply_gradients(zip(grads, model.trainable_variables, strict=True))
        return loss

    def distributed_train_step(rows: np.ndarray):
        # Replica r of the global batch takes its r-th contiguous part.
        parts = np.array_split(rows, replicas)
        x = strategy.experimental_distribute_values_from_function(
            lambda ctx: x_train[parts[ctx.replica_id_in_sync_group]]
        )
        y = strategy.experimental_distribute_values_from_function(
            lambda ctx: y_train[parts[ctx.replica_id_in_sync_group]]
        )
        per_replica = strategy.run(train_step, args=(x, y))
        return strategy.reduce(hd.ReduceOp.SUM, per_replica, axis=None)

    # Every epoch's order comes from (seed, epoch) only: a resumed run sees the same batches.
    @lru_cache(maxsize=2)
    def order(epoch: int) -> np.ndarray:
        return np.random.default_rng([args.seed, epoch]).permutation(len(x_train))

    checkpoint = Checkpoint(model=model, optimizer=optimizer)
    manager = CheckpointManager(checkpoint, args.checkpoint_dir, max_to_keep=2)

    def preempted() -> None:  # called on every worker after the checkpoint is saved
        if chief:
            print(
                f"preempted: saved {manager.latest_checkpoint} at step "
                f"{handler.total_run_calls}; exiting with status {PREEMPTION_EXIT_CODE}",
                flush=True,
            )
        sys.exit(PREEMPTION_EXIT_CODE)

    # Restores the newest checkpoint of the directory (model, optimizer, step count) if any,
    # and from now on saves one and calls preempted() when any rank gets SIGTERM or SIGUSR1.
    handler = PreemptionCheckpointHandler(
        strategy.cluster_resolver, manager, termination_config=TerminationConfig(exit_fn=preempted)
    )
    steps_per_epoch = len(x_train) // batch  # whole batches only: every step is the same size
    total_steps = args.epochs * steps_per_epoch
    if chief:
        done = handler.total_run_calls
        if done:
            print(f"resumed from {manager.latest_checkpoint} at step {done}/{total_steps}")
        else:
            print(f"no checkpoint in {args.checkpoint_dir}: starting at step 0/{total_steps}")
        print(
            f"digits: {len(x_train)} train / {len(x_test)} test examples, {replicas} replicas, "
            f"global batch {batch}, {steps_per_epoch} steps per epoch",
            flush=True,
        )
    start = time.perf_counter()
    losses: list[float] = []  # this epoch's (after a resume: only the steps run since)
    with handler.watch_preemption_scope():
        while handler.total_run_calls < total_steps:
            epoch, step = divmod(handler.total_run_calls, steps_per_epoch)
            rows = order(epoch)[step * batch : (step + 1) * batch]
            losses.append(float(handler.run(distributed_train_step, rows)))
            if args.sleep_per_step:
                time.sleep(args.sleep_per_step)
            if step == steps_per_epoch - 1:
                if chief:
                    print(f"epoch {epoch + 1}/{args.epochs}: loss {np.mean(losses):.4f}")
                losses = []
    handler.close()

    logits = to_host(model(x_test))
    accuracy = float(np.mean(np.argmax(logits, axis=1) == y_test))
    if chief:
        print(f"test accuracy: {accuracy:.4f}")
        print(f"wall time: {time.perf_counter() - start:.2f} s")
        if args.save_params:
            weights = {f"w{i}": w for i, w in enumerate(model.get_weights())}
            weights["iterations"] = np.asarray(int(optimizer.iterations.numpy()))
            np.savez(args.save_params, **weights)
            print(f"saved the final parameters to {args.save_params}")
    if accuracy < args.min_accuracy:
        print(f"test accuracy {accuracy:.4f} < --min-accuracy {args.min_accuracy}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
