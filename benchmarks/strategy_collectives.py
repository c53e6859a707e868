"""Allreduce through the Strategy API vs the engine and raw MPI (issue 19's benchmark).

The benchmark itself is :mod:`hpcdist.bench.strategy` (also ``hpcdist bench
strategy``); this script writes ``benchmarks/results/strategy_collectives.json``
and ``.png`` (``strategy_collectives_mpi<N>`` for N != 2 ranks).

Run: ``mpirun -n 2 python benchmarks/strategy_collectives.py [--quick] [--repeats N]``.
"""

from __future__ import annotations

import sys

from common import RESULTS  # noqa: E402  (benchmarks/ is on sys.path)

from hpcdist.bench.strategy import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:], prog="python benchmarks/strategy_collectives.py", out=str(RESULTS)))
