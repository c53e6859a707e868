"""What the always-on flight recorder costs on the small-message path (target <= 1 us per call).

Run: ``mpirun -n 2 python benchmarks/flight_recorder.py``. On one node a
4-float allreduce takes the engine's ``small`` path (its fixed cost is what the
recorder adds to). Each round times ``--iters`` calls with the recorder (the
engine's ``allreduce``) and ``--iters`` calls without it (the undecorated
method with the recorder's private switch off), alternating, so both see the
same machine; the per-round differences give the cost (median, and the
difference of the two best rounds). A one-process loop of the recorder's own
work per call (open and close a record, the decorator's call) is timed too:
the same cost without MPI noise, in the thread's CPU time (on a loaded machine
the wall-clock figures include time slices given to other processes). Writes
``benchmarks/results/flight_recorder.json`` and ``.png``.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
from common import RESULTS, pyplot, save_report

from hpcdist.collectives import Collectives
from hpcdist.observe.recorder import RECORDER, recorded
from hpcdist.runtime import mpi


def per_call_us(comm, fn, iters: int) -> float:
    comm.Barrier()
    start = time.perf_counter()
    for _ in range(iters):
        fn()
    return comm.allreduce(time.perf_counter() - start, op=mpi().MAX) / iters * 1e6


def recorder_alone_us(iters: int) -> float:
    """One process: the recorder's work per call (decorator + open + close), best of 5, in
    CPU time of this thread (time another process takes from this core is not counted)."""

    def plain(x: int) -> int:
        RECORDER.begin("bench/1", x, "allreduce(op=SUM, [float32(4,)])", "small")
        return x

    def bare(x: int) -> int:
        return x

    wrapped = recorded(plain)
    best = float("inf")
    for _ in range(5):
        t0 = time.thread_time()
        for i in range(iters):
            wrapped(i)
        t1 = time.thread_time()
        for i in range(iters):
            bare(i)
        t2 = time.thread_time()
        best = min(best, ((t1 - t0) - (t2 - t1)) / iters * 1e6)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--iters", type=int, default=5000)
    parser.add_argument("--rounds", type=int, default=15)
    args = parser.parse_args()
    comm = mpi().COMM_WORLD
    engine = Collectives(comm)
    x = [np.ones(4, np.float32)]
    undecorated = Collectives.allreduce.__wrapped__  # type: ignore[attr-defined]
    for _ in range(2000):
        engine.allreduce(x, "SUM")
    algorithm = engine.last_algorithm
    on, off = [], []
    for _ in range(args.rounds):
        RECORDER.on = True
        on.append(per_call_us(comm, lambda: engine.allreduce(x, "SUM"), args.iters))
        RECORDER.on = False
        off.append(per_call_us(comm, lambda: undecorated(engine, x, "SUM"), args.iters))
    RECORDER.on = True
    alone = recorder_alone_us(200_000)
    diffs = [a - b for a, b in zip(on, off, strict=True)]
    result = {
        "ranks": comm.Get_size(),
        "algorithm": algorithm,
        "iters_per_round": args.iters,
        "rounds": args.rounds,
        "with_recorder_us": on,
        "without_recorder_us": off,
        "median_cost_us": statistics.median(diffs),
        "best_vs_best_cost_us": min(on) - min(off),
        "recorder_alone_us": alone,
        "target_us": 1.0,
        # The recorder's own CPU time decides; the end-to-end difference counts only where
        # the calls' own spread (off rounds, best to median) is below the target.
        "spread_without_us": statistics.median(off) - min(off),
        "met": alone <= 1.0 and (statistics.median(diffs) <= 1.0
                                 or statistics.median(off) - min(off) > 10.0),
        "command": f"mpirun -n {comm.Get_size()} python benchmarks/flight_recorder.py",
    }
    if comm.Get_rank() == 0:
        print(f"small allreduce ({algorithm}), {comm.Get_size()} ranks: with recorder "
              f"{min(on):.2f} us best / {statistics.median(on):.2f} median, without "
              f"{min(off):.2f} / {statistics.median(off):.2f}; cost per call: median "
              f"{result['median_cost_us']:.3f} us, best-vs-best "
              f"{result['best_vs_best_cost_us']:.3f} us; recorder alone {alone:.3f} us "
              f"CPU (target <= 1 us: {'met' if result['met'] else 'MISSED'}; the end-to-end "
              f"difference is resolvable only where the calls' spread, here "
              f"{result['spread_without_us']:.1f} us, is well below 1 us)")
        save_report("flight_recorder", result)
        plt = pyplot()
        fig, ax = plt.subplots(figsize=(6, 3.5))
        ax.plot(on, "o-", label="with flight recorder")
        ax.plot(off, "s-", label="recorder switched off")
        ax.set_xlabel("round (alternating)")
        ax.set_ylabel("us per 4-float allreduce")
        ax.set_title(f"flight recorder cost: median {result['median_cost_us']:.2f} us/call")
        ax.legend()
        fig.tight_layout()
        fig.savefig(RESULTS / "flight_recorder.png", dpi=110)
        plt.close(fig)


if __name__ == "__main__":
    main()
