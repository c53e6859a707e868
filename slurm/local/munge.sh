# Sourced by start.sh (and tests/multihost/slurm.sh): start_munge starts munged (one key for
# every node of this machine) unless it already answers. Needs log() and die() defined.
start_munge() {
    if munge -n 2>/dev/null | unmunge >/dev/null 2>&1; then
        log "munged already running"
        return
    fi
    if [[ ! -s /etc/munge/munge.key ]]; then
        log "generating /etc/munge/munge.key"
        mkdir -p /etc/munge
        if command -v mungekey >/dev/null 2>&1; then
            mungekey --create --keyfile=/etc/munge/munge.key
        else
            dd if=/dev/urandom of=/etc/munge/munge.key bs=1 count=1024 status=none
        fi
    fi
    local user=root
    if id munge >/dev/null 2>&1; then user=munge; fi
    mkdir -p /run/munge /var/lib/munge /var/log/munge
    chown "$user" /etc/munge /etc/munge/munge.key /run/munge /var/lib/munge /var/log/munge
    chmod 700 /etc/munge /var/log/munge
    chmod 600 /etc/munge/munge.key
    chmod 755 /run/munge
    log "starting munged as $user"
    if [[ $user == root ]]; then
        munged --force || die "munged failed to start; see /var/log/munge/munged.log"
    else
        runuser -u munge -- munged || die "munged failed to start; see /var/log/munge/munged.log"
    fi
    for _ in $(seq 1 20); do
        munge -n 2>/dev/null | unmunge >/dev/null 2>&1 && return
        sleep 0.25
    done
    die "munged started but 'munge -n | unmunge' fails; see /var/log/munge/munged.log"
}
