"""The pictures of docs/observing.md: a real timeline of ``fit`` with one slow rank.

Run: ``HPCDIST_VIRTUAL_NODES=2 mpirun -n 4 python benchmarks/observe_demo.py``. An
``hpcdist.nn`` MLP trains for 12 steps under MultiWorkerMirroredStrategy with the
timeline on and ``hd.callbacks.StepStats()``; the last rank sleeps 20 ms at the
start of every step (a slow input pipeline, say). Rank 0 then merges the ranks'
files (``hpcdist timeline merge``), prints the report (``hpcdist timeline
report``) and writes ``benchmarks/results/observe_timeline.png`` (ranks x time,
the last 4 steps) and ``observe_report.json``.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMBA_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import numpy as np  # noqa: E402
from common import RESULTS, save_report  # noqa: E402

import hpcdist as hd  # noqa: E402
from hpcdist.observe import analysis, merge  # noqa: E402
from hpcdist.runtime import world  # noqa: E402


class SlowRank(hd.callbacks.Callback):
    """The last rank sleeps ``delay`` seconds before every step."""

    def __init__(self, delay: float) -> None:
        super().__init__()
        self.delay = delay

    def on_train_batch_begin(self, batch, logs=None):
        if world().rank == world().size - 1:
            time.sleep(self.delay)


def main() -> None:
    w = world()
    strategy = hd.MultiWorkerMirroredStrategy()
    with strategy.scope():
        model = hd.nn.Sequential([hd.nn.Dense(256, activation="relu", input_shape=(64,)),
                                  hd.nn.Dense(256, activation="relu"), hd.nn.Dense(10)])
        model.compile(optimizer=hd.optimizers.Adam(1e-3), loss="mse")
    rng = np.random.default_rng(0)
    x = rng.standard_normal((12 * 64, 64)).astype(np.float32)
    y = rng.standard_normal((12 * 64, 10)).astype(np.float32)
    model.fit(x[:128], y[:128], batch_size=64, epochs=1, verbose=0)  # warm up (compile)
    folder = w.comm.bcast(tempfile.mkdtemp(prefix="hpcdist-demo-") if w.rank == 0 else None)
    with hd.experimental.timeline(folder):
        model.fit(x, y, batch_size=64, epochs=1, verbose=0,
                  callbacks=[SlowRank(0.020), hd.callbacks.StepStats()])
    w.comm.Barrier()
    if w.rank == 0:
        trace = merge.merge_directory(folder, os.path.join(folder, "run.json"))
        print(f"merged: {len(trace['traceEvents'])} events of {w.size} ranks")
        print(analysis.report(folder))
        ranks = merge.read_directory(folder)
        events = merge.merge_events(ranks, merge.clock_offsets(ranks))
        steps = sorted(e["ts"] for e in events if e.get("name") == "step" and e["pid"] == 0)
        start = steps[-4] if len(steps) >= 4 else 0.0
        shown = [e for e in events if e.get("ph") == "M" or e["ts"] >= start]
        for e in shown:
            if "ts" in e:
                e["ts"] -= start
        analysis.plot_ranks(shown, str(RESULTS / "observe_timeline.png"),
                            f"fit on {w.size} ranks ({w.node_count} nodes), rank {w.size - 1} "
                            "sleeps 20 ms per step: the last 4 steps")
        report = analysis.step_report(events)
        save_report("observe_report", {"ranks": w.size, "nodes": w.node_count,
                                       "report": report,
                                       "command": "HPCDIST_VIRTUAL_NODES=2 mpirun -n 4 "
                                                  "python benchmarks/observe_demo.py"})
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
