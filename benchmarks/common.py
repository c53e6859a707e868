"""What every benchmark shares: where results go, the JSON report, the line plot.

The writers live in :mod:`hpcdist.bench.report` (``hpcdist bench`` uses them
too); these wrappers put the files in the repository's ``benchmarks/results``.

Example: ``save_report("allreduce", report)`` writes ``benchmarks/results/allreduce.json``.
"""

from __future__ import annotations

import pathlib
from collections.abc import Sequence

from hpcdist.bench import report
from hpcdist.bench.report import pyplot

RESULTS = pathlib.Path(__file__).resolve().parent / "results"

__all__ = ["RESULTS", "pyplot", "save_line_plot", "save_report"]


def save_report(name: str, data: dict) -> pathlib.Path:
    """Write ``data`` to ``results/<name>.json`` and return the path."""
    return report.save_report(name, data, RESULTS)


def save_line_plot(
    name: str,
    x: Sequence[float],
    series: dict[str, Sequence[float]],
    *,
    xlabel: str,
    ylabel: str,
    title: str,
    loglog: bool = False,
) -> None:
    """One line per series against ``x``, saved as ``results/<name>.png``."""
    report.save_line_plot(
        name, x, series, folder=RESULTS, xlabel=xlabel, ylabel=ylabel, title=title, loglog=loglog
    )
