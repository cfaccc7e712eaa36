#!/usr/bin/env bash
# The audit trail at attack scale (benches/audit_scale.rs): fills a scratch
# PostgreSQL database with rows over 30 days, times the admin requests, the
# CSV export's memory and the retention cut under a login-failure flood
# against the release binary, prints tables, drops the database.
#   scripts/audit-bench.sh                      # 1 M rows
#   scripts/audit-bench.sh --rows 10000000      # the recorded run
#   scripts/audit-bench.sh --help               # every option
# Needs PostgreSQL (TOLLGATE_BENCH_DATABASE_URL, default
# postgres://postgres@127.0.0.1:5432/postgres; scripts/services.sh starts one)
# and wrk (installed from Debian's packages when missing).
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v wrk >/dev/null; then
  echo "audit-bench: installing wrk" >&2
  scripts/apt.sh install wrk
fi

export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/tollgate-release}"
cargo build --release --locked --quiet --bin tollgate
exec cargo bench --locked --quiet --bench audit_scale -- \
  --tollgate "$CARGO_TARGET_DIR/release/tollgate" "$@"
