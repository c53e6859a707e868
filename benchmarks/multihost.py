"""All-reduce across two real (namespace) hosts on an emulated interconnect.

Brings up two hosts of ``tests/multihost/hosts.sh`` (network namespaces joined by
a bridge; root only), limits each host's link with ``tc`` (tbf, both directions)
to each rate of ``--rates`` (default 10gbit and 1gbit), and runs
``hpcdist bench allreduce`` across them with 2 ranks per host: raw
``Comm.Allreduce``, hpcdist's flat MPI (``hpcdist-mpi``), hpcdist's hierarchical
algorithm (``hpcdist-hierarchical``: each host reduces in shared memory, the host
leaders exchange once, each host broadcasts) and AUTO, on the same buffers in
one run, 4 KiB to 64 MiB, plus the ResNet-50 gradient list. On a real cluster
the same measurement is ``mpirun --host a:2,b:2 hpcdist bench allreduce``.

Target: hierarchical >= 1.3x raw MPI's speed at >= 16 MiB on the 1 Gbit/s link.
This kernel has no netem, so the links add no delay beyond the bridge's own.

Writes ``benchmarks/results/multihost.json`` and ``.png``; the hosts are taken
down at the end unless they were up before.

Run (as root, from the repository): ``.venv/bin/python benchmarks/multihost.py``
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys
import tempfile

from common import RESULTS, pyplot, save_report  # noqa: E402  (benchmarks/ is on sys.path)

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.multihost.rig import TWO_BY_TWO, RigError, hosts_sh, hosts_up, mpirun  # noqa: E402

SERIES = ("mpi4py", "hpcdist-mpi", "hpcdist-hierarchical", "hpcdist-auto")
TARGET = {"rate": "1gbit", "min_bytes": 16 << 20, "speedup": 1.3}


def run_rate(rate: str, args: argparse.Namespace, folder: str) -> dict:
    shaped = hosts_sh("shape", rate)
    if shaped.returncode != 0:
        raise SystemExit(f"tc failed for {rate}: {shaped.stdout}")
    name = f"multihost_{rate}"
    argv = ["-m", "hpcdist", "bench", "allreduce", "--min-bytes", args.min_bytes,
            "--max-bytes", args.max_bytes, "--no-gloo", "--stat", "min",
            "--repeats", str(args.repeats), "--resnet-repeats", str(args.resnet_repeats),
            "--out", folder, "--name", name]  # fmt: skip
    proc = mpirun(TWO_BY_TWO, argv, timeout=args.timeout)
    print(proc.stdout[-3000:])
    if proc.returncode != 0:
        raise SystemExit(f"the benchmark across the hosts failed at {rate} ({proc.returncode})")
    return json.loads((pathlib.Path(folder) / f"{name}.json").read_text())


def summarize(rate: str, raw: dict) -> dict:
    rows = []
    for row in raw["rows"]:
        seconds = {s: row["series"][s]["seconds"] for s in SERIES}
        rows.append(
            {
                "bytes": row["bytes"],
                "seconds": seconds,
                "speedup_over_raw": {s: seconds["mpi4py"] / seconds[s] for s in SERIES},
            }
        )
    return {
        "rate": rate,
        "nodes": raw["nodes"],
        "ranks": raw["ranks"],
        "mpi_library": raw["mpi_library"],
        "rows": rows,
        "resnet50": raw.get("resnet50"),
    }


def evaluate(rates: list[dict]) -> list[dict]:
    out = []
    for entry in rates:
        if entry["rate"] != TARGET["rate"]:
            continue
        big = [r for r in entry["rows"] if r["bytes"] >= TARGET["min_bytes"]]
        worst = min((r["speedup_over_raw"]["hpcdist-hierarchical"] for r in big), default=None)
        out.append(
            {
                "target": f"hierarchical >= {TARGET['speedup']}x raw MPI at >= 16 MiB "
                f"on {TARGET['rate']}",
                "worst": worst,
                "met": worst is not None and worst >= TARGET["speedup"],
            }
        )
    return out


def plot(rates: list[dict]) -> None:
    plt = pyplot()
    if plt is None:
        return
    fig, axes = plt.subplots(1, len(rates), figsize=(6 * len(rates), 4.5), squeeze=False)
    for ax, entry in zip(axes[0], rates, strict=True):
        x = [r["bytes"] for r in entry["rows"]]
        for s in SERIES[:3]:
            ax.loglog(x, [r["seconds"][s] for r in entry["rows"]], "o-", label=s, markersize=3)
        ax.set_title(f"allreduce, 2 hosts x 2 ranks, {entry['rate']} links")
        ax.set_xlabel("bytes (float32 SUM)")
        ax.set_ylabel("seconds per call (best)")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(RESULTS / "multihost.png", dpi=100)
    plt.close(fig)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rates", default="10gbit,1gbit", help="tc rates, comma-separated")
    p.add_argument("--min-bytes", default="4KiB")
    p.add_argument("--max-bytes", default="64MiB")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--resnet-repeats", type=int, default=2)
    p.add_argument("--timeout", type=float, default=1500, help="seconds per rate")
    args = p.parse_args()
    rates = []
    try:
        with hosts_up(2), tempfile.TemporaryDirectory() as folder:
            for rate in args.rates.split(","):
                rates.append(summarize(rate, run_rate(rate, args, folder)))
    except RigError as err:
        print(f"multihost benchmark: {err}")
        return err.code
    targets = evaluate(rates)
    report = {
        "benchmark": "multihost",
        "command": "python benchmarks/multihost.py " + " ".join(sys.argv[1:]),
        "layout": "2 hosts (network namespaces) x 2 ranks, TCP between hosts",
        "shaping": "tc tbf on each host's veth, both directions (burst 1 MB, 100 ms queue)",
        "statistic": "min",
        "rates": rates,
        "targets": targets,
    }
    save_report("multihost", report)
    plot(rates)
    for entry in rates:
        print(f"{entry['rate']}:")
        for r in entry["rows"]:
            s = r["speedup_over_raw"]
            print(f"  {r['bytes']:>10} B: raw {r['seconds']['mpi4py'] * 1e3:9.2f} ms, "
                  f"flat {s['hpcdist-mpi']:.2f}x, hierarchical {s['hpcdist-hierarchical']:.2f}x, "
                  f"auto {s['hpcdist-auto']:.2f}x")  # fmt: skip
    for t in targets:
        print(f"{'MET ' if t['met'] else 'MISSED'} {t['target']}: worst {t['worst']}")
    print(f"wrote {RESULTS / 'multihost.json'} and multihost.png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
