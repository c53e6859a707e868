"""What the 1 Gbit/s multi-host rig's link gives MPI and gloo: point-to-point and allreduce.

Brings up two hosts of ``tests/multihost/hosts.sh`` (root only), shapes each link with
``tc tbf`` to ``--rate`` (default 1gbit) and runs one job of 2 hosts x 1 rank per Open MPI
setting (the default, then a few TCP transport parameters) that measures, for 1-64 MiB:

* ``Sendrecv`` between the two ranks (both directions at once, as a ring step does):
  MB/s per direction;
* eight concurrent ``Isend``/``Irecv`` pieces of the same message: MB/s;
* ``Allreduce`` of float32 (MPI's own algorithm) and, in the default run, gloo's
  ``all_reduce`` (``torch.distributed``) of the same bytes: seconds.

The wire bound of a 2-rank allreduce of ``B`` bytes is ``B`` per direction
(reduce-scatter and all-gather of ``B / 2`` each). Writes ``benchmarks/results/rig_tcp.json``
and ``.png``. Run it as ``flock /tmp/hpcdist-rig.lock .venv/bin/python benchmarks/rig_tcp.py``.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import socket
import subprocess
import sys
import time
from typing import Any

import numpy as np

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

from common import RESULTS, pyplot, save_report  # noqa: E402

NAME = "rig_tcp"
LAYOUT = (("hpcn1", 1), ("hpcn2", 1))
SIZES_MB = (1, 4, 16, 64)
SETTINGS: dict[str, dict[str, int]] = {
    "default": {},
    "buffers_4MiB": {"btl_tcp_sndbuf": 4 << 20, "btl_tcp_rcvbuf": 4 << 20},
    "links_2": {"btl_tcp_links": 2},
    "fragments_1MiB": {"btl_tcp_max_send_size": 1 << 20, "btl_tcp_eager_limit": 1 << 20,
                        "btl_tcp_rndv_eager_limit": 1 << 20},  # fmt: skip
}


def _median(fn: Any, comm: Any, reps: int) -> float:
    fn()
    times = []
    for _ in range(reps):
        comm.Barrier()
        start = time.perf_counter()
        fn()
        comm.Barrier()
        times.append(time.perf_counter() - start)
    return float(np.median(times))


def worker(args: argparse.Namespace) -> int:
    from mpi4py import MPI  # lazy: only in the worker

    comm = MPI.COMM_WORLD
    peer = 1 - comm.rank
    out: dict[str, dict[str, float]] = {"sendrecv_MBps": {}, "isend8_MBps": {},
                                        "allreduce_s": {}, "gloo_allreduce_s": {}}  # fmt: skip
    for mb in SIZES_MB:
        nbytes = mb << 20
        a, b = np.ones(nbytes, np.uint8), np.empty(nbytes, np.uint8)

        def pieces(a: np.ndarray = a, b: np.ndarray = b, k: int = 8) -> None:
            step = len(a) // k
            reqs = []
            for i in range(k):
                reqs.append(comm.Irecv(b[i * step : (i + 1) * step], peer, 2))
                reqs.append(comm.Isend(a[i * step : (i + 1) * step], peer, 2))
            MPI.Request.Waitall(reqs)

        t = _median(lambda a=a, b=b: comm.Sendrecv(a, peer, 1, b, peer, 1), comm, args.reps)
        out["sendrecv_MBps"][str(mb)] = nbytes / t / 1e6
        out["isend8_MBps"][str(mb)] = nbytes / _median(pieces, comm, args.reps) / 1e6
        f = np.ones(nbytes // 4, np.float32)
        out["allreduce_s"][str(mb)] = _median(
            lambda f=f: comm.Allreduce(MPI.IN_PLACE, f, MPI.SUM), comm, args.reps
        )
    if args.gloo:
        import torch  # lazy: optional framework, only in the worker
        import torch.distributed as dist

        torch.set_num_threads(1)
        host = comm.bcast(socket.gethostbyname(socket.gethostname()), root=0)
        port = comm.bcast(29500 + int(np.random.default_rng().integers(0, 2000)), root=0)
        dist.init_process_group("gloo", init_method=f"tcp://{host}:{port}", rank=comm.rank,
                                world_size=comm.size)  # fmt: skip
        for mb in SIZES_MB:
            x = torch.ones((mb << 20) // 4)
            out["gloo_allreduce_s"][str(mb)] = _median(lambda x=x: dist.all_reduce(x), comm,
                                                       args.reps)  # fmt: skip
        dist.destroy_process_group()
    if comm.rank == 0:
        pathlib.Path(args.out).write_text(json.dumps(out))
    return 0


def plot(report: dict) -> None:
    plt = pyplot()
    if plt is None:
        return
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4.2))
    for name, r in report["settings"].items():
        a.plot(SIZES_MB, [r["sendrecv_MBps"][str(m)] for m in SIZES_MB], "o-", label=name)
        b.plot(SIZES_MB, [r["allreduce_s"][str(m)] for m in SIZES_MB], "o-", label=f"MPI, {name}")
    gloo = report["settings"]["default"]["gloo_allreduce_s"]
    b.plot(SIZES_MB, [gloo[str(m)] for m in SIZES_MB], "k^--", label="gloo")
    b.plot(SIZES_MB, [(m << 20) / report["link_Bps"] for m in SIZES_MB], "k:", label="wire bound")
    a.axhline(report["link_Bps"] / 1e6, color="k", ls=":", label="link rate")
    a.set(xscale="log", xlabel="message MiB", ylabel="MB/s per direction",
          title="Sendrecv between the two hosts")  # fmt: skip
    b.set(xscale="log", yscale="log", xlabel="MiB reduced", ylabel="seconds",
          title="allreduce of float32, 2 ranks")  # fmt: skip
    a.legend(fontsize=7)
    b.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(RESULTS / f"{NAME}.png", dpi=100)
    plt.close(fig)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--gloo", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--out", default="")
    p.add_argument("--rate", default="1gbit")
    p.add_argument("--reps", type=int, default=3)
    args = p.parse_args()
    if args.worker:
        return worker(args)
    import tempfile  # lazy: the driver only

    from tests.multihost.rig import (  # lazy: the rig
        MPIRUN,
        RigError,
        hosts_up,
        job_env,
        mpirun_args,
    )

    settings = {}
    try:
        with hosts_up(2, args.rate):
            with tempfile.TemporaryDirectory() as folder:
                for name, mca in SETTINGS.items():
                    out = pathlib.Path(folder) / "raw.json"
                    command = [MPIRUN, "-n", "2", *mpirun_args(LAYOUT)]
                    for key, value in mca.items():
                        command += ["--mca", key, str(value)]
                    command += [sys.executable, str(pathlib.Path(__file__).resolve()), "--worker",
                                "--out", str(out), "--reps", str(args.reps)]  # fmt: skip
                    if name == "default":
                        command.append("--gloo")
                    proc = subprocess.run(
                        command, env=job_env({"GLOO_SOCKET_IFNAME": "eth0"}), cwd=REPO,
                        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=300,
                        check=False,
                    )  # fmt: skip
                    if proc.returncode != 0:
                        print(proc.stdout[-4000:])
                        return 1
                    settings[name] = {"mca": mca, **json.loads(out.read_text())}
    except RigError as err:
        print(f"{NAME}: {err}")
        return err.code
    rate = float(args.rate.removesuffix("gbit")) * 125e6 if args.rate.endswith("gbit") else 125e6
    report = {
        "benchmark": NAME,
        "command": "flock /tmp/hpcdist-rig.lock python benchmarks/rig_tcp.py "
        + " ".join(sys.argv[1:]),
        "layout": "2 hosts (network namespaces) x 1 rank, TCP between hosts",
        "shaping": f"tc tbf on each host's veth, both directions, {args.rate}",
        "statistic": f"median of {args.reps}",
        "link_Bps": rate,
        "settings": settings,
    }
    save_report(NAME, report)
    plot(report)
    for name, r in settings.items():
        print(f"{name:22s} sendrecv MB/s", {k: round(v, 1) for k, v in r["sendrecv_MBps"].items()},
              "allreduce s", {k: round(v, 3) for k, v in r["allreduce_s"].items()})  # fmt: skip
    print("gloo allreduce s", settings["default"]["gloo_allreduce_s"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
