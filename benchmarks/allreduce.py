"""All-reduce: hpcdist's collectives engine (AUTO and each backend) vs raw mpi4py and gloo.

The benchmark itself is :mod:`hpcdist.bench.allreduce` (also ``hpcdist bench
allreduce``); this script writes into the repository's ``benchmarks/results``:
``allreduce.json`` and ``.png`` for 2 ranks, ``allreduce_mpi<N>`` for N ranks.

Run: ``mpirun -n 2 python benchmarks/allreduce.py [--quick] [--max-bytes 16MiB] [--iters N]``
(``--help`` lists the options).
"""

from __future__ import annotations

import sys

from common import RESULTS  # noqa: E402  (benchmarks/ is on sys.path)

from hpcdist.bench.allreduce import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:], prog="python benchmarks/allreduce.py", out=str(RESULTS)))
