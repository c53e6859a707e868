"""Training steps per second on the GPU under MultiWorkerMirroredStrategy, and on the CPU.

One process, in one run, each model trained with a custom loop
(``hd.nn.value_and_grad`` + ``Adam.apply_gradients`` inside ``strategy.run``)
on synthetic data that stays where the model is (CuPy arrays on the GPU):

* ``digits``: the digits-size MLP, 64 inputs, 64 hidden (relu), 10 classes,
  batch 64, on the GPU (``devices=["/gpu:0"]``) and on the CPU (NumPy,
  ``devices=["/cpu:0"]``, one BLAS thread), and the GPU/CPU ratio;
* ``large``: 1024 inputs, 4 hidden layers of 4096 (relu), 10 classes,
  batch 1024, on the GPU only (a CPU step takes seconds).

Then ``fit`` of the digits MLP (scikit-learn's digits, 64-128-64-10, SGD with
momentum, ``--fit-epochs`` epochs of batch 64, no shuffling) on
``MirroredStrategy(["/gpu:0"])`` (CuPy replicas) and on ``["/cpu:0"]`` from the
same initial weights: the largest relative difference of the per-epoch losses
and of the final weights (``max|gpu - cpu| / max|cpu|`` per array), against the
target of 1e-5 relative on the losses (reported PASS/FAIL).

Each measurement is ``--steps`` steps after ``--warmup`` untimed ones, the GPU
waited for at the end; ``--rounds`` rounds, the median reported.

Writes ``benchmarks/results/gpu_training.json``. Exits with code 2, measuring
nothing, when no GPU is usable.

Run: ``python benchmarks/gpu_training.py [--steps 50] [--rounds 3]``.
"""

from __future__ import annotations

import os

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMBA_NUM_THREADS"):
    os.environ.setdefault(_var, "1")  # the CPU figure is one core's

import argparse  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from typing import Any  # noqa: E402

import numpy as np  # noqa: E402
from gpu_common import (  # noqa: E402  (benchmarks/ is on sys.path when run as a script)
    RESULTS,
    format_table,
    machine_info,
    require_gpu,
    write_report,
)

PROG = "gpu_training"

#: name -> (features, hidden width, hidden layers, classes, batch)
MODELS = {
    "digits": (64, 64, 1, 10, 64),
    "large": (1024, 4096, 4, 10, 1024),
}


def build_model(features: int, hidden: int, layers: int, classes: int) -> Any:
    """The MLP: ``layers`` relu layers of ``hidden`` units, then ``classes`` logits."""
    from hpcdist.nn import Dense, Sequential

    stack = [Dense(hidden, activation="relu", input_shape=(features,))]
    stack += [Dense(hidden, activation="relu") for _ in range(layers - 1)]
    return Sequential([*stack, Dense(classes)])


def synthetic(model: str, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """One batch of random inputs (float32) and labels (int64) for ``model``.

    Example: ``x, y = synthetic("digits")`` gives shapes ``(64, 64)`` and ``(64,)``.
    """
    features, _, _, classes, batch = MODELS[model]
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((batch, features)).astype(np.float32)
    y = rng.integers(0, classes, size=batch).astype(np.int64)
    return x, y


def steps_per_second(
    strategy: Any, model_name: str, x: Any, y: Any, steps: int, warmup: int, sync: Any
) -> dict[str, float]:
    """Train ``model_name`` for ``warmup + steps`` steps under ``strategy``; time the last.

    ``sync()`` waits for the device (a no-op on the CPU). Returns steps/s, ms per step,
    examples/s, the parameter count and the last loss.
    """
    import hpcdist as hd
    from hpcdist.nn.losses import Reduction, SparseCategoricalCrossentropy

    features, hidden, layers, classes, batch = MODELS[model_name]
    global_batch = batch * strategy.num_replicas_in_sync
    with strategy.scope():
        model = build_model(features, hidden, layers, classes)
        optimizer = hd.optimizers.Adam(1e-3)
        loss_object = SparseCategoricalCrossentropy(from_logits=True, reduction=Reduction.NONE)

    def compute_loss(labels: Any, logits: Any) -> Any:
        return hd.nn.compute_average_loss(
            loss_object(labels, logits), global_batch_size=global_batch
        )

    grad_fn = hd.nn.value_and_grad(model, compute_loss)

    def step(xb: Any, yb: Any) -> Any:
        loss, grads = grad_fn(xb, yb)
        optimizer.apply_gradients(zip(grads, model.trainable_variables, strict=True))
        return loss

    loss = None
    for _ in range(warmup):
        loss = strategy.run(step, args=(x, y))
    sync()
    start = time.perf_counter()
    for _ in range(steps):
        loss = strategy.run(step, args=(x, y))
    sync()
    elapsed = time.perf_counter() - start
    value = loss.get() if hasattr(loss, "get") else np.asarray(loss)
    return {
        "steps_per_s": steps / elapsed,
        "ms_per_step": elapsed / steps * 1e3,
        "examples_per_s": steps * global_batch / elapsed,
        "params": int(sum(int(np.prod(v.shape)) for v in model.trainable_variables)),
        "last_loss": float(value),
    }


FIT_TARGET_RELATIVE = 1e-5


def fit_digits(devices: list[str], weights: list[np.ndarray] | None, epochs: int) -> tuple:
    """``(initial weights, final weights, loss per epoch)`` of ``fit`` on the digits MLP."""
    from sklearn.datasets import load_digits

    import hpcdist as hd
    from hpcdist.nn import Dense, Sequential
    from hpcdist.nn.losses import SparseCategoricalCrossentropy

    d = load_digits()
    x, y = (d.data / 16.0).astype(np.float32), d.target.astype(np.int64)
    strategy = hd.MirroredStrategy(devices)
    with strategy.scope():
        model = Sequential([Dense(128, activation="relu", input_shape=(64,)),
                            Dense(64, activation="relu"), Dense(10)])
        if weights is not None:
            model.set_weights(weights)
        model.compile(optimizer=hd.optimizers.SGD(learning_rate=0.05, momentum=0.9),
                      loss=SparseCategoricalCrossentropy(from_logits=True))
    start = model.get_weights()
    history = model.fit(x, y, batch_size=64, epochs=epochs, shuffle=False, verbose=0)
    return start, model.get_weights(), [float(v) for v in history.history["loss"]]


def fit_vs_cpu(epochs: int) -> dict[str, Any]:
    """The fit comparison of the module docstring, as a JSON-able dict."""
    np.random.seed(0)
    start, cpu_w, cpu_loss = fit_digits(["/cpu:0"], None, epochs)
    _, gpu_w, gpu_loss = fit_digits(["/gpu:0"], start, epochs)
    loss_rel = max(abs(g - c) / abs(c) for g, c in zip(gpu_loss, cpu_loss, strict=True))
    weight_rel = max(
        float(np.max(np.abs(np.asarray(g, np.float64) - c)) / max(float(np.max(np.abs(c))), 1e-30))
        for g, c in zip(gpu_w, cpu_w, strict=True)
    )
    return {
        "model": "digits MLP 64-128-64-10, SGD(0.05, momentum=0.9), batch 64, no shuffle",
        "epochs": epochs,
        "cpu_loss": cpu_loss,
        "gpu_loss": gpu_loss,
        "max_relative_loss_difference": loss_rel,
        "max_relative_weight_difference": weight_rel,
        "target_relative": FIT_TARGET_RELATIVE,
        "verdict": "PASS" if loss_rel <= FIT_TARGET_RELATIVE else "FAIL",
    }


def median_of(rounds: list[dict[str, float]]) -> dict[str, float]:
    """The per-key median of several rounds' results (``params`` taken from the first).

    Example: ``median_of([{"steps_per_s": 1.0, "params": 3}, {"steps_per_s": 3.0,
    "params": 3}])["steps_per_s"] == 2.0``.
    """
    out = {k: statistics.median(r[k] for r in rounds) for k in rounds[0] if k != "params"}
    if "params" in rounds[0]:
        out["params"] = rounds[0]["params"]
    return out


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=f"python benchmarks/{PROG}.py",
        description=("MultiWorkerMirroredStrategy training steps/s on the GPU and the CPU"),
    )
    parser.add_argument("--steps", type=int, default=50, help="timed steps per round")
    parser.add_argument("--warmup", type=int, default=5, help="untimed steps first")
    parser.add_argument("--rounds", type=int, default=3, help="rounds (median reported)")
    parser.add_argument("--fit-epochs", type=int, default=2, help="epochs of the fit comparison")
    parser.add_argument("--out", default=str(RESULTS), help="folder for the JSON")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.steps < 1 or args.warmup < 1 or args.rounds < 1 or args.fit_epochs < 1:
        raise SystemExit(f"{PROG}: --steps, --warmup, --rounds and --fit-epochs must be at least 1")
    cp = require_gpu(PROG)
    import hpcdist as hd

    gpu = hd.MultiWorkerMirroredStrategy(devices=["/gpu:0"])
    cpu = hd.MultiWorkerMirroredStrategy(devices=["/cpu:0"])

    def gpu_sync() -> None:
        cp.cuda.Device(0).synchronize()

    cases = [("digits", "GPU", gpu), ("digits", "CPU", cpu), ("large", "GPU", gpu)]
    data: dict[tuple[str, str], tuple[Any, Any]] = {}
    for name, where, _ in cases:
        x, y = synthetic(name)
        if where == "GPU":
            with cp.cuda.Device(0):
                x, y = cp.asarray(x), cp.asarray(y)
        data[name, where] = (x, y)
    results: dict[tuple[str, str], list[dict]] = {(n, w): [] for n, w, _ in cases}
    for _ in range(args.rounds):  # the cases in turn, every round
        for name, where, strategy in cases:
            x, y = data[name, where]
            sync = gpu_sync if where == "GPU" else (lambda: None)
            results[name, where].append(
                steps_per_second(strategy, name, x, y, args.steps, args.warmup, sync)
            )
    rows = []
    for name, where, _ in cases:
        features, hidden, layers, classes, batch = MODELS[name]
        rows.append(
            {
                "model": name,
                "layers": f"{features}-" + "-".join([str(hidden)] * layers) + f"-{classes}",
                "batch": batch,
                "device": where,
                **median_of(results[name, where]),
            }
        )
    by = {(r["model"], r["device"]): r for r in rows}
    speedup = by["digits", "GPU"]["steps_per_s"] / by["digits", "CPU"]["steps_per_s"]
    info = machine_info(cp, 0)
    print(
        f"{info['gpu']}: MultiWorkerMirroredStrategy, 1 worker, median of {args.rounds} "
        f"rounds of {args.steps} steps"
    )
    headers = ["model", "layers", "batch", "device", "params", "steps/s", "ms/step", "examples/s"]
    print(
        format_table(
            headers,
            [
                [
                    r["model"],
                    r["layers"],
                    r["batch"],
                    r["device"],
                    r["params"],
                    f"{r['steps_per_s']:.1f}",
                    f"{r['ms_per_step']:.2f}",
                    f"{r['examples_per_s']:.0f}",
                ]
                for r in rows
            ],
        )
    )
    print(f"digits MLP, GPU steps/s over CPU steps/s: {speedup:.2f}")
    fit = fit_vs_cpu(args.fit_epochs)
    print(
        f"fit on MirroredStrategy (GPU) vs CPU: losses differ by at most "
        f"{fit['max_relative_loss_difference']:.2e} relative (target "
        f"{FIT_TARGET_RELATIVE:.0e}: {fit['verdict']}), weights by "
        f"{fit['max_relative_weight_difference']:.2e}"
    )
    report = {
        "benchmark": "MultiWorkerMirroredStrategy training steps/s, GPU (CuPy) and CPU (NumPy)",
        "command": "python benchmarks/gpu_training.py " + " ".join(argv or sys.argv[1:]),
        "machine": info,
        "optimizer": "Adam(1e-3)",
        "steps": args.steps,
        "warmup": args.warmup,
        "rounds": args.rounds,
        "rows": rows,
        "digits_gpu_over_cpu_steps_per_s": speedup,
        "fit_vs_cpu": fit,
    }
    path = write_report(PROG, report, args.out)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
