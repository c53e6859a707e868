"""What the timeline costs ``fit``: step time with it off and on, side by side (target <= 3 %).

Run: ``mpirun -n 2 python benchmarks/timeline_overhead.py [--rounds 9]``. An
``hpcdist.nn`` MLP (hidden 256 x 2) trains under MultiWorkerMirroredStrategy on
synthetic data; each round runs one ``fit`` epoch of ``--steps`` steps with the
timeline off and one inside ``hd.experimental.timeline(DIR)`` (in turn first), so
both see the same machine. The step time of a round is the epoch's time over its
steps; the overhead is the median of the per-round ratios on/off. When off,
the timeline's cost is its flag checks: the run also times those alone
(``span()`` calls and checks per step, against the step time). On a loaded
machine the wall-clock ratio is noisy, so the run also gives the timeline's own
CPU time per step (events per step x CPU time per event, written to a file)
against the step time. Writes
``benchmarks/results/timeline_overhead.json`` and ``.png``.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time
import timeit

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMBA_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import numpy as np  # noqa: E402
from common import RESULTS, pyplot, save_report  # noqa: E402

import hpcdist as hd  # noqa: E402
from hpcdist.observe import merge, timeline  # noqa: E402
from hpcdist.runtime import world  # noqa: E402

SPANS_PER_STEP = 6  # input, 2 x callbacks, forward+backward, optimizer, gradient reduction


def event_cost_s(folder: str, n: int = 50_000) -> float:
    """CPU time of this thread per timeline event (a collective's, written to a file)."""
    timeline.start(f"{folder}/cost", rank=0, size=1)
    entry = ["0/2", 1, "allreduce(op=SUM, [float32(4,)])", "small", 1.0, 1.001]
    t0 = time.thread_time()
    for _ in range(n):
        timeline.collective(entry)
    timeline.stop()
    return (time.thread_time() - t0) / n


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=16)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--batch", type=int, default=64, help="per replica")
    args = parser.parse_args()
    w = world()
    strategy = hd.MultiWorkerMirroredStrategy()
    with strategy.scope():
        model = hd.nn.Sequential([hd.nn.Dense(256, activation="relu", input_shape=(64,)),
                                  hd.nn.Dense(256, activation="relu"), hd.nn.Dense(10)])
        model.compile(optimizer=hd.optimizers.SGD(0.01), loss="mse")
    rng = np.random.default_rng(0)
    n = args.batch * w.size * args.steps
    x = rng.standard_normal((n, 64)).astype(np.float32)
    y = rng.standard_normal((n, 10)).astype(np.float32)
    global_batch = args.batch * w.size
    model.fit(x, y, batch_size=global_batch, epochs=1, verbose=0)  # compile and warm up
    folder = w.comm.bcast(tempfile.mkdtemp(prefix="hpcdist-tl-") if w.rank == 0 else None)

    def epoch() -> float:
        w.comm.Barrier()
        start = time.perf_counter()
        model.fit(x, y, batch_size=global_batch, epochs=1, verbose=0)
        return w.comm.allreduce(time.perf_counter() - start) / w.size / args.steps

    off, on = [], []
    for r in range(args.rounds):  # off then on, then on then off: no order favours one
        if r % 2 == 0:
            off.append(epoch())
        with hd.experimental.timeline(folder):
            on.append(epoch())
        if r % 2 == 1:
            off.append(epoch())
    ratios = [b / a for a, b in zip(off, on, strict=True)]
    events = 0
    if w.rank == 0:
        events = sum(1 for e in merge.read_rank_file(f"{folder}/rank-00000.json")
                     if e.get("ph") != "M")  # the last round's file
    per_event_s = event_cost_s(folder) if w.rank == 0 else 0.0
    check_s = min(timeit.repeat(lambda: timeline.span("input"), number=100_000, repeat=5)) / 1e5
    if w.rank == 0:
        shutil.rmtree(folder, ignore_errors=True)
        overhead = statistics.median(ratios) - 1
        off_cost = SPANS_PER_STEP * check_s / statistics.median(off)
        per_step = events / args.steps
        cpu_estimate = per_step * per_event_s / statistics.median(off)
        result = {
            "ranks": w.size, "steps_per_round": args.steps, "rounds": args.rounds,
            "batch_per_replica": args.batch,
            "step_ms_off": [t * 1e3 for t in off], "step_ms_on": [t * 1e3 for t in on],
            "median_step_ms_off": statistics.median(off) * 1e3,
            "median_step_ms_on": statistics.median(on) * 1e3,
            "overhead_on": overhead, "target_on": 0.03, "met_on": overhead <= 0.03,
            "span_check_when_off_ns": check_s * 1e9,
            "overhead_off_estimate": off_cost,
            "events_per_step": per_step, "cpu_us_per_event": per_event_s * 1e6,
            "overhead_on_cpu_estimate": cpu_estimate,
            "command": f"mpirun -n {w.size} python benchmarks/timeline_overhead.py",
        }
        print(f"fit step, {w.size} ranks: timeline off {result['median_step_ms_off']:.2f} ms, "
              f"on {result['median_step_ms_on']:.2f} ms (median of {args.rounds} rounds); "
              f"overhead on {100 * overhead:+.2f} % (target <= 3 %: "
              f"{'met' if overhead <= 0.03 else 'MISSED'}); off: {SPANS_PER_STEP} flag checks "
              f"of {check_s * 1e9:.0f} ns = {100 * off_cost:.4f} % of a step; on, by CPU time: "
              f"{per_step:.1f} events/step x {per_event_s * 1e6:.2f} us = "
              f"{100 * cpu_estimate:.2f} % of a step")
        save_report("timeline_overhead", result)
        plt = pyplot()
        fig, ax = plt.subplots(figsize=(6, 3.5))
        ax.plot(result["step_ms_off"], "s-", label="timeline off")
        ax.plot(result["step_ms_on"], "o-", label="timeline on")
        ax.set_xlabel("round (off then on)")
        ax.set_ylabel("fit step time (ms)")
        ax.set_title(f"timeline overhead on fit: {100 * overhead:+.2f} % (median ratio)")
        ax.legend()
        fig.tight_layout()
        fig.savefig(RESULTS / "timeline_overhead.png", dpi=110)
        plt.close(fig)


if __name__ == "__main__":
    main()
