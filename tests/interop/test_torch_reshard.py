"""Sharded torch checkpoints reshard: 2 -> 4 -> 3 -> 1 ranks, each leg a fresh mpirun job.

Every leg loads the previous leg's checkpoint (written by each rank in
parallel), finds the parameters and the optimizer state bitwise equal to the
unsharded reference the previous leg gathered, and trains on in step with an
unsharded optimizer started from that state.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.faults.launch import run_mpi

pytestmark = pytest.mark.timeout(600)

SCRIPT = Path(__file__).parent / "scripts" / "reshard_torch.py"


def test_round_trip_2_4_3_1(tmp_path: Path) -> None:
    prev = 0
    # ZeRO-1 and ZeRO-2 write the same format: the legs alternate between them
    for n, stage in ((2, "gradients"), (4, "optimizer"), (3, "gradients"), (1, "optimizer")):
        proc = run_mpi(SCRIPT, n, [str(tmp_path), str(prev), stage], timeout=180)
        assert proc.returncode == 0, proc.stdout[-4000:]
        assert f"leg {prev}->{n} ok" in proc.stdout
        manifest = json.loads((tmp_path / f"ckpt-{n}" / "manifest.json").read_text())
        assert manifest["world_size"] == n
        assert sorted(p.name for p in (tmp_path / f"ckpt-{n}").glob("rank-*")) == [
            f"rank-{r:05d}" for r in range(n)
        ]
        prev = n
    assert "mismatch: CheckpointError" in proc.stdout
