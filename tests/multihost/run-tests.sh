#!/usr/bin/env bash
# `make multihost-test`: tests/multihost across network-namespace hosts (hosts.sh), as root.
# The hosts are taken down on exit, also after a failure or a timeout.
#
# Where the hosts cannot start it prints "multihost tests SKIPPED: <reason>"; that is a
# failure wherever this machine could run them (root), unless HPCDIST_ALLOW_SKIP names
# multihost (tools/suite-skip.sh).
#
# Environment: PYTHON [.venv/bin/python]  MULTIHOST_TEST_TIMEOUT seconds [1500]
#              MULTIHOST_TEST_ARGS extra pytest arguments (e.g. "-k info")
set -uo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
cd "$REPO"
PYTHON=${PYTHON:-.venv/bin/python}
TIMEOUT=${MULTIHOST_TEST_TIMEOUT:-1500}
# shellcheck source=../../tools/suite-skip.sh
source "$REPO/tools/suite-skip.sh"
able=0
[[ $(id -u) -eq 0 ]] && able=1

[[ -x $PYTHON ]] || suite_skip multihost "$able" "no $PYTHON (run 'make install' first)"
if ! why=$("$HERE/hosts.sh" check 2>&1); then
    suite_skip multihost "$able" "$why"
fi
# The SLURM part needs the packages of slurm/local/ (installed once; a no-op after that).
if ! command -v slurmctld >/dev/null 2>&1 && command -v apt-get >/dev/null 2>&1; then
    "$REPO/slurm/local/install.sh" | tail -n 1 || echo "run-tests.sh: SLURM did not install;" \
        "the SLURM tests across the hosts will fail"
fi
trap '"$HERE/slurm.sh" down >/dev/null 2>&1; "$HERE/hosts.sh" down >/dev/null 2>&1' EXIT
export HPCDIST_REQUIRE_MULTIHOST=1
# shellcheck disable=SC2086 # MULTIHOST_TEST_ARGS is split into pytest arguments on purpose
timeout -k 20 "$TIMEOUT" "$PYTHON" -m pytest -q -p no:cacheprovider --durations=5 \
    tests/multihost ${MULTIHOST_TEST_ARGS:-}
status=$?
if ((status == 124 || status == 137)); then
    echo "run-tests.sh: tests/multihost did not finish within ${TIMEOUT}s; killed"
fi
exit "$status"
