"""Two revisions of hpcdist side by side: the collectives benchmarks of each, alternating.

Run: ``python benchmarks/revisions.py --base 9d16614`` (no mpirun: it launches the runs).
Each round runs ``benchmarks/strategy_collectives.py --quick`` and
``benchmarks/allreduce.py --quick`` (each revision's own scripts, ``mpirun -n 2``, no gloo)
first for the base revision, exported with ``git archive`` to a temporary folder, then for
the working tree, so both see the same machine state. The report keeps each series' best
time per size over the rounds and the ratio head / base (below 1: the head is faster).
Writes ``results/<name>.json`` and ``.png`` (default ``revisions``).
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import subprocess
import sys
import tarfile
import tempfile
import time

from common import RESULTS, save_report

from hpcdist.bench import report

ROOT = pathlib.Path(__file__).resolve().parent.parent
BENCHES = {
    "strategy_collectives": ["--quick", "--no-gloo"],
    "allreduce": ["--quick", "--no-gloo"],
}
MPI_ENV = {  # what the Makefile exports for mpirun on a small shared machine
    "OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
    "OMPI_MCA_rmaps_base_oversubscribe": "1",
    "PRTE_MCA_rmaps_default_mapping_policy": ":oversubscribe", "OMPI_MCA_osc": "^ucx",
    "OMP_NUM_THREADS": "1", "NUMBA_DISABLE_ERROR_MESSAGE_HIGHLIGHTING": "1",
}


def export(rev: str, folder: pathlib.Path) -> str:
    """Write revision ``rev`` of the repository into ``folder``; returns its full hash."""
    full = subprocess.run(
        ["git", "rev-parse", "--verify", f"{rev}^{{commit}}"], cwd=ROOT, check=True,
        capture_output=True, text=True,
    ).stdout.strip()
    archive = folder.with_suffix(".tar")
    subprocess.run(["git", "archive", "-o", str(archive), full], cwd=ROOT, check=True)
    with tarfile.open(archive) as tar:
        tar.extractall(folder, filter="data")
    archive.unlink()
    return full


def run_bench(tree: pathlib.Path, bench: str, ranks: int, out: pathlib.Path, name: str) -> dict:
    """One benchmark of the source tree ``tree`` under ``mpirun``; its JSON report."""
    mpirun = pathlib.Path(sys.executable).with_name("mpirun")
    cmd = [str(mpirun if mpirun.exists() else "mpirun"), "-n", str(ranks), sys.executable,
           f"benchmarks/{bench}.py", *BENCHES[bench], "--out", str(out), "--name", name]
    env = {**os.environ, **MPI_ENV, "PYTHONPATH": str(tree)}
    proc = subprocess.run(cmd, cwd=tree, env=env, capture_output=True, text=True, timeout=900)
    if proc.returncode != 0:
        tail = proc.stdout[-3000:] + proc.stderr[-3000:]
        raise SystemExit(f"{' '.join(cmd)} in {tree} failed:\n{tail}")
    return json.loads((out / f"{name}.json").read_text())


def series_seconds(bench: str, report: dict) -> dict[tuple[str, int], float]:
    """(series, bytes) -> seconds, from either benchmark's report."""
    found = {}
    for row in report["rows"]:
        if bench == "strategy_collectives":
            for series, seconds in row["seconds"].items():
                found[(series, row["bytes"])] = seconds
        else:
            for series, value in row["series"].items():
                found[(series, row["bytes"])] = value["seconds"]
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", required=True, help="the revision to compare against")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--name", default="revisions")
    args = parser.parse_args()
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, check=True,
                          capture_output=True, text=True).stdout.strip()
    dirty = bool(subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"],
                                cwd=ROOT, capture_output=True, text=True).stdout.strip())
    started = time.time()
    best: dict[tuple[str, str, int], dict[str, list[float]]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        base_tree = pathlib.Path(tmp) / "base"
        base = export(args.base, base_tree)
        out = pathlib.Path(tmp) / "out"
        out.mkdir()
        for round_ in range(args.rounds):
            for label, tree in (("base", base_tree), ("head", ROOT)):
                for bench in BENCHES:
                    report = run_bench(tree, bench, args.ranks, out, f"{bench}-{label}-{round_}")
                    for (series, nbytes), seconds in series_seconds(bench, report).items():
                        runs = best.setdefault((bench, series, nbytes), {"base": [], "head": []})
                        runs[label].append(seconds)
                print(f"round {round_ + 1}/{args.rounds}: {label} done", flush=True)
    rows = []
    for (bench, series, nbytes), runs in sorted(best.items()):
        if runs["base"] and runs["head"]:
            b, h = min(runs["base"]), min(runs["head"])
            rows.append({"benchmark": bench, "series": series, "bytes": nbytes,
                         "base_best_s": b, "head_best_s": h, "head_over_base": h / b,
                         "base_s": runs["base"], "head_s": runs["head"]})
    save_report(args.name, {
        "benchmark": "revisions: the collectives benchmarks of two revisions, side by side",
        "command": f"python benchmarks/revisions.py --base {args.base}"
                   + (f" --rounds {args.rounds}" if args.rounds != 3 else ""),
        "base": base, "head": head, "head_has_uncommitted_changes": dirty,
        "ranks": args.ranks, "rounds": args.rounds,
        "statistic": "best over the rounds of each benchmark's own statistic",
        "rows": rows, "wall_seconds": time.time() - started,
    })
    _plot(args.name, rows)
    for r in rows:
        if r["bytes"] <= 4 or r["series"] in ("engine", "hpcdist-auto"):
            print(f"{r['benchmark']:22}{r['series']:22}{r['bytes']:>9}"
                  f"{r['base_best_s'] * 1e6:10.2f}{r['head_best_s'] * 1e6:10.2f}"
                  f"{r['head_over_base']:8.2f}")
    print(f"wrote {RESULTS / (args.name + '.json')}")


def _plot(name: str, rows: list[dict]) -> None:
    """head / base against message size, one line per benchmark series of hpcdist."""
    lines: dict[str, dict[int, float]] = {}
    for r in rows:
        if r["series"] in ("mpi4py",):
            continue
        lines.setdefault(f"{r['benchmark']}: {r['series']}", {})[r["bytes"]] = r["head_over_base"]
    sizes = sorted({n for line in lines.values() for n in line})
    report.save_line_plot(
        name, sizes, {k: [v.get(n, float("nan")) for n in sizes] for k, v in lines.items()},
        xlabel="bytes per rank", ylabel="time: head / base (below 1: head faster)",
        title="Collectives, two revisions side by side", references={"same speed": 1.0},
        folder=RESULTS,
    )


if __name__ == "__main__":
    main()
