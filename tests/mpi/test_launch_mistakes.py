"""Launch mistakes found when a strategy starts: every rank raises the same clear error."""

from __future__ import annotations

import pytest

import hpcdist.distribute.multi_worker as mw
from hpcdist.errors import LaunchError


@pytest.mark.mpi(min_size=2)
def test_two_ranks_on_one_gpu_raise_on_every_rank(monkeypatch):
    monkeypatch.setattr(mw, "_physical_gpus", lambda local: ["0"])
    monkeypatch.setattr(mw.mpi(), "Get_processor_name", lambda: "node-a", raising=False)
    with pytest.raises(LaunchError, match=r"ranks 0, 1.* on host node-a all use GPU 0"):
        mw.MultiWorkerMirroredStrategy()
    monkeypatch.setenv("HPCDIST_ALLOW_SHARED_GPUS", "1")
    assert mw.MultiWorkerMirroredStrategy().num_replicas_in_sync >= 2
