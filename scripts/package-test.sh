#!/usr/bin/env bash
# Builds the Debian package, installs it on this machine with dpkg and runs
# what it installed, as the service would: `tollgate check-config` on
# /etc/tollgate/tollgate.toml, then `serve` answering /healthz, reloading on
# SIGHUP and exiting 0 on SIGTERM. Then purges it, leaving the machine as it
# was. Run by scripts/test.sh after cargo test; runs alone too.
#
# It packages the dev build (target/debug/tollgate, which cargo test has just
# built) with `cargo deb --no-build --profile dev`: a release build would add
# about 8 minutes to CI for the same files and scripts. Releases are built
# with `cargo deb --profile dist` (docs/packaging.md).
#
# Needs root (dpkg -i) and refuses to touch a tollgate package it did not
# install. Prints one line per check, then `package: N passed, N failed`.
set -euo pipefail
cd "$(dirname "$0")/.."
CARGO_DEB_VERSION=3.8.0
CONFIG=/etc/tollgate/tollgate.toml
UNIT=/usr/lib/systemd/system/tollgate.service
# Longest wait for the server to start or stop (polled, not slept).
DEADLINE_SECS=30

if [ "$(id -u)" != 0 ] || ! command -v dpkg >/dev/null; then
    echo "package: skipped: needs root and dpkg (a Debian system)"
    exit 0
fi
if dpkg-query -W -f='${Status}' tollgate 2>/dev/null | grep -q installed; then
    echo "package: FAIL: a tollgate package is installed already; not touching it (dpkg --purge tollgate)" >&2
    echo "package: 0 passed, 1 failed"
    exit 1
fi

# A failure while setting up still counts, in test.sh's summary too.
trap '[ $? = 0 ] || { echo "package: FAILED  setting up (see above)"; echo "package: 0 passed, 1 failed"; }' EXIT

# Debian packages the checks use, installed when missing (as services.sh
# does for Redis and PostgreSQL).
missing=()
command -v adduser >/dev/null || missing+=(adduser)
command -v curl >/dev/null || missing+=(curl)
command -v strace >/dev/null || missing+=(strace)
command -v systemd-analyze >/dev/null || missing+=(systemd)
if ((${#missing[@]})); then
    echo "package: installing ${missing[*]}"
    scripts/apt.sh install "${missing[@]}"
fi

export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/tollgate-target}"
# cargo-deb (crates.io) in a directory outside the clone, pinned like the
# other test tools; built with its own target dir, as CARGO_TARGET_DIR may be
# locked by a build.
tools="${TOLLGATE_TOOLS:-$HOME/.cache/tollgate-tools}"
if ! "$tools/bin/cargo-deb" --version 2>/dev/null | grep -q "$CARGO_DEB_VERSION"; then
    env -u CARGO_TARGET_DIR cargo install --quiet --locked --root "$tools" cargo-deb --version "$CARGO_DEB_VERSION"
fi
export PATH="$tools/bin:$PATH"

work=$(mktemp -d)
server_pid=
tollgate_pid=
user_existed=$(getent passwd tollgate >/dev/null && echo yes || echo no)
cleanup() {
    if [ -n "$tollgate_pid" ]; then kill -KILL "$tollgate_pid" 2>/dev/null || true; fi
    if [ -n "$server_pid" ]; then { kill -KILL "$server_pid" && wait "$server_pid"; } 2>/dev/null || true; fi
    if dpkg-query -W -f='${Status}' tollgate 2>/dev/null | grep -q installed; then
        dpkg --purge tollgate >/dev/null 2>&1 || true
    fi
    # The package leaves its system user on purge (Debian's practice); the
    # test removes the one its install made.
    if [ "$user_existed" = no ] && getent passwd tollgate >/dev/null; then
        userdel tollgate 2>/dev/null || true
        if getent group tollgate >/dev/null; then groupdel tollgate 2>/dev/null || true; fi
    fi
    rm -rf "$work"
}
trap cleanup EXIT

# The checks run in order, each needing the ones before it (installed, then
# serving, then purged): the first that fails stops the run, and it and those
# after it count as failed. Each prints its output only when it fails.
passed=0
current=
# Runs from the EXIT trap, where a failed check's redirection to check.out
# may still be in force: it writes to fd 3, the script's own stdout.
exec 3>&1
report() {
    {
        echo "package: FAILED  $current"
        sed 's/^/    /' "$work/check.out"
        echo "package: $passed passed, $1 failed"
    } >&3
}
# Called with `set -e` in force (never inside `if`), so any failing command
# of a check ends the run; `fail` says why.
fail() { echo "$*"; return 1; }

build_the_package() {
    cargo build --locked --quiet --bin tollgate
    # It warns that the dev profile is unsupported: see the top of this file.
    cargo deb --no-build --profile dev --locked --fast --output "$work/"
    deb=$(ls "$work"/tollgate_*.deb) || fail "no .deb in $work"
}

it_holds_the_binary_the_config_and_the_unit() {
    dpkg-deb -c "$deb" >"$work/contents"
    cat "$work/contents"
    for file in ./usr/bin/tollgate ".$CONFIG" ".$UNIT"; do
        grep -q " $file\$" "$work/contents" || fail "missing: $file"
    done
}

it_installs_and_registers_the_config_as_a_conffile() {
    dpkg -i "$deb"
    dpkg-query -W -f='${Conffiles}\n' tollgate | tee "$work/conffiles"
    grep -q "^ $CONFIG [0-9a-f]\{32\}\$" "$work/conffiles" || fail "$CONFIG is not a conffile"
}

# postinst: the system user, the state directory, a config only it can read.
it_creates_the_user_and_keeps_the_config_private() {
    getent passwd tollgate || fail "no tollgate user"
    local config state
    config=$(stat -c '%a %U:%G' "$CONFIG")
    state=$(stat -c '%a %U:%G' /var/lib/tollgate)
    [ "$config" = "640 root:tollgate" ] || fail "$CONFIG is $config"
    [ "$state" = "750 tollgate:tollgate" ] || fail "/var/lib/tollgate is $state"
}

the_unit_verifies_and_is_hardened() {
    systemd-analyze verify "$UNIT"
    # Exposure on systemd's 0-10 scale: 1.1 as shipped; above 1.5 someone
    # loosened it.
    systemd-analyze security --offline=true --threshold=15 "$UNIT" | tail -1
}

# The service's user and groups, as systemd's User= and Group= give them.
as_tollgate=(setpriv --reuid=tollgate --regid=tollgate --init-groups --)

check_config_accepts_the_installed_config() {
    "${as_tollgate[@]}" /usr/bin/tollgate --config "$CONFIG" check-config >"$work/effective.toml"
    grep -q '^database_url = "sqlite:///var/lib/tollgate/audit.db?mode=rwc"$' "$work/effective.toml" \
        || fail "check-config did not print the installed config's audit.database_url: $(cat "$work/effective.toml")"
}

wait_for_log() {
    local pattern=$1 waited=0
    until grep -q "$pattern" "$work/serve.log"; do
        kill -0 "$server_pid" 2>/dev/null || fail "tollgate exited: $(cat "$work/serve.log")"
        [ "$waited" -lt $((DEADLINE_SECS * 10)) ] || fail "no \"$pattern\" within ${DEADLINE_SECS}s: $(cat "$work/serve.log")"
        sleep 0.1
        waited=$((waited + 1))
    done
}

status_of() { curl -s -o /dev/null -w '%{http_code}' "$@"; }

# As the unit runs it: user tollgate, in /var/lib/tollgate; port 0 instead
# of the config's 8080 through the environment, so nothing can be in the way.
# Under strace, for the system call check below.
serve_answers_healthz_and_readyz() {
    (cd /var/lib/tollgate && TOLLGATE__SERVER__BIND=127.0.0.1:0 exec strace -f -qq -o "$work/syscalls" \
        "${as_tollgate[@]}" /usr/bin/tollgate --config "$CONFIG" serve) >"$work/serve.log" 2>&1 &
    server_pid=$!
    wait_for_log '"tollgate listening"'
    # strace is the parent; signals go to tollgate, the only process of its user.
    tollgate_pid=$(pgrep -u tollgate -x tollgate)
    address=$(grep '"tollgate listening"' "$work/serve.log" | sed -n 's/.*"address":"\([^"]*\)".*/\1/p' | head -1)
    [ -n "$address" ] || fail "no address in: $(cat "$work/serve.log")"
    local health ready
    health=$(status_of "http://$address/healthz")
    [ "$health" = 200 ] || fail "/healthz answered $health"
    # Ready means the SQLite audit file opened: the state directory is writable.
    ready=$(status_of "http://$address/readyz")
    [ "$ready" = 200 ] || fail "/readyz answered $ready: $(cat "$work/serve.log")"
    [ "$(stat -c %U /var/lib/tollgate/audit.db)" = tollgate ] || fail "audit.db is not tollgate's"
    # A decision and a refusal, which the audit writer stores, so that the
    # traced system calls include that path.
    local send=(-H 'content-type: application/json' -d '{"phone": "+8613800138000"}' "http://$address/sms/send")
    [ "$(status_of "${send[@]}")" = 200 ] || fail "the first /sms/send was not sent"
    [ "$(status_of "${send[@]}")" = 429 ] || fail "the second /sms/send was not refused"
}

# What `systemctl reload tollgate` (ExecReload) sends.
sighup_reloads_the_config() {
    kill -HUP "$tollgate_pid"
    wait_for_log '"settings reloaded","cause":"Hangup"'
    [ "$(status_of "http://$address/healthz")" = 200 ] || fail "no /healthz after SIGHUP"
}

# server.watch_config (on by default): saving the installed file reloads it,
# through the inotify watch the hardened unit must allow.
saving_the_config_reloads_it() {
    echo "# edited by scripts/package-test.sh" >>"$CONFIG"
    wait_for_log '"settings reloaded","cause":"FileChanged"'
}

# What systemd sends on stop: drain, then exit 0 (not a failure to restart).
sigterm_stops_it_with_status_0() {
    kill -TERM "$tollgate_pid"
    local waited=0
    while kill -0 "$server_pid" 2>/dev/null; do
        [ "$waited" -lt $((DEADLINE_SECS * 10)) ] || fail "still running ${DEADLINE_SECS}s after SIGTERM"
        sleep 0.1
        waited=$((waited + 1))
    done
    local status=0
    wait "$server_pid" || status=$?
    server_pid=
    [ "$status" = 0 ] || fail "exited with $status: $(tail -5 "$work/serve.log")"
}

# The system calls of a syscall group, nested groups expanded; a call's own
# name is itself.
syscalls_of() {
    local name
    case $1 in
        @*) ;;
        *) echo "$1"; return ;;
    esac
    systemd-analyze syscall-filter "$1" | sed -n 's/^    \([^#].*\)$/\1/p' | while read -r name; do
        case $name in @*) syscalls_of "$name" ;; *) echo "$name" ;; esac
    done
}

# systemd kills a service that makes a call its SystemCallFilter= forbids
# (here: EPERM), and no systemd runs here to show it. So: every call
# tollgate made above, from its exec on, must be in what the unit allows.
# That covers start-up, HTTP, the in-process store, SQLite, reloads (SIGHUP
# and the file watch) and drain; not Redis, PostgreSQL, TLS or SMTP.
the_unit_allows_every_system_call_it_made() {
    # As systemd reads the lines, in order: the first (an allow list) sets
    # what is allowed, a `~` line takes calls away, a later allow line
    # gives calls back.
    local line group
    : >"$work/permitted"
    grep -q '^SystemCallFilter=[^~]' "$UNIT" || fail "no SystemCallFilter= allow list in $UNIT"
    while read -r line; do
        for group in ${line#\~}; do syscalls_of "$group"; done | sort -u >"$work/these"
        case $line in
            \~*) comm -23 "$work/permitted" "$work/these" >"$work/next" ;;
            *) sort -u "$work/permitted" "$work/these" >"$work/next" ;;
        esac
        mv "$work/next" "$work/permitted"
    done < <(sed -n 's/^SystemCallFilter=\(.*\)$/\1/p' "$UNIT")
    sed -n '\|execve("/usr/bin/tollgate"|,$p' "$work/syscalls" \
        | sed -n 's/^[0-9]* *\([a-z0-9_]*\)(.*/\1/p' | sort -u >"$work/made"
    [ "$(wc -l <"$work/made")" -gt 20 ] || fail "too few calls traced: $(cat "$work/made")"
    local forbidden
    forbidden=$(comm -23 "$work/made" "$work/permitted")
    [ -z "$forbidden" ] || fail "made, but not allowed by the unit: $forbidden"
    echo "$(wc -l <"$work/made") distinct calls, all allowed"
}

# A reinstall (the upgrade path of the maintainer scripts) keeps what the
# operator wrote and the file's owner and mode.
an_upgrade_keeps_an_edited_config() {
    sed -i 's/^bind = "127.0.0.1:8080"$/bind = "127.0.0.1:18080"/' "$CONFIG"
    grep -q '^bind = "127.0.0.1:18080"$' "$CONFIG" || fail "could not edit $CONFIG"
    dpkg -i "$deb" </dev/null
    grep -q '^bind = "127.0.0.1:18080"$' "$CONFIG" || fail "the edit was lost"
    [ "$(stat -c '%a %U:%G' "$CONFIG")" = "640 root:tollgate" ] || fail "$CONFIG is now $(stat -c '%a %U:%G' "$CONFIG")"
}

purge_removes_it_all() {
    dpkg --purge tollgate
    for path in /usr/bin/tollgate "$CONFIG" /etc/tollgate "$UNIT" /var/lib/tollgate; do
        [ ! -e "$path" ] || fail "still there after purge: $path"
    done
    if dpkg-statoverride --list "$CONFIG"; then fail "statoverride left behind"; fi
    ! ls -d /var/backups/tollgate-spool-* 2>/dev/null || fail "a spool kept, with nothing unwritten in it"
}

# Events the spool holds that never reached the database (PostgreSQL down
# when the service stopped) are their only copy: a purge keeps them.
purge_keeps_unwritten_audit_events() {
    dpkg -i "$deb" </dev/null
    local spool=/var/lib/tollgate/spool
    install -d -o tollgate -g tollgate -m 0750 "$spool"
    echo '{"an":"event"}' > "$spool/journal-0-000001.jsonl"
    echo 'a line' > "$spool/journal-0-000000.jsonl.unread"
    dpkg --purge tollgate 2>"$work/purge.err"
    [ ! -e /var/lib/tollgate ] || fail "/var/lib/tollgate is still there"
    local kept
    kept=$(ls -d /var/backups/tollgate-spool-* 2>/dev/null | head -1)
    [ -n "$kept" ] || fail "the unwritten events were deleted"
    grep -q "$kept" "$work/purge.err" || fail "purge did not say where: $(cat "$work/purge.err")"
    [ "$(cat "$kept/journal-0-000001.jsonl")" = '{"an":"event"}' ] || fail "the journal segment was not kept"
    [ -e "$kept/journal-0-000000.jsonl.unread" ] || fail "the unreadable lines were not kept"
    rm -rf /var/backups/tollgate-spool-*
}

checks=(
    "cargo deb builds the package|build_the_package"
    "dpkg -c lists /usr/bin/tollgate, $CONFIG and $UNIT|it_holds_the_binary_the_config_and_the_unit"
    "dpkg -i installs it, $CONFIG registered as a conffile|it_installs_and_registers_the_config_as_a_conffile"
    "postinst makes user tollgate, its state dir, the config 0640 root:tollgate|it_creates_the_user_and_keeps_the_config_private"
    "systemd-analyze verifies the unit, exposure at most 1.5|the_unit_verifies_and_is_hardened"
    "tollgate check-config accepts the installed config|check_config_accepts_the_installed_config"
    "tollgate serve (user tollgate) answers /healthz and /readyz 200, then /sms/send|serve_answers_healthz_and_readyz"
    "SIGHUP (ExecReload) reloads the installed config|sighup_reloads_the_config"
    "saving the installed config reloads it|saving_the_config_reloads_it"
    "SIGTERM stops it with status 0|sigterm_stops_it_with_status_0"
    "the unit's SystemCallFilter allows every system call it made|the_unit_allows_every_system_call_it_made"
    "reinstalling keeps an edited config and its mode|an_upgrade_keeps_an_edited_config"
    "dpkg --purge removes binary, config, unit and state|purge_removes_it_all"
    "dpkg --purge keeps audit events the database never got|purge_keeps_unwritten_audit_events"
)
started=$(date +%s)
trap 'report $((${#checks[@]} - passed)); cleanup' EXIT
for entry in "${checks[@]}"; do
    current=${entry%%|*}
    "${entry##*|}" >"$work/check.out" 2>&1
    echo "package: ok      $current"
    passed=$((passed + 1))
done
trap cleanup EXIT
echo "package: took $(($(date +%s) - started))s"
echo "package: $passed passed, 0 failed"
