#!/usr/bin/env bash
# Debian packages for the scripts, waiting for whatever else runs apt or dpkg
# (unattended upgrades, a second script started beside this one) to let go of
# its locks instead of failing at once on them:
#   scripts/apt.sh update              refresh the package lists
#   scripts/apt.sh install [opts] pkg  refresh them, then install quietly
# apt-get waits for dpkg's lock when told to (DPkg::Lock::Timeout), but
# `apt-get update` gives up on the lists' lock at once, so that is retried;
# each of the two waits up to WAIT_SECS (TOLLGATE_APT_WAIT_SECS, 600 unless
# set: its test sets a few seconds).
set -euo pipefail
WAIT_SECS=${TOLLGATE_APT_WAIT_SECS:-600}
[[ $WAIT_SECS =~ ^[0-9]+$ ]] || { echo "apt: TOLLGATE_APT_WAIT_SECS is not a number of seconds: $WAIT_SECS" >&2; exit 2; }

update() {
    local waited=0 err
    # LC_ALL=C: the lock's message is matched in apt's own words.
    while ! err=$(LC_ALL=C apt-get update -qq 2>&1 >/dev/null); do
        case $err in
            *"Could not get lock"*) ;;
            *) echo "$err" >&2; return 1 ;;
        esac
        if ((waited >= WAIT_SECS)); then
            echo "$err" >&2
            echo "apt: the package lists stayed locked for ${WAIT_SECS}s" >&2
            return 1
        fi
        ((waited > 0)) || echo "apt: waiting for another apt to let go of the package lists" >&2
        sleep 5
        waited=$((waited + 5))
    done
    [ -z "$err" ] || echo "$err" >&2
}

case "${1:-}" in
    update) update ;;
    install)
        shift
        update
        DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout="$WAIT_SECS" \
            install -y -qq "$@" >/dev/null
        ;;
    *) echo "usage: scripts/apt.sh update | install [apt-get options] package..." >&2; exit 2 ;;
esac
