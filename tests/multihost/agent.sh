#!/usr/bin/env bash
# Open MPI's launch agent for the namespace hosts (in place of ssh: --mca plm_ssh_agent):
#   agent.sh HOST COMMAND...
# runs COMMAND (joined as ssh would join it) in HOST's network namespace, under its own
# UTS namespace whose host name is HOST. The mount namespace is shared, so every host sees
# this machine's files, as hosts on a shared file system do.
set -euo pipefail
host=$1
shift
exec nsenter --net="/var/run/netns/$host" unshare --uts \
    bash -c 'hostname "$0" && exec bash -c "$*"' "$host" "$@"
