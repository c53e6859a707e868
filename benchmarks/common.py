"""What every benchmark shares: where results go, the JSON report, the line plot.

Example: ``save_report("allreduce", report)`` writes ``benchmarks/results/allreduce.json``.
"""

from __future__ import annotations

import json
import pathlib
from collections.abc import Sequence

RESULTS = pathlib.Path(__file__).resolve().parent / "results"


def save_report(name: str, report: dict) -> pathlib.Path:
    """Write ``report`` to ``results/<name>.json`` and return the path."""
    RESULTS.mkdir(exist_ok=True)
    path = RESULTS / f"{name}.json"
    path.write_text(json.dumps(report, indent=2) + "\n")
    return path


def pyplot():
    """``matplotlib.pyplot`` with the file backend, or ``None`` (and a message) without it."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed (extra 'bench'): no plot written")
        return None
    return plt


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
    plt = pyplot()
    if plt is None:
        return
    fig, ax = plt.subplots(figsize=(6, 4))
    plot = ax.loglog if loglog else ax.semilogx
    for label, ys in series.items():
        plot(list(x), list(ys), "o-", label=label)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    RESULTS.mkdir(exist_ok=True)
    fig.savefig(RESULTS / f"{name}.png", dpi=100)
