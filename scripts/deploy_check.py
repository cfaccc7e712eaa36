"""The checks of scripts/deploy-check.sh that need a parser: the rendered
Kubernetes manifests against each other and against the image, the
ServiceMonitor against its schema, the Grafana dashboard, and every series
the dashboard and the alerts name against the code and a real scrape.

Runs with the Python of the kubernetes-validate virtualenv (PyYAML and
jsonschema come with it). Each subcommand prints what it checked and exits
non-zero, saying why, on the first failure.
"""

import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import jsonschema
import yaml

ROOT = Path(__file__).resolve().parent.parent
# Labels a scrape adds to every series (target labels), not tollgate's own.
TARGET_LABELS = {"job", "instance", "namespace", "pod", "service", "container", "endpoint"}
# Series the alerts use that are not tollgate's: Prometheus' own.
FOREIGN_SERIES = {"up"}


def fail(message):
    print(message)
    sys.exit(1)


def load_all(path):
    with open(path) as f:
        return [doc for doc in yaml.safe_load_all(f) if doc]


def by_kind(docs, kind):
    return [d for d in docs if d["kind"] == kind]


def one(docs, kind, name=None):
    found = [d for d in by_kind(docs, kind) if name is None or d["metadata"]["name"] == name]
    if len(found) != 1:
        fail(f"expected one {kind} {name or ''}, found {len(found)}")
    return found[0]


def selects(selector, labels):
    return all(labels.get(k) == v for k, v in selector.items())


def dockerfile():
    text = (ROOT / "Dockerfile").read_text()
    user = re.search(r"^USER (\d+):(\d+)$", text, re.M)
    expose = re.search(r"^EXPOSE (.+)$", text, re.M)
    if not user or not expose:
        fail("Dockerfile: no numeric USER or no EXPOSE")
    return int(user.group(1)), int(user.group(2)), sorted(int(p) for p in expose.group(1).split())


def check_manifests(rendered):
    """The pieces agree with each other, with the image and with the config."""
    docs = load_all(rendered)
    deployment = one(docs, "Deployment", "tollgate")
    spec = deployment["spec"]
    pod = spec["template"]
    labels = pod["metadata"]["labels"]
    if not selects(spec["selector"]["matchLabels"], labels):
        fail("the Deployment's selector does not select its pods")
    if spec["replicas"] != 2:
        fail(f"replicas: {spec['replicas']}, not 2")
    (container,) = pod["spec"]["containers"]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    uid, gid, exposed = dockerfile()
    if sorted(ports.values()) != exposed:
        fail(f"container ports {ports} are not the image's EXPOSE {exposed}")
    if container["image"] != "registry.example.com/tollgate:0.1.0":
        fail(f"kustomize's images: entry did not apply: {container['image']}")

    pod_security = pod["spec"]["securityContext"]
    security = container["securityContext"]
    expected = {
        "pod runAsNonRoot": pod_security.get("runAsNonRoot") is True,
        f"pod runAsUser {uid} (the image's USER)": pod_security.get("runAsUser") == uid,
        f"pod runAsGroup {gid}": pod_security.get("runAsGroup") == gid,
        "readOnlyRootFilesystem": security.get("readOnlyRootFilesystem") is True,
        "allowPrivilegeEscalation false": security.get("allowPrivilegeEscalation") is False,
        "capabilities drop ALL": security.get("capabilities", {}).get("drop") == ["ALL"],
        "no service account token": pod["spec"].get("automountServiceAccountToken") is False,
        "resources requests and a memory limit": bool(container["resources"].get("requests"))
        and "memory" in container["resources"].get("limits", {}),
    }
    missing = [name for name, ok in expected.items() if not ok]
    if missing:
        fail(f"the Deployment lacks: {missing}")

    # Readiness of the public listener, but for the audit database (the
    # journal holds the trail through its outage); liveness by `tollgate
    # healthcheck`, live while either listener answers: a flood that fills
    # one's connections must not get the pod restarted, the other port with it.
    get = container["readinessProbe"]["httpGet"]
    ready = "/readyz?exclude=audit_database"
    if get["path"] != ready or get["port"] != "http" or "http" not in ports:
        fail(f"readinessProbe asks {get}, not {ready} on the container port http")
    live = container["livenessProbe"].get("exec", {}).get("command", [])
    asked = [arg.split(":")[-1] for arg in live if arg.startswith("--address=")]
    if (
        live[:2] != ["tollgate", "healthcheck"]
        or "--ready" in live
        or sorted(int(port) for port in asked) != sorted(ports.values())
    ):
        fail(f"livenessProbe runs {live}, not `tollgate healthcheck` of every container port")

    # The config: the whole ConfigMap mounted as a directory (a subPath
    # mount never sees an update, so nothing would reload).
    mounts = {m["name"]: m for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
    config_mount = next(m for m in mounts.values() if m["mountPath"] == "/etc/tollgate")
    if "subPath" in config_mount or not config_mount.get("readOnly"):
        fail("the config is mounted with a subPath, or writable")
    configmap_name = volumes[config_mount["name"]]["configMap"]["name"]
    configmap = one(docs, "ConfigMap", configmap_name)
    env = {e["name"]: e.get("value") for e in container.get("env", [])}
    if env.get("TOLLGATE_CONFIG") != "/etc/tollgate/tollgate.toml" or "tollgate.toml" not in configmap["data"]:
        fail("TOLLGATE_CONFIG does not name the ConfigMap's tollgate.toml")
    state = next(m for m in mounts.values() if m["mountPath"] == "/var/lib/tollgate")
    if "emptyDir" not in volumes[state["name"]]:
        fail("/var/lib/tollgate is not a volume")
    binds = re.findall(r'^(?:admin_)?bind = "0\.0\.0\.0:(\d+)"$', configmap["data"]["tollgate.toml"], re.M)
    if sorted(int(p) for p in binds) != exposed:
        fail(f"the ConfigMap's binds {binds} are not all interfaces on {exposed}")
    secret_refs = [e["secretRef"]["name"] for e in container.get("envFrom", [])]
    secret = load_all(ROOT / "deploy/kubernetes/secret.example.yaml")[0]
    if secret_refs != [secret["metadata"]["name"]]:
        fail(f"envFrom {secret_refs} is not the example Secret {secret['metadata']['name']}")

    services = {s["metadata"]["name"]: s for s in by_kind(docs, "Service")}
    for name, service in services.items():
        if not selects(service["spec"]["selector"], labels):
            fail(f"Service {name} does not select the pods")
        for port in service["spec"]["ports"]:
            if port["targetPort"] not in ports:
                fail(f"Service {name} targets {port['targetPort']}, no container port")
    pdb = one(docs, "PodDisruptionBudget")
    if not selects(pdb["spec"]["selector"]["matchLabels"], labels) or pdb["spec"]["minAvailable"] >= spec["replicas"]:
        fail("the PodDisruptionBudget does not select the pods or blocks every eviction")

    policy = one(docs, "NetworkPolicy")
    if not selects(policy["spec"]["podSelector"]["matchLabels"], labels):
        fail("the NetworkPolicy does not select the pods")
    open_ports, admin_sources = set(), []
    for rule in policy["spec"]["ingress"]:
        rule_ports = {p["port"] for p in rule["ports"]}
        if "from" not in rule:
            open_ports |= rule_ports
        elif ports["admin"] in rule_ports:
            admin_sources = rule["from"]
    if open_ports != {ports["http"]}:
        fail(f"the NetworkPolicy opens {open_ports} to all, not only {ports['http']}")
    if not admin_sources or any(set(s) != {"namespaceSelector"} for s in admin_sources):
        fail("the admin port is not limited to labelled namespaces")

    monitor = one(docs, "ServiceMonitor")
    selected = [n for n, s in services.items() if selects(monitor["spec"]["selector"]["matchLabels"], s["metadata"]["labels"])]
    if selected != ["tollgate-admin"]:
        fail(f"the ServiceMonitor selects {selected}, not tollgate-admin")
    admin_port_names = {p["name"] for p in services["tollgate-admin"]["spec"]["ports"]}
    for endpoint in monitor["spec"]["endpoints"]:
        if endpoint["port"] not in admin_port_names or endpoint["path"] != "/metrics":
            fail(f"the ServiceMonitor scrapes {endpoint}, not /metrics on the admin port")
    print(f"{len(docs)} resources: selectors, ports, probes, mounts, security, image and config agree")


def check_crd(schema_path, rendered):
    """The ServiceMonitor against its schema, and a misspelt field refused."""
    schema = json.loads(Path(schema_path).read_text())
    jsonschema.Draft202012Validator.check_schema(schema)
    validator = jsonschema.Draft202012Validator(schema)
    monitors = by_kind(load_all(rendered), "ServiceMonitor")
    if not monitors:
        fail("no ServiceMonitor rendered")
    for monitor in monitors:
        errors = [e.message for e in validator.iter_errors(monitor)]
        if errors:
            fail(f"ServiceMonitor {monitor['metadata']['name']}: {errors}")
        misspelt = json.loads(json.dumps(monitor))
        misspelt["spec"]["endpoints"][0]["scrapeTimout"] = "10s"
        if validator.is_valid(misspelt):
            fail("the schema accepts a misspelt field: it checks nothing")
    print(f"{len(monitors)} ServiceMonitor valid; a misspelt field is refused")


def check_config(rendered, secret_path, binary):
    """The ConfigMap's config with the Secret's variables, as a pod gets it."""
    configmap = one(load_all(rendered), "ConfigMap", "tollgate-config")
    secret = load_all(secret_path)[0]
    example = secret["stringData"]
    real = {
        "TOLLGATE__SMS__CODE_SECRET": "9f2c4e6a8b0d1f3e5a7c9e1b3d5f7a9c",
        "TOLLGATE__STORE__REDIS_URL": "redis://:s3cret@redis.tollgate.svc:6379",
        "TOLLGATE__AUDIT__DATABASE_URL": "postgres://tollgate:s3cret@postgres.tollgate.svc:5432/tollgate",
        "TOLLGATE__SERVER__API_KEYS": '["a-long-random-api-key-0123456789"]',
        "TOLLGATE__SERVER__ADMIN_TOKENS": '["a-long-random-admin-token-0123456789"]',
    }
    if set(real) != set(example):
        fail(f"the example Secret's keys changed: {sorted(example)}")
    with tempfile.TemporaryDirectory() as tmp:
        config = Path(tmp) / "tollgate.toml"
        config.write_text(configmap["data"]["tollgate.toml"])

        def check(env):
            return subprocess.run([binary, "--config", str(config), "check-config"], env=env,
                                  capture_output=True, text=True)

        # Each placeholder secret on its own must stop the start, naming its setting: one
        # left in place by mistake is caught whichever it is.
        placeholders = {
            "TOLLGATE__SMS__CODE_SECRET": "`sms.code_secret`",
            "TOLLGATE__SERVER__API_KEYS": "`server.api_keys[0]`",
            "TOLLGATE__SERVER__ADMIN_TOKENS": "`server.admin_tokens[0]`",
        }
        for variable, setting in placeholders.items():
            shipped = check({**real, variable: example[variable]})
            if shipped.returncode == 0 or setting not in shipped.stderr:
                fail(f"tollgate accepted the example Secret's {variable}: "
                     f"{shipped.stderr or shipped.stdout}")
        if check(example).returncode == 0:
            fail("tollgate accepted the example Secret as shipped")
        replaced = check(real)
        if replaced.returncode != 0:
            fail(f"check-config refused the ConfigMap with real values: {replaced.stderr}")
        effective = replaced.stdout
        for line in ('bind = "0.0.0.0:8080"', 'admin_bind = "0.0.0.0:8081"', 'backend = "redis"',
                     'spool_dir = "/var/lib/tollgate/spool"', 'database_url = "postgres://tollgate:***@'):
            if line not in effective:
                fail(f"the effective config lacks {line!r}:\n{effective}")
        for value in real.values():
            if "s3cret" in value and value in effective:
                fail("a secret is printed unmasked")
    print("each placeholder in the example Secret is refused, naming its setting; with real values the ConfigMap is a valid config")


def dashboard_exprs(path):
    dashboard = json.loads(Path(path).read_text())
    exprs = []
    for panel in dashboard["panels"]:
        for target in panel.get("targets", []):
            exprs.append((panel["id"], target["refId"], target["expr"]))
    return dashboard, exprs


def check_dashboard(path, rules_out):
    """Provisioning-ready, and every query as a recording rule for promtool."""
    dashboard, exprs = dashboard_exprs(path)
    if "__inputs" in dashboard or dashboard.get("id") is not None or not dashboard.get("uid"):
        fail("not provisioning-ready: __inputs, an id, or no uid")
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    if variables.get("datasource", {}).get("type") != "datasource":
        fail("no datasource variable")
    ids = [p["id"] for p in dashboard["panels"]]
    if len(ids) != len(set(ids)):
        fail("panel ids repeat")
    for panel in dashboard["panels"]:
        if panel["type"] == "row":
            continue
        sources = [panel["datasource"]] + [t["datasource"] for t in panel["targets"]]
        if any(s.get("uid") != "${datasource}" for s in sources):
            fail(f"panel {panel['title']!r} does not use the datasource variable")
        if not panel["targets"]:
            fail(f"panel {panel['title']!r} has no query")
    # Grafana's variables, as Grafana would substitute them.
    substitute = {"$__rate_interval": "5m", "$job": ".*", "$instance": ".*"}
    rules = []
    for panel_id, ref, expr in exprs:
        for name, value in substitute.items():
            expr = expr.replace(name, value)
        if "$" in expr:
            fail(f"panel {panel_id} {ref}: an unknown variable in {expr}")
        rules.append({"record": f"dashboard:panel_{panel_id}_{ref}", "expr": expr})
    Path(rules_out).write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    print(f"{len(ids)} panels, {len(exprs)} queries, datasource variable, no __inputs")


def declared_series():
    text = (ROOT / "src/metrics/mod.rs").read_text()
    return set(re.findall(r'"(tollgate_[a-z0-9_]+)"', text))


def scraped(path):
    """{series: {label: {values}}} of a /metrics scrape."""
    series = {}
    for line in Path(path).read_text().splitlines():
        match = re.match(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? ", line)
        if not match or line.startswith("#"):
            continue
        labels = series.setdefault(match.group(1), {})
        for key, value in re.findall(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"', match.group(2) or ""):
            labels.setdefault(key, set()).add(value)
    return series


def base_name(name, declared):
    for suffix in ("_bucket", "_sum", "_count"):
        if name.endswith(suffix) and name[: -len(suffix)] in declared:
            return name[: -len(suffix)]
    return name


def source_literals():
    literals = set()
    for path in (ROOT / "src").rglob("*.rs"):
        literals |= set(re.findall(r'"([^"\\\n]{1,60})"', path.read_text()))
    return literals


def check_series(scrape_path, alerts_path, dashboard_path):
    """Every series named is declared in src/metrics/mod.rs; every label it
    is matched or grouped on is one the series has in a real scrape; every
    value it is matched to equal is one tollgate can export."""
    declared = declared_series()
    scrape = scraped(scrape_path)
    literals = source_literals()
    exprs = [(f"alert {r['alert']}", r["expr"]) for g in load_all(alerts_path)[0]["groups"] for r in g["rules"]]
    exprs += [(f"panel {p} {ref}", e) for p, ref, e in dashboard_exprs(dashboard_path)[1]]
    problems, names, pairs = [], set(), 0
    for where, expr in exprs:
        used = set(re.findall(r"\b(tollgate_[a-z0-9_]+)\b", expr))
        for name in used:
            names.add(name)
            if base_name(name, declared) not in declared:
                problems.append(f"{where}: {name} is not declared in src/metrics/mod.rs")
        for name, matchers in re.findall(r"\b(tollgate_[a-z0-9_]+)\{([^}]*)\}", expr):
            for key, op, value in re.findall(r'([a-zA-Z_]+)\s*(=~|!~|!=|=)\s*"([^"]*)"', matchers):
                if key in TARGET_LABELS:
                    continue
                pairs += 1
                if name in scrape and key not in scrape[name]:
                    problems.append(f"{where}: {name} has no label {key} (scrape: {sorted(scrape[name])})")
                if op == "=":
                    seen = scrape.get(name, {}).get(key, set())
                    status_code = key == "status" and re.fullmatch(r"[1-5][0-9][0-9]", value)
                    if value not in seen and value not in literals and not status_code:
                        problems.append(f"{where}: {name}{{{key}=\"{value}\"}}: tollgate never exports that value")
        for grouping in re.findall(r"\bby \(([^)]*)\)", expr):
            for key in (k.strip() for k in grouping.split(",")):
                if key in TARGET_LABELS or key == "le":
                    continue
                if not any(key in scrape.get(n, {}) for n in used):
                    problems.append(f"{where}: grouped by {key}, which none of {sorted(used)} has in the scrape")
        foreign = set(re.findall(r"\b([a-z_]+)\{", expr)) - {n for n in used} - FOREIGN_SERIES
        foreign -= {n for n in foreign if n.startswith("tollgate_")}
        if foreign:
            problems.append(f"{where}: series that are not tollgate's: {sorted(foreign)}")
    if problems:
        fail("\n".join(problems))
    print(f"{len(exprs)} expressions: {len(names)} tollgate series all declared; {pairs} label matchers checked against a real scrape and the code")


def check_statefulset(base_rendered, rendered):
    """The StatefulSet overlay is the base with the Deployment's pods as a
    StatefulSet's, each with a claim for the spool in place of the emptyDir."""
    base, docs = load_all(base_rendered), load_all(rendered)
    deployment = one(base, "Deployment", "tollgate")
    sts = one(docs, "StatefulSet", "tollgate")
    key = lambda d: (d["kind"], d["metadata"]["name"])
    others = sorted((d for d in docs if d["kind"] != "StatefulSet"), key=key)
    if others != sorted((d for d in base if d["kind"] != "Deployment"), key=key):
        fail("the overlay changes more of the base than the Deployment")
    spec, dspec = sts["spec"], deployment["spec"]
    if (spec["replicas"], spec["selector"]) != (dspec["replicas"], dspec["selector"]):
        fail("the StatefulSet's replicas or selector differ from the Deployment's")
    if spec["serviceName"] not in {s["metadata"]["name"] for s in by_kind(docs, "Service")}:
        fail(f"serviceName {spec['serviceName']} names no Service")
    # The pod template: the Deployment's, less the spool's emptyDir and the
    # ephemeral storage it asked for.
    expected = json.loads(json.dumps(dspec["template"]))
    pod = expected["spec"]
    (container,) = pod["containers"]
    state = next(m["name"] for m in container["volumeMounts"] if m["mountPath"] == "/var/lib/tollgate")
    pod["volumes"] = [v for v in pod["volumes"] if v["name"] != state]
    container["resources"]["requests"].pop("ephemeral-storage", None)
    if spec["template"] != expected:
        fail("the StatefulSet's pod template is not the Deployment's (less the emptyDir)")
    claims = [c["metadata"]["name"] for c in spec.get("volumeClaimTemplates", [])]
    if claims != [state]:
        fail(f"volume claims {claims}, not one for the spool's mount {state}")
    policy = spec.get("persistentVolumeClaimRetentionPolicy", {})
    if policy != {"whenDeleted": "Retain", "whenScaled": "Retain"}:
        fail(f"claims may be deleted with their spool: {policy}")
    print("the base, with the Deployment's pods as a StatefulSet's and a claim for the spool")


def main():
    command, *args = sys.argv[1:]
    {
        "statefulset": check_statefulset,
        "manifests": check_manifests,
        "crd": check_crd,
        "config": check_config,
        "dashboard": check_dashboard,
        "series": check_series,
    }[command](*args)


if __name__ == "__main__":
    main()
