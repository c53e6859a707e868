"""Is the straggler named? One rank sleeps before every allreduce; the timeline report must name it.

Run: ``HPCDIST_VIRTUAL_NODES=2 mpirun -n 4 python benchmarks/straggler.py [--runs 10]
[--delay 0.02]``. Each run writes a fresh timeline (``hd.experimental.timeline``)
of 8 allreduces of 1000 floats during which one rank (run ``k``: rank
``k % size``) sleeps ``--delay`` seconds before each call; rank 0 then reads the
report (:func:`hpcdist.observe.analysis.report_directory`) and checks that the
straggler it names is that rank and no other. Writes
``benchmarks/results/straggler.json`` (target: 10 of 10 named).
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import sys
import tempfile
import time

import numpy as np
from common import save_report

import hpcdist as hd
from hpcdist.bench.report import save_report as save_report_in
from hpcdist.collectives import Collectives
from hpcdist.observe import analysis
from hpcdist.runtime import world


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--delay", type=float, default=0.020)
    parser.add_argument("--calls", type=int, default=8)
    parser.add_argument("--name", default="straggler", help="results file name")
    parser.add_argument("--out", default=None, help="results folder (default benchmarks/results)")
    args = parser.parse_args()
    w = world()
    engine = Collectives()
    x = [np.ones(1000, np.float32)]
    engine.allreduce(x, "SUM")
    hosts = sorted(set(w.comm.allgather(socket.gethostname())))
    runs = []
    for run in range(args.runs):
        slow = run % w.size
        path = w.comm.bcast(tempfile.mkdtemp(prefix="hpcdist-straggler-") if w.rank == 0 else None)
        with hd.experimental.timeline(path):
            for _ in range(args.calls):
                if w.rank == slow:
                    time.sleep(args.delay)
                engine.allreduce(x, "SUM")
        w.comm.Barrier()
        if w.rank == 0:
            report = analysis.report_directory(path)
            blame = {r: round(v["blame_ms"], 1) for r, v in report["ranks"].items()}
            named = report["stragglers"]
            runs.append({"slow": slow, "named": named, "blame_ms": blame, "ok": named == [slow]})
            print(f"run {run}: rank {slow} slept; report names {named}; blame ms {blame}",
                  flush=True)
            shutil.rmtree(path, ignore_errors=True)
        w.comm.Barrier()
    if w.rank == 0:
        ok = sum(r["ok"] for r in runs)
        print(f"straggler named correctly in {ok} of {len(runs)} runs")
        result = {
            "ranks": w.size, "virtual_nodes": int(os.environ.get("HPCDIST_VIRTUAL_NODES", "1")),
            "delay_s": args.delay, "calls_per_run": args.calls, "runs": runs,
            "named_correctly": ok, "target": f"{len(runs)} of {len(runs)}",
            "met": ok == len(runs),
            "hosts": hosts,
            "command": " ".join(sys.argv),
        }
        if args.out:
            save_report_in(args.name, result, args.out)
        else:
            save_report(args.name, result)


if __name__ == "__main__":
    main()
