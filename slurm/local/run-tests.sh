#!/usr/bin/env bash
# Run tests/slurm against a real local SLURM: install it (if needed and possible), start it,
# run the tests with a hard timeout, stop what this script started. `make slurm-test` calls it.
#
# When no cluster can be had it prints "slurm tests SKIPPED: <reason>". That exits 0 only
# where this machine cannot run SLURM (not root and none running, no apt-get); as root with
# apt-get a skip fails the run unless HPCDIST_ALLOW_SKIP names slurm (tools/suite-skip.sh).
# When the cluster is up, the exit status is pytest's: a failing test fails the run.
#
# Environment: PYTHON [.venv/bin/python]  SLURM_TEST_TIMEOUT seconds [900]
#              SLURM_TEST_ARGS extra pytest arguments (e.g. "-k requeue")
#              and the knobs of start.sh (HPCDIST_SLURM_*).
set -uo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
cd "$REPO"
PYTHON=${PYTHON:-.venv/bin/python}
TIMEOUT=${SLURM_TEST_TIMEOUT:-900}
STATE_DIR=${HPCDIST_SLURM_DIR:-/var/spool/slurm-hpcdist}
export SLURM_CONF=${HPCDIST_SLURM_CONF:-/etc/slurm/slurm.conf}

# shellcheck source=../../tools/suite-skip.sh
source "$REPO/tools/suite-skip.sh"
# Root with apt-get (or SLURM already installed) can run this suite: a skip then fails.
able=0
if [[ $(id -u) -eq 0 ]] && { command -v apt-get >/dev/null 2>&1 || command -v slurmctld >/dev/null 2>&1; }; then
    able=1
fi
skip() { suite_skip slurm "$able" "$@"; }
log() { echo "run-tests.sh: $*"; }

[[ -x $PYTHON ]] || skip "no $PYTHON (run 'make install' first)"

cluster_up() {
    command -v scontrol >/dev/null 2>&1 && scontrol ping 2>/dev/null | grep -q "is UP"
}
pid_alive() { [[ -s $1 ]] && kill -0 "$(cat "$1")" 2>/dev/null; }

started=0
munge_started=0
# Stop what this script started (slurmd, slurmctld; munged too if it was not running).
stop_started() {
    ((started)) || return 0
    log "stopping the cluster this script started"
    if ((munge_started)); then "$HERE/stop.sh" --all; else "$HERE/stop.sh"; fi
    started=0
}
if [[ $(id -u) -ne 0 ]]; then
    # Only root can install and start the daemons; a cluster someone else runs is fine.
    cluster_up || skip "not root, so SLURM cannot be installed or started here (run as root," \
        "or start it with 'sudo slurm/local/start.sh' first)"
    log "not root; using the SLURM cluster that is already running"
else
    if command -v apt-get >/dev/null 2>&1 && command -v dpkg-query >/dev/null 2>&1; then
        # Installs what is missing (all of it on a fresh machine); a no-op otherwise.
        if ! install_out=$("$HERE/install.sh" 2>&1); then
            echo "$install_out" | tail -n 20
            skip "slurm/local/install.sh failed: $(echo "$install_out" | tail -n 1)"
        fi
        echo "$install_out" | tail -n 1
    else
        for bin in slurmctld slurmd srun munged; do
            command -v "$bin" >/dev/null 2>&1 ||
                skip "$bin is not installed and there is no apt-get to install SLURM (install" \
                    "slurmctld, slurmd, munge and libpmix2 with your package manager)"
        done
    fi
    pid_alive "$STATE_DIR/slurmctld.pid" || started=1
    if ! (munge -n 2>/dev/null | unmunge >/dev/null 2>&1); then munge_started=1; fi
    if ! start_out=$("$HERE/start.sh" 2>&1); then
        echo "$start_out" | tail -n 20
        stop_started >/dev/null 2>&1
        skip "the local cluster did not start: $(echo "$start_out" | tail -n 1)"
    fi
    echo "$start_out"
fi
trap stop_started EXIT

# Tell the tests' conftest that the cluster is meant to be up: if it is not usable, the
# tests fail instead of being skipped.
export HPCDIST_REQUIRE_SLURM=1
# shellcheck disable=SC2086 # SLURM_TEST_ARGS is split into pytest arguments on purpose
timeout -k 20 "$TIMEOUT" "$PYTHON" -m pytest -q -p no:cacheprovider --durations=5 \
    tests/slurm ${SLURM_TEST_ARGS:-}
status=$?
if ((status == 124 || status == 137)); then
    log "tests/slurm did not finish within ${TIMEOUT}s (SLURM_TEST_TIMEOUT); killed"
fi
exit "$status"
