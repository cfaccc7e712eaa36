#!/usr/bin/env bash
# Starts a 3-master Redis Cluster on 127.0.0.1:17000-17002 for tollgate's
# cluster tests, unless one already answers there. Nothing is persisted.
# Needs redis-server and redis-cli (scripts/services.sh installs them).
set -euo pipefail

ports=(17000 17001 17002)
dir="${TMPDIR:-/tmp}/tollgate-redis-cluster"

state() { redis-cli -p "${ports[0]}" cluster info 2>/dev/null | tr -d '\r' | sed -n 's/^cluster_state://p'; }

if [ "$(state)" = "ok" ]; then
  echo "redis-cluster: already up on ${ports[*]}"
  exit 0
fi

for port in "${ports[@]}"; do
  if ! redis-cli -p "$port" ping >/dev/null 2>&1; then
    mkdir -p "$dir/$port"
    rm -f "$dir/$port/nodes.conf"
    redis-server --daemonize yes --bind 127.0.0.1 --port "$port" --cluster-enabled yes \
      --cluster-config-file "$dir/$port/nodes.conf" --cluster-node-timeout 2000 \
      --save "" --appendonly no --dir "$dir/$port" --logfile "$dir/$port/redis.log"
  fi
done
for _ in $(seq 50); do
  up=0
  for port in "${ports[@]}"; do redis-cli -p "$port" ping >/dev/null 2>&1 && up=$((up + 1)); done
  [ "$up" -eq "${#ports[@]}" ] && break
  sleep 0.1
done

if [ "$(redis-cli -p "${ports[0]}" cluster info | tr -d '\r' | sed -n 's/^cluster_known_nodes://p')" != "${#ports[@]}" ]; then
  for port in "${ports[@]}"; do redis-cli -p "$port" flushall >/dev/null; redis-cli -p "$port" cluster reset hard >/dev/null; done
  redis-cli --cluster create "${ports[@]/#/127.0.0.1:}" --cluster-replicas 0 --cluster-yes >/dev/null
fi
for _ in $(seq 100); do
  [ "$(state)" = "ok" ] && { echo "redis-cluster: up on ${ports[*]}"; exit 0; }
  sleep 0.1
done
echo "redis-cluster: the cluster did not become ready" >&2
exit 1
