"""MultiWorkerMirroredStrategy collectives on CuPy arrays, one GPU replica per rank.

Usage: ``mpirun -n 2 python mwms_allreduce.py {nccl|staged}``.

* ``nccl``: ``implementation="NCCL"``, each rank on its own GPU (the launcher
  gives the job ``CUDA_VISIBLE_DEVICES=0,1``); the route must be ``nccl``.
* ``staged``: ``implementation="MPI"`` with ``HPCDIST_CUDA_AWARE_MPI=0`` and
  ``HPCDIST_ALLOW_SHARED_GPUS=1``, both ranks on GPU 0; the route must be
  ``staged`` (pinned host buffers and the host MPI path).

Each replica all-reduces (SUM and MEAN) a float32 and an int32 CuPy array and
all-gathers a float32 one, checks the values, types and devices against
NumPy, and prints one JSON line ``RESULT {...}``. A wrong result raises, so
the job fails.
"""

from __future__ import annotations

import json
import sys

import cupy as cp
import numpy as np

import hpcdist as hd
from hpcdist.runtime import world


def _check(name: str, got: object, expected: np.ndarray, device: int) -> None:
    if type(got) is not cp.ndarray:
        raise AssertionError(f"{name}: expected a CuPy array, got {type(got).__name__}")
    if got.device.id != device:
        raise AssertionError(f"{name}: on GPU {got.device.id}, expected GPU {device}")
    if got.shape != expected.shape or got.dtype != expected.dtype:
        raise AssertionError(
            f"{name}: {got.dtype}{got.shape}, expected {expected.dtype}{expected.shape}"
        )
    np.testing.assert_array_equal(got.get(), expected, err_msg=name)


def main(mode: str) -> None:
    if mode not in ("nccl", "staged"):
        raise SystemExit(f"mode is {mode!r}; expected 'nccl' or 'staged'")
    implementation = "NCCL" if mode == "nccl" else "MPI"
    options = hd.experimental.CommunicationOptions(implementation=implementation)
    strategy = hd.MultiWorkerMirroredStrategy(communication_options=options)
    rank, size = world().rank, world().size
    routes: list[str | None] = []
    collectives = strategy.extended._collectives
    weights = np.arange(1, size + 1)  # replica r contributes r + 1

    def replica_fn() -> dict:
        ctx = hd.get_replica_context()
        r = ctx.replica_id_in_sync_group
        device = cp.cuda.Device().id
        x = cp.full((1000, 3), r + 1, cp.float32)
        y = cp.arange(10, dtype=cp.int32) * (r + 1)
        summed = ctx.all_reduce(hd.ReduceOp.SUM, [x, y])
        routes.append(collectives.last_device_route)
        mean = ctx.all_reduce(hd.ReduceOp.MEAN, [x, y])
        routes.append(collectives.last_device_route)
        gathered = ctx.all_gather(cp.full((2, 3), r, cp.float32), axis=0)
        routes.append(collectives.last_device_route)
        cp.cuda.get_current_stream().synchronize()
        _check("SUM x", summed[0], np.full((1000, 3), weights.sum(), np.float32), device)
        _check("SUM y", summed[1], np.arange(10, dtype=np.int32) * weights.sum(), device)
        _check("MEAN x", mean[0], np.full((1000, 3), weights.mean(), np.float32), device)
        _check("MEAN y", mean[1], np.arange(10) * weights.mean(), device)  # float64
        _check("gather", gathered, np.repeat(np.arange(size, dtype=np.float32), 6)
               .reshape(2 * size, 3), device)  # fmt: skip
        return {"device": device}

    out = strategy.run(replica_fn)
    expected_route = "nccl" if mode == "nccl" else "staged"
    if set(routes) != {expected_route}:
        raise AssertionError(f"routes {routes}; expected {expected_route} for every call")
    line = {"rank": rank, "size": size, "mode": mode, "routes": routes, "device": out["device"]}
    print("RESULT " + json.dumps(line), flush=True)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "nccl")
