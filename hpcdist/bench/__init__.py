"""Benchmarks shipped with hpcdist, run as ``hpcdist bench NAME [options]`` under mpirun.

Each benchmark module has ``main(argv) -> int``; :data:`BENCHMARKS` maps a
name to its module, imported only when that benchmark runs.

Example:
    >>> sorted(BENCHMARKS)
    ['allreduce', 'report', 'strategy', 'train']
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence

BENCHMARKS = {
    "allreduce": "hpcdist.bench.allreduce",
    "report": "hpcdist.bench.scaling",
    "strategy": "hpcdist.bench.strategy",
    "train": "hpcdist.bench.train",
}


def run(name: str, argv: Sequence[str] | None = None) -> int:
    """Run benchmark ``name`` with command-line ``argv``; returns its exit status.

    Example: ``run("allreduce", ["--quick"])`` under ``mpirun -n 2``.
    """
    if name not in BENCHMARKS:
        raise ValueError(f"benchmark is {name!r}; expected one of {', '.join(sorted(BENCHMARKS))}")
    module = importlib.import_module(BENCHMARKS[name])
    return int(module.main(list(argv) if argv is not None else [], prog=f"hpcdist bench {name}"))
