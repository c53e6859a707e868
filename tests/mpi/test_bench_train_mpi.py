"""``hpcdist bench train`` on real ranks: per-rank and total samples/sec in its JSON."""

from __future__ import annotations

import json
import tempfile

import pytest

from hpcdist.bench import train
from hpcdist.runtime import world

pytestmark = [pytest.mark.mpi(min_size=2), pytest.mark.timeout(120)]


def test_bench_train_mlp_writes_per_rank_and_total_throughput():
    w = world()
    out = w.comm.bcast(tempfile.mkdtemp() if w.rank == 0 else None)
    assert train.main(["--iters", "3", "--batches-per-iter", "2", "--warmup", "1",
                       "--features", "16", "--hidden", "32", "--out", out, "--name", "t"]) == 0
    w.comm.Barrier()
    if w.rank == 0:
        result = json.loads(open(f"{out}/t.json").read())
        assert result["ranks"] == w.size and result["global_batch"] == 64 * w.size
        per_rank = result["samples_per_s_per_rank"]
        assert len(per_rank) == w.size and all(v > 0 for v in per_rank)
        total = result["samples_per_s_total"]["mean"]
        assert total == pytest.approx(sum(per_rank), rel=1e-9)
