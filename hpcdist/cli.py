"""Command line: ``hpcdist info``, ``bench`` and ``run`` (also ``python -m hpcdist ...``).

``hpcdist info`` gathers every rank's place (rank, local rank, node, host,
bound GPUs) on rank 0, which prints one table plus the detected launcher and
scheduler, the MPI library, its thread level and CUDA-awareness, and the
versions of CuPy, NCCL and Numba. ``--json`` prints the same as JSON.

``hpcdist bench NAME [options]`` runs a benchmark of :mod:`hpcdist.bench`
(``allreduce``, ``strategy``, ``train``, and ``report`` for a scaling table);
``hpcdist bench allreduce --help`` lists its options.

``hpcdist timeline merge DIR -o run.json`` merges the ranks' timeline files into
one Chrome trace; ``hpcdist timeline report DIR`` prints the step and straggler
report and the flight-recorder divergence (:mod:`hpcdist.observe`).

``hpcdist run -np 4 python train.py`` starts a script on 4 ranks through the
``mpirun`` beside mpi4py and prints the command (:mod:`hpcdist.launch`).

Example:
    mpirun -n 4 hpcdist info
    srun --mpi=pmix -n 4 hpcdist info --json
    mpirun -n 2 hpcdist bench allreduce --quick
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import os
import platform
import sys
from typing import Any

from hpcdist.bench import BENCHMARKS, run
from hpcdist.cluster.detect import describe_environment
from hpcdist.collectives.nccl import nccl_available
from hpcdist.errors import HpcdistError
from hpcdist.launch import run as launch_run
from hpcdist.observe.analysis import report as timeline_report
from hpcdist.observe.merge import merge_directory
from hpcdist.runtime import cuda_aware_support, library_version, mpi, world
from hpcdist.runtime.mpi import thread_level_name


def _version_of(module: str) -> str:
    if importlib.util.find_spec(module) is None:
        return "not installed"
    try:
        return str(importlib.import_module(module).__version__)
    except Exception as exc:  # a broken optional install must not break `info`
        return f"broken ({type(exc).__name__}: {exc})"


def _nccl_version() -> str:
    if importlib.util.find_spec("cupy") is None:
        return "not installed (needs CuPy)"
    try:
        from cupy.cuda import nccl  # lazy: optional GPU dependency (CuPy)

        code = int(nccl.get_version())
        return f"{code // 10000}.{code // 100 % 100}.{code % 100}"
    except Exception as exc:
        return f"unavailable ({type(exc).__name__})"


def rank_info() -> dict[str, Any]:
    """This rank's row of the table. Example: ``rank_info()["rank"] == world().rank``."""

    w = world()
    row: dict[str, Any] = {
        "rank": w.rank,
        "local_rank": w.local_rank,
        "local_size": w.local_size,
        "node": w.node_index,
        "host": w.hostname,
        "pid": os.getpid(),
    }
    try:
        binding = w.gpu_binding()
        row["gpus"] = list(binding.visible)
    except HpcdistError as exc:
        row["gpus"] = []
        row["gpu_error"] = str(exc)
    return row


def job_info() -> dict[str, Any]:
    """What is the same on every rank: launcher, scheduler, MPI library, versions."""
    import mpi4py  # lazy: MPI start-up (only its version is read, after mpi())

    MPI = mpi()
    w = world()
    aware = cuda_aware_support()
    major, minor = MPI.Get_version()
    return {
        "environment": describe_environment(),
        "world_size": w.size,
        "node_count": w.node_count,
        "virtual_nodes": w.virtual_nodes,
        "mpi_library": library_version(),
        "mpi_standard": f"{major}.{minor}",
        "mpi_thread_level": thread_level_name(),
        "cuda_aware_mpi": "unknown" if aware is None else ("yes" if aware else "no"),
        "nccl": nccl_available()[1],
        "versions": {
            "hpcdist": _version_of("hpcdist"),
            "python": platform.python_version(),
            "mpi4py": mpi4py.__version__,
            "numpy": _version_of("numpy"),
            "numba": _version_of("numba"),
            "cupy": _version_of("cupy"),
            "nccl": _nccl_version(),
        },
    }


def format_table(rows: list[dict[str, Any]]) -> str:
    """A plain text table of the rows (rank, local rank, node, host, GPUs)."""
    header = ("rank", "local", "node", "host", "gpus")
    body = [
        (
            str(r["rank"]),
            f"{r['local_rank']}/{r['local_size']}",
            str(r["node"]),
            str(r["host"]),
            ",".join(r["gpus"]) or "-",
        )
        for r in rows
    ]
    widths = [max(len(cell) for cell in column) for column in zip(header, *body, strict=True)]
    lines = [
        "  ".join(cell.ljust(w) for cell, w in zip(line, widths, strict=True)).rstrip()
        for line in (header, *body)
    ]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def format_job(job: dict[str, Any]) -> str:
    """The job-wide facts as ``key: value`` lines."""
    env = job["environment"]
    lines = [
        f"launcher:        {env.get('launcher') or 'none (plain python)'}",
        f"scheduler:       {env.get('scheduler') or 'none'}"
        + (f" (job {env['job_id']})" if env.get("job_id") else ""),
        f"resolver:        {env.get('resolver')} ({env.get('reason')})",
        f"world:           {job['world_size']} ranks on {job['node_count']} node(s)"
        + (f", {job['virtual_nodes']} virtual nodes per host" if job["virtual_nodes"] > 1 else ""),
        f"MPI library:     {job['mpi_library']} (MPI {job['mpi_standard']})",
        f"thread level:    {job['mpi_thread_level']}",
        f"CUDA-aware MPI:  {job['cuda_aware_mpi']}",
        f"NCCL collectives: {job['nccl']}",
    ]
    lines += [f"{name + ':':<17}{version}" for name, version in job["versions"].items()]
    return "\n".join(lines)


def info(as_json: bool = False) -> int:
    """Run ``hpcdist info`` on every rank; rank 0 prints. Returns the exit status."""

    w = world()
    rows = w.comm.gather(rank_info(), root=0)
    if w.rank != 0:
        return 0
    job = job_info()  # the same on every rank: asked once, where it is printed
    rows.sort(key=lambda r: r["rank"])
    if as_json:
        print(json.dumps({"job": job, "ranks": rows}, indent=2, sort_keys=True))
    else:
        print(format_job(job))
        print()
        print(format_table(rows))
        for r in rows:
            if "gpu_error" in r:
                print(f"rank {r['rank']}: GPU binding failed: {r['gpu_error']}")
    sys.stdout.flush()
    return 0


def _add_timeline_parser(sub: Any) -> None:
    """``hpcdist timeline merge DIR -o run.json`` and ``hpcdist timeline report DIR``."""
    p = sub.add_parser("timeline", help="merge or report on timeline / flight-recorder files")
    verbs = p.add_subparsers(dest="verb", required=True)
    merge = verbs.add_parser("merge", help="merge the ranks' rank-R.json into one Chrome trace")
    merge.add_argument("directory")
    merge.add_argument("-o", "--output", default="run.json", help="merged trace (default run.json)")
    rep = verbs.add_parser("report", help="step times, waits, stragglers, divergence")
    rep.add_argument("directory")
    rep.add_argument("--png", default=None, help="write the ranks x time plot here")


def _timeline(args: argparse.Namespace) -> int:
    if args.verb == "merge":
        trace = merge_directory(args.directory, args.output)
        ranks = trace["otherData"]["hpcdist"]["ranks"]
        print(f"{args.output}: {len(trace['traceEvents'])} events of {len(ranks)} ranks")
        return 0
    print(timeline_report(args.directory, png=args.png))
    return 0


def _add_run_parser(sub: Any) -> None:
    p = sub.add_parser(
        "run", help="start a script on N ranks with the mpirun beside mpi4py (like horovodrun)"
    )
    p.add_argument("-np", "-n", dest="np", type=int, help="number of ranks")
    p.add_argument("-H", "--hosts", help="hosts and slots, e.g. host1:2,host2:2")
    p.add_argument("--dry-run", action="store_true", help="print the command, do not run it")
    p.add_argument("program", nargs=argparse.REMAINDER, help="the command, e.g. python train.py")


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``hpcdist`` command."""
    parser = argparse.ArgumentParser(prog="hpcdist", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p_info = sub.add_parser("info", help="print the ranks, nodes, GPUs, MPI library and versions")
    p_info.add_argument("--json", action="store_true", help="machine-readable output")

    p_bench = sub.add_parser(
        "bench",
        help="run a benchmark under mpirun (hpcdist bench allreduce --help for its options)",
    )
    p_bench.add_argument("benchmark", choices=sorted(BENCHMARKS), help="which benchmark")
    p_bench.add_argument("options", nargs=argparse.REMAINDER, help="the benchmark's own options")
    _add_timeline_parser(sub)
    _add_run_parser(sub)
    args = parser.parse_args(argv)
    try:
        if args.command == "timeline":
            return _timeline(args)
        if args.command == "info":
            return info(as_json=args.json)
        if args.command == "bench":
            return run(args.benchmark, args.options)
        if args.command == "run":
            return launch_run(args.program, args.np, args.hosts, args.dry_run)
    except HpcdistError as exc:
        print(f"hpcdist: error: {exc}", file=sys.stderr)
        return 2
    return 1


if __name__ == "__main__":
    sys.exit(main())
