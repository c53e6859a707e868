"""What every benchmark shares: the JSON report and the line plot, in a results folder.

``benchmarks/common.py`` uses these with the repository's ``benchmarks/results``;
``hpcdist bench ...`` with the folder given by ``--out``.

Example:
    >>> import tempfile
    >>> with tempfile.TemporaryDirectory() as folder:
    ...     save_report("demo", {"rows": []}, folder).name
    'demo.json'
"""

from __future__ import annotations

import json
import pathlib
from collections.abc import Mapping, Sequence
from typing import Any


def save_report(name: str, report: dict[str, Any], folder: str | pathlib.Path) -> pathlib.Path:
    """Write ``report`` as indented JSON to ``<folder>/<name>.json`` and return the path."""
    folder = pathlib.Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}.json"
    path.write_text(json.dumps(report, indent=2) + "\n")
    return path


def pyplot() -> Any:
    """``matplotlib.pyplot`` with the file backend, or ``None`` (and a message) without it.

    Example: ``plt = pyplot()`` then ``if plt is not None: ...``.
    """
    try:
        import matplotlib  # lazy: optional plotting dependency

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt  # lazy: optional plotting dependency
    except ImportError:
        print("matplotlib is not installed (extra 'bench'): no plot written")
        return None
    return plt


def save_line_plot(
    name: str,
    x: Sequence[float],
    series: Mapping[str, Sequence[float]],
    *,
    folder: str | pathlib.Path,
    xlabel: str,
    ylabel: str,
    title: str,
    loglog: bool = False,
    references: Mapping[str, float] | None = None,
) -> pathlib.Path | None:
    """One line per series against ``x``, saved as ``<folder>/<name>.png``.

    ``references`` adds a dashed horizontal line per entry (a roofline, say).
    Returns the path, or ``None`` without matplotlib.

    Example: ``save_line_plot("allreduce", sizes, {"raw": busbw}, folder=out, xlabel="bytes",
    ylabel="GB/s", title="allreduce", loglog=True)``.
    """
    plt = pyplot()
    if plt is None:
        return None
    fig, ax = plt.subplots(figsize=(7, 4.5))
    plot = ax.loglog if loglog else ax.semilogx
    for label, ys in series.items():
        plot(list(x), list(ys), "o-", label=label, markersize=3)
    for label, value in (references or {}).items():
        ax.axhline(value, linestyle="--", color="grey", linewidth=1)
        ax.annotate(label, (x[0], value), textcoords="offset points", xytext=(2, 3), fontsize=8)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    folder = pathlib.Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}.png"
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
