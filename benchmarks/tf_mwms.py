"""Keras ``model.fit`` with hpcdist against TensorFlow's MultiWorkerMirroredStrategy, side by side.

Under ``mpirun -n 2`` every rank is both a TF worker (``TF_CONFIG`` built from
the MPI rank, gRPC on localhost, ring all-reduce; MultiWorkerMirroredStrategy
has to be made before any other TF work) and an hpcdist replica. The same Keras
model (the 2.9 M-parameter MLP of ``benchmarks/train_throughput.py``, SGD with
momentum, 256 synthetic examples per rank and step) trains in alternating
rounds with the same ``tf.function`` train step: under MWMS (``strategy.run``,
the optimizer reducing with TF's collective ops), then with hpcdist
(``hdtf.DistributedGradientTape``), again and again; steps/s are the medians of
the rounds. (Keras 3's ``model.fit`` under MWMS fails here with "Attempt to
convert a value (PerReplica...)", so both sides use the custom loop TF's guide
gives for MWMS.) Target: hpcdist >= 2x MWMS.

Run: ``mpirun -n 2 python benchmarks/tf_mwms.py [--rounds 5] [--steps 10]``;
results in ``benchmarks/results/tf_mwms.json`` and ``.png``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMBA_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

from mpi4py import MPI  # noqa: E402

TARGET = 2.0


def _tf_config(comm: Any) -> None:
    import socket

    with socket.socket() as s:  # a free port on this host for every rank
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ports = comm.allgather(port)
    os.environ["TF_CONFIG"] = json.dumps({
        "cluster": {"worker": [f"127.0.0.1:{p}" for p in ports]},
        "task": {"type": "worker", "index": comm.Get_rank()},
    })


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--batch", type=int, default=256, help="examples per rank")
    args = p.parse_args()
    comm = MPI.COMM_WORLD
    if comm.Get_size() < 2:
        print("run under mpirun -n 2 (or more)", file=sys.stderr)
        return 2
    _tf_config(comm)
    import tensorflow as tf

    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    mwms = tf.distribute.MultiWorkerMirroredStrategy()  # before any other TF work
    import keras
    import numpy as np
    from common import RESULTS, pyplot, save_report

    import hpcdist.tensorflow as hdtf

    rank, size = comm.Get_rank(), comm.Get_size()

    def build() -> keras.Model:
        keras.utils.set_random_seed(0)
        model = keras.Sequential([keras.Input((784,))] + [
            keras.layers.Dense(1024, activation="relu") for _ in range(3)
        ] + [keras.layers.Dense(10)])
        return model

    rng = np.random.default_rng(rank)
    x = rng.normal(size=(args.batch * size, 784)).astype(np.float32)
    y = rng.integers(0, 10, size=args.batch * size)
    loss = keras.losses.SparseCategoricalCrossentropy(
        from_logits=True, reduction=None
    )

    def make_step(model: keras.Model, opt: Any, distributed: bool) -> Any:
        def step(xb: Any, yb: Any) -> None:
            with tf.GradientTape() as tape:
                per_example = loss(yb, model(xb, training=True))
                value = tf.reduce_mean(per_example)
            if distributed:
                tape = hdtf.DistributedGradientTape(tape)
            grads = tape.gradient(value, model.trainable_variables)
            opt.apply_gradients(zip(grads, model.trainable_variables, strict=True))
        return step

    # TF: the train step under MultiWorkerMirroredStrategy (Keras 3's optimizer sums the
    # replicas' gradients with the strategy's collective ops; the loss is divided by the
    # global batch as TF's custom-loop guide says).
    with mwms.scope():
        tf_model = build()
        tf_opt = keras.optimizers.SGD(0.01, momentum=0.9)
        tf_opt.build(tf_model.trainable_variables)

    def mwms_step(xb: Any, yb: Any) -> None:
        with tf.GradientTape() as tape:
            per_example = loss(yb, tf_model(xb, training=True))
            value = tf.nn.compute_average_loss(per_example, global_batch_size=args.batch * size)
        grads = tape.gradient(value, tf_model.trainable_variables)
        tf_opt.apply_gradients(zip(grads, tf_model.trainable_variables, strict=True))

    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
    global_ds = tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(args.batch * size)
    tf_iter = iter(mwms.experimental_distribute_dataset(global_ds.with_options(options)))

    @tf.function
    def tf_train(iterator: Any) -> None:
        mwms.run(mwms_step, args=next(iterator))

    # hpcdist: the same model and optimizer, the gradients averaged by DistributedGradientTape.
    hd_model = build()
    hd_opt = keras.optimizers.SGD(0.01, momentum=0.9)
    hd_step = tf.function(make_step(hd_model, hd_opt, True))
    xb, yb = tf.constant(x[: args.batch]), tf.constant(y[: args.batch])

    alone = build()  # the ceiling: the same step with no communication at all
    alone_opt = keras.optimizers.SGD(0.01, momentum=0.9)
    alone_step = tf.function(make_step(alone, alone_opt, False))

    def fit_alone(steps: int) -> None:
        for _ in range(steps):
            alone_step(xb, yb)
        float(alone.trainable_variables[0][0, 0])

    def fit_mwms(steps: int) -> None:
        for _ in range(steps):
            tf_train(tf_iter)

    def fit_hpcdist(steps: int) -> None:
        for _ in range(steps):
            hd_step(xb, yb)
        float(hd_model.trainable_variables[0][0, 0])  # wait for the last step

    runs = {"tf_mwms": fit_mwms, "hpcdist": fit_hpcdist, "compute_only": fit_alone}
    for fit in runs.values():
        fit(2)  # compile the train step
    times: dict[str, list[float]] = {k: [] for k in runs}
    for _ in range(args.rounds):
        for key, fit in runs.items():
            comm.Barrier()
            start = time.perf_counter()
            fit(args.steps)
            comm.Barrier()
            times[key].append((time.perf_counter() - start) / args.steps)
    med = {k: float(np.median(v)) for k, v in times.items()}
    ratio = med["tf_mwms"] / med["hpcdist"]
    report = {
        "ranks": size, "tensorflow": tf.__version__, "keras": keras.__version__,
        "parameters": int(hd_model.count_params()), "batch_per_rank": args.batch,
        "loop": "custom tf.function train step (GradientTape + SGD momentum) on both sides",
        "rounds": args.rounds, "steps_per_round": args.steps,
        "step_s": med, "steps_per_s": {k: 1.0 / v for k, v in med.items()},
        "rounds_step_s": times, "ratio_vs_mwms": ratio, "target_vs_mwms": TARGET,
        "ceiling_ratio_vs_mwms": med["tf_mwms"] / med["compute_only"],
    }
    if rank == 0:
        print(f"{'':<24}{'steps/s':>10}")
        for k in runs:
            print(f"{k:<24}{1.0 / med[k]:>10.2f}")
        print(f"hpcdist / TF MWMS: {ratio:.2f}x (target >= {TARGET}x); with no communication "
              f"at all: {med['tf_mwms'] / med['compute_only']:.2f}x")
        save_report("tf_mwms", report)
        plt = pyplot()
        if plt is not None:
            fig, ax = plt.subplots(figsize=(5, 3.2))
            ax.bar(["TF MultiWorkerMirrored", "hpcdist (Keras fit)"],
                   [1.0 / med["tf_mwms"], 1.0 / med["hpcdist"]], color=["#999999", "#1f77b4"])
            ax.set_ylabel("steps/s (median of rounds)")
            ax.set_title(f"Keras MLP, {size} ranks: {ratio:.2f}x (target {TARGET}x)")
            fig.tight_layout()
            fig.savefig(RESULTS / "tf_mwms.png", dpi=100)
    return 0


if __name__ == "__main__":
    sys.exit(main())
