#!/usr/bin/env bash
# Separate hosts on one machine, for tests that cross a real network: network namespaces
# hpcn1..hpcnN joined by a bridge, each with its own address and (through agent.sh) its own
# host name. Root only. Every command is idempotent.
#
#   hosts.sh up N          bring up hosts hpcn1..hpcnN (removes any beyond N)
#   hosts.sh down          remove every host, the bridge and the /etc/hosts lines
#   hosts.sh shape RATE    limit each host's traffic, both directions, to RATE (tc tbf:
#                          e.g. 1gbit, 10gbit); "hosts.sh shape off" removes the limit
#   hosts.sh status        print the hosts and their addresses
#   hosts.sh check         exit 0 when this machine can run the rig, else print why, exit 1
#
# Addresses: $HPCDIST_MH_NET.0/24 (default 10.231.77): the bridge is .1, host i is .(10+i).
# Traffic goes only between these addresses (and loopback); nothing else is ever a target:
# the namespaces have no default route and the bridge forwards nowhere else.
set -Eeuo pipefail
trap 'echo "hosts.sh: failed at line $LINENO (exit $?): $BASH_COMMAND" >&2' ERR

NET=${HPCDIST_MH_NET:-10.231.77}
BRIDGE=hpcbr0
PREFIX=hpcn
MARK="# hpcdist-multihost"

log() { echo "hosts.sh: $*"; }
die() {
    echo "hosts.sh: $*" >&2
    exit 1
}

check() {
    [[ $(id -u) -eq 0 ]] || {
        echo "not root: network namespaces need root (run as root or sudo)"
        return 1
    }
    local bin
    for bin in ip nsenter unshare tc; do
        command -v "$bin" >/dev/null 2>&1 || {
            echo "$bin not found (Debian: apt-get install iproute2 util-linux)"
            return 1
        }
    done
    if ! ip netns add hpcdist-probe 2>/dev/null; then
        echo "'ip netns add' fails here (no network-namespace support in this kernel/container)"
        return 1
    fi
    ip netns del hpcdist-probe
}

hosts_up() { ip netns list 2>/dev/null | awk '{print $1}' | grep -E "^$PREFIX[0-9]+$" | sort -V || true; }

add_host() { # i
    local i=$1 name=$PREFIX$1 addr=$NET.$((10 + $1))
    if ! ip netns list | awk '{print $1}' | grep -qx "$name"; then
        ip netns add "$name"
    fi
    if ! ip link show "hpcv$i" >/dev/null 2>&1; then
        ip link add "hpcv$i" type veth peer name eth0 netns "$name"
    fi
    ip link set "hpcv$i" master "$BRIDGE" up
    ip -n "$name" link set lo up
    ip -n "$name" addr replace "$addr/24" dev eth0
    ip -n "$name" link set eth0 up
    # The host names of the namespaces resolve everywhere through /etc/hosts.
    grep -q "^$addr $name $MARK\$" /etc/hosts || echo "$addr $name $MARK" >>/etc/hosts
}

del_host() { # name
    local name=$1 i=${1#"$PREFIX"}
    ip link del "hpcv$i" 2>/dev/null || true
    ip netns del "$name" 2>/dev/null || true
    remove_hosts_line "$name"
}

remove_hosts_line() { # name (all when empty)
    local pattern="$MARK\$"
    [[ -z ${1:-} ]] || pattern=" $1 $MARK\$"
    if grep -qE "$pattern" /etc/hosts; then
        # /etc/hosts may be a bind mount: rewrite it in place rather than replacing the file.
        local kept
        kept=$(grep -vE "$pattern" /etc/hosts || true)
        printf '%s\n' "$kept" >/etc/hosts
    fi
}

up() { # N
    local n=$1 i name
    [[ $n =~ ^[1-9][0-9]?$ ]] || die "up: N must be 1..99, not '$n'"
    local why
    why=$(check) || die "cannot start the hosts: $why"
    if ! ip link show "$BRIDGE" >/dev/null 2>&1; then
        ip link add "$BRIDGE" type bridge
    fi
    ip addr replace "$NET.1/24" dev "$BRIDGE"
    ip link set "$BRIDGE" up
    for i in $(seq 1 "$n"); do add_host "$i"; done
    for name in $(hosts_up); do
        ((${name#"$PREFIX"} <= n)) || del_host "$name"
    done
    # The veth pairs come up asynchronously: wait until every host's link is up.
    for i in $(seq 1 "$n"); do
        local ok=0
        for _ in $(seq 1 50); do
            if ip -n "$PREFIX$i" -br link show eth0 | grep -qw UP; then
                ok=1
                break
            fi
            sleep 0.1
        done
        ((ok)) || die "host $PREFIX$i: eth0 did not come up"
    done
    log "up: $(hosts_up | tr '\n' ' ')(bridge $BRIDGE $NET.1/24)"
}

down() {
    local name
    for name in $(hosts_up); do del_host "$name"; done
    ip link del "$BRIDGE" 2>/dev/null || true
    remove_hosts_line ""
    log "down"
}

shape() { # RATE|off
    # A burst of 1 MB (at least rate/HZ) and a queue of 100 ms: a link that queues rather
    # than drops, as a switched interconnect does (tbf; this kernel has no netem for delay).
    local rate=$1 name i burst=1mb
    for name in $(hosts_up); do
        i=${name#"$PREFIX"}
        # Egress of the host's eth0 (what it sends) and of its bridge port (what it receives).
        nsenter --net="/var/run/netns/$name" tc qdisc del dev eth0 root 2>/dev/null || true
        tc qdisc del dev "hpcv$i" root 2>/dev/null || true
        if [[ $rate != off ]]; then
            nsenter --net="/var/run/netns/$name" \
                tc qdisc add dev eth0 root tbf rate "$rate" burst "$burst" latency 100ms
            tc qdisc add dev "hpcv$i" root tbf rate "$rate" burst "$burst" latency 100ms
        fi
    done
    log "shape: ${rate} on $(hosts_up | tr '\n' ' ')"
}

status() {
    local name
    for name in $(hosts_up); do
        printf '%s %s\n' "$name" "$(ip -n "$name" -br -4 addr show eth0 | awk '{print $3}')"
    done
}

case ${1:-} in
up) up "${2:?usage: hosts.sh up N}" ;;
down) down ;;
shape) shape "${2:?usage: hosts.sh shape RATE|off}" ;;
status) status ;;
check) check ;;
*) die "usage: hosts.sh up N | down | shape RATE|off | status | check" ;;
esac
