#!/usr/bin/env bash
# Builds tollgate's container image from the repository's Containerfile with
# podman and runs it as a user would: read-only root, its own user, with Redis
# and PostgreSQL, then `podman stop`. Removes the containers and images it
# made. Run by scripts/test.sh on a whole run (TOLLGATE_IMAGE_TEST=0 leaves it
# out); runs alone too.
#
# No image registry is reachable here, so:
# - the runtime stage's base, debian:bookworm-slim, is made from Debian's
#   packages with mmdebstrap (minbase, no docs), kept as a tarball under
#   ~/.cache/tollgate-image (rebuilt when older than 30 days, or with
#   TOLLGATE_IMAGE_REFRESH=1) and imported under that name for the build;
# - the Rust stage (FROM rust:1-bookworm, cargo build --profile dist) cannot run:
#   the build takes the `prebuilt` target with the binary cargo test has just
#   built (target/debug/tollgate, as scripts/package-test.sh packages it) as
#   the `tollgate-binary` build context. Everything else is the image's own.
# The runtime stage's `apt-get install ca-certificates` reaches Debian's
# mirror through the host's network.
#
# podman runs as root with runc (crun fails here: "cgroups in hybrid mode")
# and the ulimits below. The container shares the host's network, where
# Redis and PostgreSQL listen on loopback. Prints one line per check, then
# `image: N passed, N failed`.
set -euo pipefail
cd "$(dirname "$0")/.."
script_started=$(date +%s)
BASE_IMAGE=docker.io/library/debian:bookworm-slim
BASE_LABEL=tollgate.test-base
# Longest wait for the server to start (polled, not slept).
DEADLINE_SECS=60
# The image's user (Dockerfile: USER 10001:10001).
UID_IN_IMAGE=10001

if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null; then
    echo "image: skipped: needs root and apt-get (a Debian system)"
    exit 0
fi

trap '[ $? = 0 ] || { echo "image: FAILED  setting up (see above)"; echo "image: 0 passed, 1 failed"; }' EXIT

missing=()
command -v podman >/dev/null || missing+=(podman)
command -v runc >/dev/null || missing+=(runc)
command -v mmdebstrap >/dev/null || missing+=(mmdebstrap)
command -v curl >/dev/null || missing+=(curl)
command -v psql >/dev/null || missing+=(postgresql-client)
if ((${#missing[@]})); then
    echo "image: installing ${missing[*]}"
    scripts/apt.sh install --no-install-recommends "${missing[@]}"
fi
scripts/services.sh >/dev/null

podman=(podman --runtime runc)
limits=(--ulimit nofile=1024:1024 --ulimit nproc=1024:1024)

cache="${TOLLGATE_IMAGE_CACHE:-$HOME/.cache/tollgate-image}"
base_tar="$cache/debian-bookworm-slim.tar"
mkdir -p "$cache"
if [ "${TOLLGATE_IMAGE_REFRESH:-0}" = 1 ] || [ -z "$(find "$base_tar" -mtime -30 2>/dev/null)" ]; then
    echo "image: making the base image with mmdebstrap (Debian bookworm, minbase), once a month"
    mmdebstrap --quiet --variant=minbase --format=tar \
        --dpkgopt='path-exclude=/usr/share/man/*' --dpkgopt='path-exclude=/usr/share/doc/*' \
        --dpkgopt='path-include=/usr/share/doc/*/copyright' \
        --dpkgopt='path-exclude=/usr/share/locale/*' --dpkgopt='path-exclude=/usr/share/info/*' \
        --customize-hook='rm -rf "$1"/var/lib/apt/lists/* "$1"/var/cache/apt/*.bin' \
        bookworm "$base_tar.new" \
        "deb http://deb.debian.org/debian bookworm main" \
        "deb http://deb.debian.org/debian bookworm-updates main" \
        "deb http://deb.debian.org/debian-security bookworm-security main"
    mv "$base_tar.new" "$base_tar"
fi

export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/tollgate-target}"
run_id="$$-$(date +%s)"
image="localhost/tollgate-image-test:$run_id"
container="tollgate-image-test-$run_id"
database="tollgate_image_$$"
prefix="tg-image-$run_id"
work=$(mktemp -d)
imported_base=no

cleanup() {
    "${podman[@]}" rm --force --ignore --volumes "$container" >/dev/null 2>&1 || true
    "${podman[@]}" rmi --force "$image" >/dev/null 2>&1 || true
    if [ "$imported_base" = yes ]; then "${podman[@]}" rmi --force "$BASE_IMAGE" >/dev/null 2>&1 || true; fi
    # Layers of this run's build that no image uses any more.
    "${podman[@]}" image prune --force >/dev/null 2>&1 || true
    psql -h 127.0.0.1 -U postgres -d postgres -qc "DROP DATABASE IF EXISTS $database" >/dev/null 2>&1 || true
    redis-cli -h 127.0.0.1 --scan --pattern "$prefix:*" 2>/dev/null | xargs -r redis-cli -h 127.0.0.1 del >/dev/null 2>&1 || true
    rm -rf "$work"
}
trap cleanup EXIT

# A real debian:bookworm-slim (pulled from a registry) is used as it is; the
# test's own is imported from the tarball and removed afterwards.
if ! "${podman[@]}" image exists "$BASE_IMAGE"; then
    "${podman[@]}" import --quiet --change "LABEL $BASE_LABEL=mmdebstrap" "$base_tar" "$BASE_IMAGE" >/dev/null
    imported_base=yes
fi

source scripts/checks.sh
on_check_failure() {
    if [ -n "${container_started:-}" ]; then
        echo "--- podman logs (last 20 lines):"
        "${podman[@]}" logs --tail 20 "$container"
    fi
}

free_port() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
status_of() { curl -s -o /dev/null -w '%{http_code}' "$@"; }
rows() { psql -h 127.0.0.1 -U postgres -d "$database" -Atqc "$1"; }

podman_builds_the_image_from_the_containerfile() {
    cargo build --locked --quiet --bin tollgate
    mkdir "$work/binary"
    cp "$CARGO_TARGET_DIR/debug/tollgate" "$work/binary/tollgate"
    # No -f: podman finds `Containerfile` (the link to `Dockerfile`) itself.
    # --format docker keeps HEALTHCHECK, which OCI image configs cannot hold.
    "${podman[@]}" build "${limits[@]}" --network host --pull=never --format docker \
        --target prebuilt --build-context "tollgate-binary=$work/binary" \
        --build-arg REVISION="$(git rev-parse HEAD 2>/dev/null || echo unknown)" \
        --tag "$image" .
}

the_image_declares_user_ports_volume_signal_healthcheck_and_labels() {
    local got
    got=$("${podman[@]}" image inspect "$image" --format \
        'user={{.Config.User}} ports={{range $p, $v := .Config.ExposedPorts}}{{$p}},{{end}} volumes={{range $v, $x := .Config.Volumes}}{{$v}},{{end}} stop={{.Config.StopSignal}} health={{.Config.Healthcheck.Test}} entry={{.Config.Entrypoint}} cmd={{.Config.Cmd}} title={{index .Config.Labels "org.opencontainers.image.title"}} licenses={{index .Config.Labels "org.opencontainers.image.licenses"}}')
    echo "$got"
    local want="user=10001:10001 ports=8080/tcp,8081/tcp, volumes=/var/lib/tollgate, stop=SIGTERM health=[CMD tollgate healthcheck] entry=[tollgate] cmd=[serve] title=tollgate licenses=MIT"
    [ "$got" = "$want" ] || fail "expected: $want"
}

check_config_accepts_the_images_config() {
    "${podman[@]}" run --rm "${limits[@]}" --network none --read-only "$image" check-config >"$work/effective.toml"
    grep -q '^bind = "0.0.0.0:8080"$' "$work/effective.toml" || fail "not bound to 0.0.0.0:8080: $(cat "$work/effective.toml")"
    grep -q '^admin_bind = "0.0.0.0:8081"$' "$work/effective.toml" || fail "no admin_bind 0.0.0.0:8081"
    grep -q '^database_url = "sqlite:///var/lib/tollgate/audit.db?mode=rwc"$' "$work/effective.toml" || fail "audit not in the volume"
}

# Read-only root, the image's own user, Redis and a fresh PostgreSQL
# database on the host. The audit writer waits an hour for a batch to fill,
# so every refusal stays queued until SIGTERM drains it. Free ports instead
# of 8080/8081, which the host network may have in use.
it_serves_read_only_with_redis_and_postgresql() {
    psql -h 127.0.0.1 -U postgres -d postgres -qc "CREATE DATABASE $database"
    port=$(free_port)
    admin_port=$(free_port)
    "${podman[@]}" run --detach --name "$container" "${limits[@]}" --network host --read-only \
        -e TOLLGATE__SERVER__BIND="0.0.0.0:$port" \
        -e TOLLGATE__SERVER__ADMIN_BIND="127.0.0.1:$admin_port" \
        -e TOLLGATE__STORE__BACKEND=redis \
        -e TOLLGATE__STORE__REDIS_URL=redis://127.0.0.1:6379 \
        -e TOLLGATE__STORE__KEY_PREFIX="$prefix" \
        -e TOLLGATE__SMS__CODE_SECRET=image-test-code-secret-0123456789 \
        -e TOLLGATE__AUDIT__DATABASE_URL="postgres://postgres@127.0.0.1:5432/$database" \
        -e TOLLGATE__AUDIT__FLUSH_INTERVAL=1h \
        "$image"
    container_started=yes
    local waited=0
    until [ "$(status_of "http://127.0.0.1:$port/readyz")" = 200 ]; do
        [ "$("${podman[@]}" inspect --format '{{.State.Running}}' "$container")" = true ] || fail "the container exited"
        [ "$waited" -lt $((DEADLINE_SECS * 10)) ] || fail "/readyz not 200 within ${DEADLINE_SECS}s"
        sleep 0.1
        waited=$((waited + 1))
    done
    [ "$(status_of "http://127.0.0.1:$port/healthz")" = 200 ] || fail "/healthz is not 200"
    [ "$(rows 'SELECT count(*) FROM audit_events')" = 0 ] || fail "the audit table is not empty"
}

it_runs_as_its_user_and_cannot_write_outside_the_volume() {
    local uid
    uid=$("${podman[@]}" exec "$container" id -u)
    [ "$uid" = "$UID_IN_IMAGE" ] || fail "runs as uid $uid"
    if "${podman[@]}" exec "$container" sh -c 'echo x >/written-by-tollgate' 2>"$work/write.err"; then
        fail "a write to / succeeded"
    fi
    grep -q "Read-only file system" "$work/write.err" || fail "unexpected: $(cat "$work/write.err")"
    if "${podman[@]}" exec "$container" sh -c 'echo x >/etc/tollgate/tollgate.toml' 2>/dev/null; then
        fail "the config could be overwritten"
    fi
    "${podman[@]}" exec "$container" sh -c 'test -w /var/lib/tollgate && test -d /var/lib/tollgate/spool' \
        || fail "the volume is not writable"
}

its_healthcheck_passes() {
    "${podman[@]}" healthcheck run "$container" || fail "podman healthcheck run failed"
    "${podman[@]}" exec "$container" tollgate healthcheck --ready
}

# One send, then three refusals (phone 1/1m), each audited; the metrics on
# the admin port count them.
it_sends_and_refuses() {
    local send=(-H 'content-type: application/json' -d '{"phone": "+8613800138000"}' "http://127.0.0.1:$port/sms/send")
    local status
    status=$(status_of "${send[@]}")
    [ "$status" = 200 ] || fail "the first /sms/send answered $status"
    for _ in 1 2 3; do
        status=$(status_of "${send[@]}")
        [ "$status" = 429 ] || fail "a second /sms/send answered $status"
    done
    curl -s "http://127.0.0.1:$admin_port/metrics" >"$work/metrics"
    grep -q '^tollgate_requests_total{route="sms_send",decision="deny"} 3$' "$work/metrics" \
        || fail "metrics: $(grep requests_total "$work/metrics")"
    grep -q '^tollgate_audit_events_total{outcome="queued"} 3$' "$work/metrics" || fail "3 events not queued"
    [ "$(rows 'SELECT count(*) FROM audit_events')" = 0 ] || fail "written before the batch was due"
}

# What `docker stop`, `podman stop` and Kubernetes send: the queue is
# drained to PostgreSQL, then the process exits 0 (not 137: SIGKILL).
podman_stop_drains_the_audit_queue_and_exits_0() {
    "${podman[@]}" stop --time 30 "$container" >/dev/null
    local code
    code=$("${podman[@]}" inspect --format '{{.State.ExitCode}}' "$container")
    [ "$code" = 0 ] || fail "exited with $code"
    local got
    got=$(rows "SELECT count(*), min(action), min(decision), min(rule), max(rule) FROM audit_events")
    [ "$got" = "3|sms_send|deny|phone 1/1m|phone 1/1m" ] || fail "audit rows: $got"
}

checks=(
    "podman build (Containerfile, target prebuilt, base from mmdebstrap)|podman_builds_the_image_from_the_containerfile"
    "the image: user 10001, EXPOSE 8080 8081, VOLUME /var/lib/tollgate, STOPSIGNAL, HEALTHCHECK, labels|the_image_declares_user_ports_volume_signal_healthcheck_and_labels"
    "check-config accepts the image's config (0.0.0.0:8080, admin 0.0.0.0:8081, audit in the volume)|check_config_accepts_the_images_config"
    "it runs with --read-only, Redis and PostgreSQL: /healthz and /readyz 200|it_serves_read_only_with_redis_and_postgresql"
    "it runs as uid 10001; / and the config are read-only, the volume writable|it_runs_as_its_user_and_cannot_write_outside_the_volume"
    "its HEALTHCHECK passes (podman healthcheck run), and healthcheck --ready|its_healthcheck_passes"
    "/sms/send sends, then refuses 3 times; /metrics on the admin port counts them|it_sends_and_refuses"
    "podman stop (SIGTERM) exits 0, the 3 refusals drained to PostgreSQL|podman_stop_drains_the_audit_queue_and_exits_0"
)
run_checks image "$work" cleanup "${checks[@]}"
echo "image: took $(($(date +%s) - script_started))s in all"
echo "image: ${#checks[@]} passed, 0 failed"
