"""Derive AUTO's MPI band (``hpcdist.collectives.choice.MPI_BAND``) from benchmark results.

Reads the ``rows`` of ``strategy_*.json`` in ``benchmarks/results`` (or the
files named), keeps each size's best ``engine-shm`` and ``engine-mpi`` time
over all of them and prints the band where MPI is faster
(:func:`hpcdist.bench.strategy.mpi_band_from_rows`), as the Python constant to
put in ``hpcdist/collectives/choice.py`` and as ``HPCDIST_MPI_BAND``.

Regenerate (2 ranks, one node; see docs/performance.md):

    flock /tmp/hpcdist-bench.lock mpirun -n 2 python benchmarks/strategy_collectives.py \\
        --min-bytes 512KiB --max-bytes 32MiB --repeats 40 --name strategy_crossover
    python benchmarks/mpi_band.py

Example: ``python benchmarks/mpi_band.py benchmarks/results/strategy_crossover.json``.
"""

from __future__ import annotations

import json
import pathlib
import sys

from common import RESULTS  # noqa: E402  (benchmarks/ is on sys.path)

from hpcdist.bench.allreduce import format_bytes
from hpcdist.bench.strategy import mpi_band_from_rows


def main(argv: list[str]) -> int:
    """Print the band derived from the files in ``argv`` (default: results/strategy_*.json)."""
    paths = [pathlib.Path(a) for a in argv] or sorted(RESULTS.glob("strategy_*.json"))
    runs = []
    for path in paths:
        report = json.loads(path.read_text())
        if report.get("benchmark") == "strategy_collectives" and report.get("ranks") == 2 and (
            report.get("nodes", 1) == 1
        ):
            runs.append(report["rows"])
            print(f"read {path} ({report.get('statistic')})")
    if not runs:
        print("no 2-rank, one-node strategy benchmark results found", file=sys.stderr)
        return 1
    lo, hi = mpi_band_from_rows(runs)
    shown = "off" if lo == hi == 0 else f"{format_bytes(lo)} to {format_bytes(hi)}"
    print(f"MPI band: {shown}")
    print(f"MPI_BAND = ({lo}, {hi})")
    print(f"HPCDIST_MPI_BAND={lo}:{hi}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
