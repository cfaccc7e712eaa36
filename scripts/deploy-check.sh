#!/usr/bin/env bash
# Checks what deploy/ ships, offline: the Kubernetes manifests (kustomize
# build, kubernetes-validate --strict, the ServiceMonitor against its schema,
# the pieces against each other, the image and the config), the Prometheus
# alerts (promtool check rules, promtool test rules) and the Grafana
# dashboard (provisioning-ready, every query parses, every series and label
# it names exists). Run by scripts/test.sh on a whole run
# (TOLLGATE_DEPLOY_CHECK=0 leaves it out); runs alone too.
#
# Installs what is missing: kubernetes-validate (PyPI, pinned) in a
# virtualenv under ~/.cache, and promtool alone out of Debian's `prometheus`
# package (`apt-get download`, unpacked under ~/.cache: installing the
# package would also install, and on some systems start, a Prometheus
# server). `kubectl kustomize` renders the manifests; kubectl comes with this
# machine's image. Prints one line per check, then `deploy: N passed, N failed`.
set -euo pipefail
cd "$(dirname "$0")/.."
script_started=$(date +%s)
KUBERNETES_VALIDATE_VERSION=1.37.0
# The oldest Kubernetes the manifests are checked against, and the newest
# kubernetes-validate knows.
KUBERNETES_VERSIONS=(1.29.0 1.37.0)

trap '[ $? = 0 ] || { echo "deploy: FAILED  setting up (see above)"; echo "deploy: 0 passed, 1 failed"; }' EXIT

command -v kubectl >/dev/null || { echo "deploy: kubectl is missing (kubectl kustomize renders deploy/kubernetes)" >&2; exit 1; }
command -v curl >/dev/null || scripts/apt.sh install curl

venv="${TOLLGATE_DEPLOY_VENV:-$HOME/.cache/tollgate-deploy-venv}"
if ! "$venv/bin/kubernetes-validate" --version 2>/dev/null | grep -qx "$KUBERNETES_VALIDATE_VERSION"; then
    echo "deploy: installing kubernetes-validate $KUBERNETES_VALIDATE_VERSION in $venv"
    python3 -m venv "$venv"
    "$venv/bin/pip" install --quiet --disable-pip-version-check "kubernetes-validate==$KUBERNETES_VALIDATE_VERSION"
fi
python="$venv/bin/python"

tools="${TOLLGATE_TOOLS:-$HOME/.cache/tollgate-tools}"
promtool="$tools/promtool/promtool"
if ! "$promtool" --version >/dev/null 2>&1; then
    echo "deploy: unpacking promtool from Debian's prometheus package into $tools/promtool"
    download=$(mktemp -d)
    apt-cache show prometheus >/dev/null 2>&1 || scripts/apt.sh update
    # apt's download sandbox user must be able to write there.
    chown _apt "$download" 2>/dev/null || true
    (cd "$download" && apt-get download -qq prometheus)
    dpkg-deb --fsys-tarfile "$download"/prometheus_*.deb | tar -x -C "$download" ./usr/bin/promtool
    mkdir -p "$tools/promtool"
    install -m 0755 "$download/usr/bin/promtool" "$promtool"
    rm -rf "$download"
fi

export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/tollgate-target}"
work=$(mktemp -d)
server_pid=
cleanup() {
    if [ -n "$server_pid" ]; then { kill "$server_pid" && wait "$server_pid"; } 2>/dev/null || true; fi
    rm -rf "$work"
}
trap cleanup EXIT

source scripts/checks.sh

rendered="$work/kubernetes.yaml"
rendered_statefulset="$work/kubernetes-statefulset.yaml"
alerts=deploy/monitoring/prometheus/alerts.yml
dashboard=deploy/monitoring/grafana/tollgate.json

kustomize_renders_the_manifests() {
    kubectl kustomize deploy/kubernetes >"$rendered"
    local kinds
    kinds=$(grep '^kind: ' "$rendered" | sort | tr '\n' ' ')
    echo "$kinds"
    [ "$kinds" = "kind: ConfigMap kind: Deployment kind: NetworkPolicy kind: PodDisruptionBudget kind: Service kind: Service kind: ServiceMonitor " ] \
        || fail "unexpected resources: $kinds"
}

kustomize_renders_the_statefulset_overlay() {
    kubectl kustomize deploy/kubernetes-statefulset >"$rendered_statefulset"
    local kinds
    kinds=$(grep '^kind: ' "$rendered_statefulset" | sort | tr '\n' ' ')
    echo "$kinds"
    [ "$kinds" = "kind: ConfigMap kind: NetworkPolicy kind: PodDisruptionBudget kind: Service kind: Service kind: ServiceMonitor kind: StatefulSet " ] \
        || fail "unexpected resources: $kinds"
}

# --strict refuses any field the schema does not name; the ServiceMonitor,
# whose CRD kubernetes-validate does not bundle, is the one schema it may
# miss (checked next). A misspelt field must fail, or nothing is checked.
kubernetes_validate_strict_passes() {
    local version versions=()
    for version in "${KUBERNETES_VERSIONS[@]}"; do versions+=(-k "$version"); done
    "$venv/bin/kubernetes-validate" --strict "${versions[@]}" "$rendered" "$rendered_statefulset" \
        deploy/kubernetes/secret.example.yaml | tee "$work/validate.out"
    local passed_lines others
    passed_lines=$(grep -c '^INFO .* passed for resource' "$work/validate.out" || true)
    others=$(grep -v '^INFO .* passed for resource' "$work/validate.out" \
        | grep -v "^WARN .*Couldn't find schema for kind ServiceMonitor with api version monitoring.coreos.com/v1" || true)
    [ -z "$others" ] || fail "unexpected: $others"
    [ "$passed_lines" = $((13 * ${#KUBERNETES_VERSIONS[@]})) ] || fail "$passed_lines resources passed, not 13 per version"
    sed 's/readOnlyRootFilesystem/readOnlyRootFilsystem/' "$rendered" >"$work/misspelt.yaml"
    if "$venv/bin/kubernetes-validate" --strict --quiet "$work/misspelt.yaml" >"$work/misspelt.out"; then
        fail "a misspelt field passed: $(cat "$work/misspelt.out")"
    fi
}

servicemonitor_matches_its_schema() {
    "$python" scripts/deploy_check.py crd deploy/kubernetes/schemas/servicemonitor-monitoring-v1.json "$rendered"
}

manifests_agree_with_each_other_the_image_and_the_config() {
    "$python" scripts/deploy_check.py manifests "$rendered"
}

statefulset_is_the_base_with_a_claim_for_the_spool() {
    "$python" scripts/deploy_check.py statefulset "$rendered" "$rendered_statefulset"
}

the_configmap_with_the_secret_is_a_valid_config() {
    cargo build --locked --quiet --bin tollgate
    "$python" scripts/deploy_check.py config "$rendered" deploy/kubernetes/secret.example.yaml "$CARGO_TARGET_DIR/debug/tollgate"
}

promtool_checks_the_alerts() {
    "$promtool" check rules "$alerts"
}

promtool_tests_every_alert() {
    "$promtool" test rules deploy/monitoring/prometheus/alerts.test.yml
    # Every alert of alerts.yml has a test.
    local alert
    for alert in $(sed -n 's/^ *- alert: //p' "$alerts"); do
        grep -q "alertname: $alert\$" deploy/monitoring/prometheus/alerts.test.yml || fail "$alert has no test"
    done
}

dashboard_is_provisioning_ready_and_its_queries_parse() {
    "$python" scripts/deploy_check.py dashboard "$dashboard" "$work/dashboard-rules.yml"
    "$promtool" check rules "$work/dashboard-rules.yml"
}

# docs/kubernetes.md has the real Secret written to secret.yaml at the top
# of the checkout: git must not take it, nor the image's build context
# (`COPY . .` in the build stage would keep it in a layer).
the_real_secret_stays_out_of_git_and_the_image() {
    git check-ignore --no-index -q secret.yaml || fail "git would take secret.yaml"
    grep -qx 'secret.yaml' .dockerignore || fail ".dockerignore lets secret.yaml into the build context"
    grep -q '^cp deploy/kubernetes/secret.example.yaml secret.yaml ' docs/kubernetes.md \
        || fail "docs/kubernetes.md writes the Secret somewhere else now: ignore that path instead"
}

free_port() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

# A real /metrics: the binary with the in-process store and SQLite, after a
# send, a refusal, a block-list refusal, a wrong code, a login attempt and a
# readiness probe.
series_and_labels_exist() {
    cargo build --locked --quiet --bin tollgate
    local port admin smtp
    port=$(free_port)
    admin=$(free_port)
    # Email on (to a port nothing listens on; nothing is locked): the
    # email series are exported from start-up.
    smtp=$(free_port)
    (cd "$work" && exec env TOLLGATE__SERVER__BIND="127.0.0.1:$port" TOLLGATE__SERVER__ADMIN_BIND="127.0.0.1:$admin" \
        TOLLGATE__LISTS__BLOCK_PHONES='["+8821*"]' TOLLGATE__SMS__DENIED_REGIONS='["GB"]' \
        TOLLGATE__EMAIL__SMTP_URL="smtp://127.0.0.1:$smtp" \
        "$CARGO_TARGET_DIR/debug/tollgate" serve) >"$work/serve.log" 2>&1 &
    server_pid=$!
    local waited=0
    until curl -sf -o /dev/null "http://127.0.0.1:$port/readyz"; do
        kill -0 "$server_pid" 2>/dev/null || fail "tollgate exited: $(cat "$work/serve.log")"
        [ "$waited" -lt 300 ] || fail "not ready within 30s"
        sleep 0.1
        waited=$((waited + 1))
    done
    # The Deployment's readiness path, as the binary answers it.
    curl -sf -o /dev/null "http://127.0.0.1:$port/readyz?exclude=audit_database" \
        || fail "/readyz?exclude=audit_database (the readinessProbe's path) is not 200"
    local json=(-H 'content-type: application/json')
    curl -s "${json[@]}" -d '{"phone": "+8613800138000"}' "http://127.0.0.1:$port/sms/send" >/dev/null
    curl -s "${json[@]}" -d '{"phone": "+8613800138000"}' "http://127.0.0.1:$port/sms/send" >/dev/null
    curl -s "${json[@]}" -d '{"phone": "+88216123456"}' "http://127.0.0.1:$port/sms/send" >/dev/null
    local region
    region=$(curl -s "${json[@]}" -d '{"phone": "+447400123456"}' "http://127.0.0.1:$port/sms/send")
    case "$region" in *region_blocked*) ;; *) fail "a send to a denied region answered $region" ;; esac
    curl -s "${json[@]}" -d '{"phone": "+8613800138000", "code": "000000"}' "http://127.0.0.1:$port/sms/verify" >/dev/null
    curl -s "${json[@]}" -d '{"user": "alice", "success": false}' "http://127.0.0.1:$port/login/attempt" >/dev/null
    curl -s "http://127.0.0.1:$admin/metrics" >"$work/scrape"
    grep -q '^tollgate_list_matches_total' "$work/scrape" || fail "the scrape lacks the traffic: $(head -20 "$work/scrape")"
    # The block list's and the region's 403s are not the pumping guard's.
    grep -qx 'tollgate_pumping_refusals_total 0' "$work/scrape" \
        || fail "other 403s counted as pumping refusals: $(grep '^tollgate_pumping' "$work/scrape")"
    grep -qx 'tollgate_emails_total{kind="lock_notice",outcome="failed"} 0' "$work/scrape" \
        || fail "the email series are not exported from start-up: $(grep '^tollgate_emails' "$work/scrape")"
    "$python" scripts/deploy_check.py series "$work/scrape" "$alerts" "$dashboard"
}

checks=(
    "kubectl kustomize renders deploy/kubernetes (7 resources)|kustomize_renders_the_manifests"
    "kubectl kustomize renders deploy/kubernetes-statefulset (the StatefulSet in place of the Deployment)|kustomize_renders_the_statefulset_overlay"
    "kubernetes-validate --strict (Kubernetes ${KUBERNETES_VERSIONS[*]}): both renders and the example Secret; a misspelt field fails|kubernetes_validate_strict_passes"
    "the ServiceMonitor against its CRD schema (deploy/kubernetes/schemas/)|servicemonitor_matches_its_schema"
    "selectors, ports, probes, mounts and security agree with each other, the image and the config|manifests_agree_with_each_other_the_image_and_the_config"
    "the StatefulSet overlay is the base, its pods the Deployment's, with a retained claim for the spool|statefulset_is_the_base_with_a_claim_for_the_spool"
    "tollgate check-config: the example Secret refused, the ConfigMap with real values valid|the_configmap_with_the_secret_is_a_valid_config"
    "the real Secret (secret.yaml, docs/kubernetes.md) is ignored by git and the image's build context|the_real_secret_stays_out_of_git_and_the_image"
    "promtool check rules $alerts|promtool_checks_the_alerts"
    "promtool test rules: every alert fires where it should and not elsewhere|promtool_tests_every_alert"
    "the Grafana dashboard is provisioning-ready and every query parses (promtool)|dashboard_is_provisioning_ready_and_its_queries_parse"
    "every series and label of the alerts and the dashboard exists (src/metrics/mod.rs, a real scrape)|series_and_labels_exist"
)
run_checks deploy "$work" cleanup "${checks[@]}"
echo "deploy: took $(($(date +%s) - script_started))s"
echo "deploy: ${#checks[@]} passed, 0 failed"
