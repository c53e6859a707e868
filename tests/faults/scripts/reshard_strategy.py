"""One leg of the Strategy-path resharding round trip (hd.optimizers, experimental_sharding).

``python reshard_strategy.py WORKDIR PREV STAGE`` under ``mpirun -n N``: loads
``WORKDIR/ckpt-PREV`` (PREV 0: a fresh start), checks the weights and the
consolidated slots bitwise against ``ref-PREV.npz``, trains on next to an
unsharded optimizer started from the same values (they must agree), then
saves ``ckpt-N`` and ``ref-N.npz``.
"""

from __future__ import annotations

import sys

import numpy as np

import hpcdist as hd
from hpcdist.checkpoint import sharded
from hpcdist.nn import Dense, Sequential, backend

GLOBAL = 24


def setup(stage, seed: int):
    strategy = hd.MultiWorkerMirroredStrategy(
        communication_options=hd.experimental.CommunicationOptions(bytes_per_pack=1024),
        experimental_sharding=stage,
    )
    with strategy.scope():
        model = Sequential([Dense(16, activation="tanh", input_shape=(5,)), Dense(3)])
        model.build((None, 5))
        rng = np.random.default_rng(seed)
        model.set_weights([rng.normal(size=w.shape).astype(np.float32) * 0.3
                           for w in model.get_weights()])
        opt = hd.optimizers.Adam(0.01)
        opt.build(model.trainable_variables)
    mse = hd.nn.losses.MeanSquaredError(reduction=hd.nn.losses.Reduction.NONE)
    grad_fn = hd.nn.value_and_grad(
        model, lambda y, p: hd.nn.compute_average_loss(mse(y, p), global_batch_size=GLOBAL)
    )

    def step(batch):
        _, grads = grad_fn(*batch)
        opt.apply_gradients(zip(grads, model.trainable_variables, strict=True))

    def run(first: int, steps: int) -> None:
        rng = np.random.default_rng(77)
        x = rng.normal(size=((first + steps) * GLOBAL, 5)).astype(np.float32)[first * GLOBAL :]
        y = rng.normal(size=((first + steps) * GLOBAL, 3)).astype(np.float32)[first * GLOBAL :]
        dist = strategy.experimental_distribute_dataset(
            hd.data.Dataset.from_tensor_slices((x, y)).batch(GLOBAL)
        )
        for batch in dist:
            strategy.run(step, args=(batch,))

    return model, opt, run


def reference(model, opt) -> dict[str, np.ndarray]:
    out = {f"w/{i}": w for i, w in enumerate(model.get_weights())}
    for name, values in sharded.consolidated_slots(opt).items():
        out.update({f"s/{name}/{i}": v for i, v in enumerate(values)})
    out["iterations"] = np.asarray(int(opt.iterations.numpy()))
    return out


def main() -> None:
    workdir, prev, stage = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    backend.set_floatx("float32")
    w = hd.world()
    if prev == 0:
        model, opt, run = setup(stage, seed=1)
        run(0, 4)
    else:
        model, opt, run = setup(stage, seed=100 + w.size)  # another start: the load replaces it
        sharded.load_optimizer(f"{workdir}/ckpt-{prev}", opt)
        want = np.load(f"{workdir}/ref-{prev}.npz", allow_pickle=False)
        got = reference(model, opt)
        assert sorted(got) == sorted(want.files), (sorted(got), want.files)
        for key in want.files:
            assert got[key].tobytes() == want[key].tobytes(), f"{key} differs after resharding"
        start = int(want["iterations"])
        twin, twin_opt, twin_run = setup(None, seed=5)  # unsharded, from the loaded values
        twin.set_weights(model.get_weights())
        for name, values in sharded.consolidated_slots(opt).items():
            for v, value in zip(twin_opt._order, values, strict=True):
                twin_opt.get_slot(v, name).assign(value)
        twin_opt.iterations.assign(np.int64(start))
        run(start, 3)
        twin_run(start, 3)
        for a, b in zip(model.get_weights(), twin.get_weights(), strict=True):
            rel = float(np.max(np.abs(a - b)) / np.max(np.abs(b)))
            assert rel <= 1e-6, rel
    sharded.save_optimizer(f"{workdir}/ckpt-{w.size}", opt)
    ref = reference(model, opt)
    if w.rank == 0:
        np.savez(f"{workdir}/ref-{w.size}.npz", **ref)
    w.comm.Barrier()
    print(f"leg {prev}->{w.size} ok")


if __name__ == "__main__":
    main()
