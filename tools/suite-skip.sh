#!/usr/bin/env bash
# Sourced by the scripts that start a test suite needing this machine's services
# (slurm/local/run-tests.sh, tests/multihost/run-tests.sh, ...).
#
#   suite_skip NAME ABLE REASON...
#
# Prints "NAME tests SKIPPED: REASON". ABLE=1 says this machine could run the suite
# (root, the tools at hand): then the skip is a failure (exit 1), so that `make test`
# and CI cannot pass with the suite left out, unless the user opted out explicitly with
# HPCDIST_ALLOW_SKIP=NAME (a comma-separated list; "all" allows every skip).
# ABLE=0 (the machine cannot run it at all, e.g. not root): exit 0.

suite_skip() {
    local name=$1 able=$2
    shift 2
    echo "$name tests SKIPPED: $*"
    local allowed=",${HPCDIST_ALLOW_SKIP:-},"
    if [[ $able == 1 && $allowed != *",$name,"* && $allowed != *",all,"* ]]; then
        echo "$name tests: this machine can run them, so a skip fails the run;" \
            "set HPCDIST_ALLOW_SKIP=$name to skip them on purpose" >&2
        exit 1
    fi
    exit 0
}
