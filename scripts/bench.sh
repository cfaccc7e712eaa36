#!/usr/bin/env bash
# The load benchmark: tollgate against both Node peers in ../shared/bench, side
# by side on this machine (see scripts/bench.py for what it measures).
#   scripts/bench.sh                      # every scenario, 3 alternated rounds of 6 s
#   scripts/bench.sh --scenarios login-1m --rounds 1 --no-extras
#   scripts/bench.sh --baseline /path/to/older/tollgate   # an earlier build in the same rotation
# Needs PostgreSQL (scripts/services.sh starts it), redis-server, node and npm;
# installs wrk (Debian) and the peer's npm packages (into a cache directory).
set -euo pipefail
cd "$(dirname "$0")/.."

shared="${TOLLGATE_SHARED:-$(cd .. && pwd)/shared}"
[ -d "$shared/bench/node-peer" ] || { echo "bench: no peer at $shared/bench/node-peer (set TOLLGATE_SHARED)" >&2; exit 1; }
scripts/services.sh >/dev/null

if ! command -v wrk >/dev/null; then
  echo "bench: installing wrk"
  scripts/apt.sh install wrk
fi
command -v node >/dev/null || { echo "bench: node is missing" >&2; exit 1; }

# The peer's packages go beside a copy of it, so ../shared stays untouched.
peer="${XDG_CACHE_HOME:-$HOME/.cache}/tollgate-bench-peer"
if ! cmp -s "$shared/bench/node-peer/package-lock.json" "$peer/package-lock.json" || [ ! -d "$peer/node_modules" ]; then
  rm -rf "$peer" && mkdir -p "$peer"
  cp -r "$shared/bench/node-peer/." "$peer/"
  (cd "$peer" && npm ci --no-audit --no-fund --loglevel=error)
fi

export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/tollgate-target}"
# The profile that ships (Cargo.toml's `dist`), for tollgate and the lean
# limit alike.
cargo build --profile dist --locked --quiet --bin tollgate --example lean_login
exec python3 scripts/bench.py --tollgate "$CARGO_TARGET_DIR/dist/tollgate" --peer "$peer" \
  --lean "$CARGO_TARGET_DIR/dist/examples/lean_login" \
  --mix "$shared/bench/wrk/anti_abuse.lua" --wrk-script "$PWD/benches/wrk/anti_abuse.lua" "$@"
