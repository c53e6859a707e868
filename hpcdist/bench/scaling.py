"""``hpcdist bench report RESULTS...``: a scaling table and plot from runs at several sizes.

Reads the JSON files of ``hpcdist bench train`` (one per run, made at
different rank and node counts), groups them by model and scaling mode, and
compares each run with the smallest one of its group:

* speedup: total samples/sec over the smallest run's;
* weak-scaling efficiency (the batch per replica is fixed, so ``N`` ranks do
  ``N`` times the work): per-rank throughput over the smallest run's per-rank
  throughput;
* strong-scaling efficiency (the global batch is fixed): speedup over the
  increase in ranks.

Both come to ``speedup / (ranks / ranks_smallest)``; the table says which
one a group measures. Prints the table, writes ``<out>/<name>.json`` and a
PNG (total samples/sec against ranks, with the ideal line).

Example:
    >>> rows = scaling_rows([
    ...     {"model": "mlp", "scaling": "weak", "ranks": 1, "nodes": 1,
    ...      "samples_per_s_total": {"mean": 100.0, "ci95": 1.0}},
    ...     {"model": "mlp", "scaling": "weak", "ranks": 4, "nodes": 2,
    ...      "samples_per_s_total": {"mean": 360.0, "ci95": 5.0}}])
    >>> [(r["ranks"], r["speedup"], r["efficiency"]) for r in rows]
    [(1, 1.0, 1.0), (4, 3.6, 0.9)]
"""

from __future__ import annotations

import argparse
import json
import pathlib
from collections.abc import Sequence
from typing import Any

from hpcdist.bench.report import pyplot, save_report
from hpcdist.errors import BenchmarkError


def load(paths: Sequence[str]) -> list[dict[str, Any]]:
    """The ``hpcdist bench train`` results among ``paths`` (files, or folders of them)."""
    files: list[pathlib.Path] = []
    for p in map(pathlib.Path, paths):
        files += sorted(p.glob("*.json")) if p.is_dir() else [p]
    runs = []
    for f in files:
        try:
            data = json.loads(f.read_text())
        except (OSError, ValueError) as err:
            raise BenchmarkError(f"cannot read {f}: {err}") from err
        if isinstance(data, dict) and data.get("benchmark") == "train":
            data["file"] = str(f)
            runs.append(data)
    if not runs:
        raise BenchmarkError(
            f"no hpcdist bench train results among {list(paths)}; run "
            "`mpirun -n N hpcdist bench train --out DIR` at several sizes first"
        )
    return runs


def scaling_rows(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per run, with speedup and efficiency against the smallest run of its group."""
    groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for run in runs:
        groups.setdefault((run["model"], run.get("scaling", "weak")), []).append(run)
    rows = []
    for (model, mode), group in sorted(groups.items()):
        group.sort(key=lambda r: (r["ranks"], r.get("nodes", 1)))
        base = group[0]
        base_total = base["samples_per_s_total"]["mean"]
        for run in group:
            total = run["samples_per_s_total"]["mean"]
            speedup = total / base_total
            rows.append({
                "model": model, "scaling": mode, "ranks": run["ranks"],
                "nodes": run.get("nodes", 1), "samples_per_s": total,
                "ci95": run["samples_per_s_total"]["ci95"],
                "speedup": round(speedup, 4),
                "efficiency": round(speedup / (run["ranks"] / base["ranks"]), 4),
                "file": run.get("file"),
            })
    return rows


def format_rows(rows: list[dict[str, Any]]) -> str:
    """The scaling table as text."""
    head = f"{'model':<12}{'scaling':<8}{'ranks':>6}{'nodes':>6}{'samples/s':>13}{'+-95%':>9}" \
           f"{'speedup':>9}{'efficiency':>11}"
    lines = [head, "-" * len(head)]
    for r in rows:
        lines.append(f"{r['model']:<12}{r['scaling']:<8}{r['ranks']:>6}{r['nodes']:>6}"
                     f"{r['samples_per_s']:>13.1f}{r['ci95']:>9.1f}{r['speedup']:>9.2f}"
                     f"{100 * r['efficiency']:>10.1f}%")
    return "\n".join(lines)


def plot(rows: list[dict[str, Any]], path: pathlib.Path) -> pathlib.Path | None:
    """Total samples/sec against ranks per group, with the ideal (linear) line."""
    plt = pyplot()
    if plt is None:
        return None
    fig, ax = plt.subplots(figsize=(6.5, 4))
    for key in sorted({(r["model"], r["scaling"]) for r in rows}):
        group = [r for r in rows if (r["model"], r["scaling"]) == key]
        ranks = [r["ranks"] for r in group]
        ax.errorbar(ranks, [r["samples_per_s"] for r in group],
                    yerr=[r["ci95"] for r in group], marker="o", capsize=3,
                    label=f"{key[0]} ({key[1]})")
        base = group[0]
        ax.plot(ranks, [base["samples_per_s"] * n / base["ranks"] for n in ranks], "k:",
                linewidth=0.8)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("ranks")
    ax.set_ylabel("samples/sec (all ranks)")
    ax.set_title("hpcdist bench train scaling (dotted: ideal)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def main(argv: Sequence[str] | None = None, *, prog: str = "hpcdist bench report") -> int:
    """Print the scaling table of the given results; write its JSON and PNG."""
    p = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n\n")[0])
    p.add_argument("results", nargs="+", help="JSON files of hpcdist bench train, or folders")
    p.add_argument("--out", default="benchmarks/results", help="folder for the JSON and PNG")
    p.add_argument("--name", default="scaling", help="file name (default scaling)")
    args = p.parse_args(argv)
    rows = scaling_rows(load(args.results))
    print(format_rows(rows))
    path = save_report(args.name, {"benchmark": "scaling report", "rows": rows}, args.out)
    png = plot(rows, pathlib.Path(args.out) / f"{args.name}.png")
    print(f"wrote {path}" + (f" and {png}" if png else ""))
    return 0
