#!/usr/bin/env bash
# Runs every test of tollgate on this machine: starts Redis and PostgreSQL when
# they are down (installing them from Debian's packages when missing), installs
# Chromium and chromedriver for the console's browser test and oidc-provider
# (npm) for the admin sign-in tests when missing, then
# `cargo test`, then the Debian package test, the container image test and the
# deployment checks. Extra arguments go to cargo test (e.g. `scripts/test.sh
# login::`) and skip the last three.
set -euo pipefail
cd "$(dirname "$0")/.."
SCHEMATHESIS_VERSION=4.32.5

command -v cargo >/dev/null || { echo "test: cargo is missing; install Rust (rustup) first" >&2; exit 1; }
scripts/services.sh
scripts/redis-cluster.sh

# The console's browser test (tests/api/console/browser.rs) drives Debian's
# headless Chromium through chromedriver.
if ! command -v chromium >/dev/null || ! command -v chromedriver >/dev/null; then
    echo "test: installing chromium and chromium-driver (the console's browser test)"
    scripts/apt.sh install chromium chromium-driver
fi

# The admin sign-in tests (tests/api/oidc.rs) start a real OpenID provider,
# panva's oidc-provider (npm), pinned by tests/oidc/package-lock.json and
# installed outside the clone; they need Node.js 20+ and npm.
oidc="${TOLLGATE_OIDC_PROVIDER:-$HOME/.cache/tollgate-oidc-provider}"
if ! cmp -s tests/oidc/package-lock.json "$oidc/package-lock.json" || [ ! -d "$oidc/node_modules/oidc-provider" ]; then
    command -v node >/dev/null && command -v npm >/dev/null || {
        echo "test: node and npm are missing: the admin sign-in tests need Node.js 20+ (Debian: apt-get install nodejs npm)" >&2
        exit 1
    }
    echo "test: installing oidc-provider into $oidc (the admin sign-in tests)"
    rm -rf "$oidc" && mkdir -p "$oidc"
    cp tests/oidc/package.json tests/oidc/package-lock.json "$oidc/"
    (cd "$oidc" && npm ci --no-audit --no-fund --loglevel=error)
fi
export TOLLGATE_OIDC_PROVIDER="$oidc"

# schemathesis (PyPI) checks the API against its OpenAPI document
# (tests/api/schemathesis.rs), from a virtualenv outside the clone.
venv="${TOLLGATE_VENV:-$HOME/.cache/tollgate-venv}"
if [ -z "${TOLLGATE_SCHEMATHESIS:-}" ]; then
    if ! "$venv/bin/schemathesis" --version 2>/dev/null | grep -q "$SCHEMATHESIS_VERSION"; then
        command -v python3 >/dev/null || { echo "test: python3 is missing (for schemathesis)" >&2; exit 1; }
        python3 -m venv "$venv"
        "$venv/bin/pip" install --quiet --disable-pip-version-check "schemathesis==$SCHEMATHESIS_VERSION"
    fi
    export TOLLGATE_SCHEMATHESIS="$venv/bin/schemathesis"
fi
# The Python example of docs/integration.md runs with `requests` (a
# dependency of schemathesis) from the same virtualenv.
export TOLLGATE_PYTHON="${TOLLGATE_PYTHON:-$(dirname "$TOLLGATE_SCHEMATHESIS")/python}"

# The build cache lives outside the clone, so a fresh clone reuses it.
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/tollgate-target}"
export RUST_BACKTRACE="${RUST_BACKTRACE:-0}"

# The unit tests (the library) and the one integration binary (tests/api) are
# the test targets; the binary and the doc comments hold none.
log=$(mktemp)
trap 'rm -f "$log"' EXIT
status=0
cargo test --locked --lib --test api "$@" 2>&1 | tee "$log" || status=$?
# On a whole run only, not when arguments pick tests, each from the binary
# cargo test has just built:
# - the Debian package, installed with dpkg and run (scripts/package-test.sh;
#   TOLLGATE_PACKAGE_TEST=0 leaves it out);
# - the container image, built with podman and run (scripts/image-test.sh;
#   TOLLGATE_IMAGE_TEST=0 leaves it out);
# - the Kubernetes manifests, the alerts and the dashboard, checked offline
#   (scripts/deploy-check.sh; TOLLGATE_DEPLOY_CHECK=0 leaves it out).
if [ $# -eq 0 ]; then
    if [ "${TOLLGATE_PACKAGE_TEST:-1}" != 0 ]; then
        scripts/package-test.sh 2>&1 | tee -a "$log" || status=$?
    fi
    if [ "${TOLLGATE_IMAGE_TEST:-1}" != 0 ]; then
        scripts/image-test.sh 2>&1 | tee -a "$log" || status=$?
    fi
    if [ "${TOLLGATE_DEPLOY_CHECK:-1}" != 0 ]; then
        scripts/deploy-check.sh 2>&1 | tee -a "$log" || status=$?
    fi
fi
awk '/^test result:/ { p += $4; f += $6 }
     /^(package|image|deploy): [0-9]+ passed, [0-9]+ failed$/ { p += $2; f += $4 }
     END { printf "%d passed, %d failed\n", p, f }' "$log"
exit "$status"
