"""Sharded hd.optimizers checkpoints reshard: 2 -> 4 -> 3 -> 1 workers, one mpirun job each.

Each leg loads the previous leg's checkpoint (each worker wrote its slices),
finds the weights and the consolidated slots bitwise equal to the reference
the previous leg gathered, and trains on in step with an unsharded optimizer.
"""

from __future__ import annotations

import json

import pytest

from tests.faults.launch import SCRIPTS, run_mpi

pytestmark = pytest.mark.timeout(600)


def test_round_trip_2_4_3_1(tmp_path) -> None:
    prev = 0
    for n, stage in ((2, "gradients"), (4, "optimizer"), (3, "gradients"), (1, "optimizer")):
        proc = run_mpi(SCRIPTS / "reshard_strategy.py", n, [str(tmp_path), str(prev), stage],
                       timeout=180)
        assert proc.returncode == 0, proc.stdout[-4000:]
        assert f"leg {prev}->{n} ok" in proc.stdout
        manifest = json.loads((tmp_path / f"ckpt-{n}" / "float32" / "manifest.json").read_text())
        assert manifest["world_size"] == n
        prev = n
