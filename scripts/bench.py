#!/usr/bin/env python3
"""Load benchmark: tollgate against the Node peers, side by side, on one machine.

Run through scripts/bench.sh, which builds the release binary, installs wrk and
the peers' npm packages, then calls this with their paths. This script:

- starts a private Redis (port 6395, nothing persisted) and creates a fresh
  PostgreSQL database for the audit trail (dropped at the end);
- starts tollgate (Redis store, PostgreSQL audit, an API key; one HTTP worker
  per CPU, its default, or --workers of them, and the lean limit the same), the two peers
  of ../shared/bench (fastify + ioredis + rate-limiter-flexible: the minimal
  one, and the same-job one that runs tollgate's default policy) and, with
  --baseline, a second tollgate binary (an earlier build) on that Redis;
- for each scenario runs wrk against every side in turn (A B C, B C A, C A B ...,
  Redis flushed before every run; before tollgate's SMS runs, the pumping
  guard's hashes given a day of history, as on a running service) and
  prints, per side, the medians of req/s,
  p50, p99, p99.9, the CPU each process spent per request (service, Redis,
  every PostgreSQL process, wrk) and, for tollgate, the audit events queued, written and spooled
  during the runs; then tollgate's ratios to every other side;
- with the lean limit and the 1 M-user login scenario, the two at equal load:
  each service alone on one core, Redis and wrk on another, where Redis's core
  is the bottleneck for both, so their CPU per request compares like for
  like (on shared cores a busier service finds more requests per wake-up
  and looks cheaper per request than its code is); with --perf, one more
  round of each, outside the medians, is sampled by `perf record` and the
  CPU per request is split by part (kernel, binary, libc, the clock), crate
  and symbol;
- then Redis bytes per tracked subject after 1,000 and 100,000 events for one
  subject, the throughput of two tollgate processes sharing one Redis, and
  what logging at the default level costs (against logging nothing).

Nothing here asserts: it prints figures. Standard library only.
"""

import argparse
import http.client
import json
import os
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid

TICKS = os.sysconf("SC_CLK_TCK")
API_KEY = "bench-key-0123456789"
REDIS_PORT = 6395
TOLLGATE_PORT = 18080
TOLLGATE2_PORT = 18081
PEER_PORT = 18084
SAMEJOB_PORT = 18086
BASELINE_PORT = 18087
LEAN_PORT = 18088
# The other sides of every scenario: (name, port, how it is started).
PEERS = {"minimal": "server-rlf-fastify.js", "same-job": "server-rlf-samejob.js"}

SCENARIOS = {
    "login-1m": dict(endpoint="login", identities=1_000_000,
                     title="/login/attempt, 1,000,000 users"),
    "login-10k": dict(endpoint="login", identities=10_000,
                      title="/login/attempt, 10,000 users hammered"),
    "sms-1m": dict(endpoint="sms", identities=1_000_000,
                   title="/sms/send, 1,000,000 phones"),
    # The peer's job on tollgate: the phone's two windows only (and the code,
    # which the peer does not issue), no IP, prefix or global window.
    "sms-1m-phone-only": dict(endpoint="sms", identities=1_000_000, sms="phone-only",
                              title="/sms/send, 1,000,000 phones, phone windows only"),
}

SMS_SETTINGS = {
    # Codes must be issued: one prefix covers every benchmark phone, and the
    # global window would refuse all but 1,000 a minute. The benchmark never
    # verifies a code, which is exactly what SMS pumping looks like: the
    # pumping guard runs (its counts cost what they cost in production) with
    # min_conversion = 0, so that it never blocks.
    # The wide windows (and the IP window: every benchmark phone has its own
    # address) are GCRA meters, as docs/rules.md advises for large limits.
    "default": """
ip_limits = [{ limit = 20, window = "1h", algorithm = "gcra" }]
prefix_limits = [{ limit = 100000000, window = "1h", algorithm = "gcra" }]
global_limits = [{ limit = 100000000, window = "1m", algorithm = "gcra" }]

[sms.pumping]
min_conversion = 0
""",
    # The peer's job: no pumping guard either.
    "phone-only": """
phone_limits = [{ limit = 1, window = "60s" }, { limit = 5, window = "1h" }]
captcha_after = 5
ip_limits = []
prefix_limits = []
global_limits = []

[sms.pumping]
enabled = false
""",
}


def stat_fields(pid):
    """The fields of `/proc/<pid>/stat` after the command's name (which may
    hold spaces and parentheses): index 0 is the state, field 3 of proc(5)."""
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()


def cpu_seconds(pid):
    """utime + stime of a process (all its threads), in seconds."""
    fields = stat_fields(pid)
    return (int(fields[11]) + int(fields[12])) / TICKS


def page_faults(pid):
    """Minor and major page faults of a process (all its threads): memory an
    allocator gives back to the kernel and touches again faults, kernel
    time that no instruction count of the service shows."""
    fields = stat_fields(pid)
    return int(fields[7]) + int(fields[9])


def context_switches_by_thread(pid):
    """Voluntary and involuntary context switches of every thread of `pid`,
    summed by thread name (an HTTP worker, the audit writer's runtime, the
    journal's thread): a request that wakes more threads, or wakes one more
    often, costs the machine more than its instructions show, and the name
    says which thread it woke."""
    by_name = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/comm") as f:
                name = f.read().strip()
            n = 0
            with open(f"/proc/{pid}/task/{tid}/status") as f:
                for line in f:
                    if line.startswith(("voluntary_ctxt_switches:", "nonvoluntary_ctxt_switches:")):
                        n += int(line.split()[-1])
        except (OSError, ValueError):
            continue  # a thread gone between listdir and open
        by_name[name] = by_name.get(name, 0) + n
    return by_name


def postgres_cpu_seconds():
    """utime + stime of every PostgreSQL process (server, backends, WAL
    writer, checkpointer...): the audit database's share of the machine.
    Nothing else uses PostgreSQL during a run, so the difference across a
    run is what the audit trail cost it."""
    total = 0.0
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/comm") as f:
                if f.read().strip() != "postgres":
                    continue
            total += cpu_seconds(entry)
        except (OSError, IndexError, ValueError):
            continue  # gone between listdir and open
    return total


def pin(pid, cores):
    """Every thread of `pid` onto `cores` (threads started later inherit
    it). A core outside the allowed set fails loudly (EINVAL), so that no
    table claims a pinning that did not happen."""
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            os.sched_setaffinity(int(tid), cores)
        except ProcessLookupError:
            pass  # a thread that ended meanwhile


def port_taken(port):
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return True
    except OSError:
        return False


def ensure_free(port, what):
    """Another process already on the port would be measured in place of `what`."""
    if port_taken(port):
        sys.exit(f"bench: port {port} is taken by another process; {what} cannot use it")


def wait_port(port, what, timeout=30.0, proc=None):
    """Wait until `what` (the process `proc`, when given, still alive) listens on `port`."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc is not None and proc.poll() is not None:
            sys.exit(f"bench: {what} exited (code {proc.returncode}) before listening")
        if port_taken(port):
            return
        time.sleep(0.1)
    sys.exit(f"bench: {what} did not listen on port {port}")


def http_get(port, path):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    conn.request("GET", path)
    resp = conn.getresponse()
    body = resp.read().decode()
    conn.close()
    return resp.status, body


def audit_counts(port):
    """tollgate_audit_events_total by outcome, and the refusals answered
    (requests_total with decision deny or challenge), from /metrics."""
    _, text = http_get(port, "/metrics")
    counts = {"queued": 0, "written": 0, "spooled": 0, "replayed": 0, "refusals": 0}
    for line in text.splitlines():
        m = re.match(r'tollgate_audit_events_total\{outcome="(\w+)"\} (\d+)', line)
        if m:
            counts[m.group(1)] = int(m.group(2))
        m = re.match(r'tollgate_requests_total\{.*decision="(deny|challenge)".*\} (\d+)', line)
        if m:
            counts["refusals"] += int(m.group(2))
    return counts


def post_one(conn, endpoint, i, ipv6=False):
    """One request of the benchmark's mix on `conn` (an http.client
    connection to tollgate): the `i`-th SMS send (its own phone and
    address) or login failure; answers the status. With `ipv6`, the
    address is IPv6, each in a /48 of its own."""
    ip = f"10.{(i >> 16) & 255}.{(i >> 8) & 255}.{i & 255}"
    if ipv6:
        ip = f"2001:db8:{i & 0xffff:x}:{(i >> 16) & 0xffff:x}::1"
    if endpoint == "sms":
        path, body = "/sms/send", {"phone": f"+86138{i:08d}", "ip": ip}
    else:
        path, body = "/login/attempt", {"user": f"user{i:05d}", "ip": ip, "success": False}
    headers = {"Content-Type": "application/json", "Authorization": f"Bearer {API_KEY}"}
    conn.request("POST", path, json.dumps(body), headers)
    resp = conn.getresponse()
    resp.read()
    return resp.status


def redis_cli(*args):
    out = subprocess.run(["redis-cli", "-p", str(REDIS_PORT), *args],
                         check=True, capture_output=True, text=True)
    return out.stdout.strip()


# The pumping guard's default slices and buckets (sms.pumping: a 1 h window
# in 12 slices, a 7 d history in 7 buckets).
SLICE_MS, BUCKET_MS = 300_000, 86_400_000


def conversion_history(port):
    """A day of the pumping guard's history in the conversion hashes the
    benchmark's sends count in (one prefix, one country), as on a service
    that has been sending for a while: 12 live slices of sends and
    verifies, and for the country 7 buckets of its normal (and today's
    bucket, which the normal does not count yet). Starting from
    empty hashes, as the benchmark did until 2026-11-28, a send read three
    fields of each, where a running service reads some forty: the cost of
    reading them did not show. One send first makes the keys, whatever the
    key scheme of the binary.

    The fields go in the order a running service's hash holds them (a
    listpack keeps its fields in the order they were made, and a read
    scans from the first): its expiry and its cached sums ("exp", "cur",
    "be", "bs", with a surge "nt"), made in its first slices and
    rewritten in place since, then the buckets, then the slices, oldest
    first, as they come and go at the end. The sums are stale ("cur" 0), so
    the first send makes them again in place, as the first send of a
    slice does; finding the slice before it busy, it writes each hash
    again with the sums and the current slice first (lua/reserve.lua, as
    a running service's first send of a busy slice does), and the sends
    after it read that order. scripts/conversion-order.py prints a running
    service's order. (The first version of this history put the sums last and the
    current slice's counts first, where a send finds them at once; a
    running service's current slice is last, after every live slice of
    the same length, each compared: in that order a send costs Redis
    about 9 k instructions more, 2.5 %.)"""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    conn.request("POST", "/sms/send", json.dumps({"phone": "+8613800999999", "ip": "10.255.255.254"}),
                 {"Content-Type": "application/json", "Authorization": f"Bearer {API_KEY}"})
    conn.getresponse().read()
    conn.close()
    seconds, micros = (int(x) for x in redis_cli("TIME").split())
    now = seconds * 1000 + micros // 1000
    slice_, bucket = now // SLICE_MS, now // BUCKET_MS
    keys = [k for k in redis_cli("--scan", "--pattern", "*:conversion").split("\n") if k]
    if len(keys) != 2:
        sys.exit(f"bench: expected a prefix's and a country's conversion hash, found {keys}")
    for key in keys:
        country = "{country:" in key
        # exp and the key's expiry as the service sets them: far enough.
        keep = 9 * BUCKET_MS
        fields = ["exp", str(now + keep), "cur", "0", "be", "0", "bs", "0"]
        if country:
            fields += ["nt", "0"]
            # the seven days the normal is taught, and today's (made when
            # today's first slice left the window; not taught yet)
            fields += [x for b in range(7, -1, -1) for x in (f"n:{bucket - b}", str(1000 + b))]
        for i in range(11, -1, -1):
            fields += [f"e:{slice_ - i}", str(50 + i), f"s:{slice_ - i}", str(10 + i)]
        redis_cli("DEL", key)
        redis_cli("HSET", key, *fields)
        redis_cli("PEXPIRE", key, str(keep))


def psql(db, sql):
    out = subprocess.run(["psql", "-h", "127.0.0.1", "-U", "postgres", "-d", db,
                          "-Atqc", sql], check=True, capture_output=True, text=True)
    return out.stdout.strip()


PERF_HZ = 4999


def crate_of(symbol):
    """The crate a Rust symbol's code comes from (`actix_http`, `fred`, …),
    or the C function's name family (`mi_*`: mimalloc, `__mem*`: libc)."""
    name = re.sub(r"^(?:[<&*\s]|mut |dyn )*", "", symbol)
    if name.startswith(("mi_", "_mi_")):
        return "mimalloc"
    if name.startswith("__mem"):
        return "libc memcpy/memset"
    if name.startswith("__vdso"):
        return "clock (vDSO)"
    return re.split(r"::|<|\s", name)[0] or symbol


def perf_split(data, seconds, used, exe, rps, side):
    """A `perf record` of a service, as µs of CPU per request: by part
    (kernel, the service's binary, libc, vdso: the clock), by crate and by
    symbol, and the share of the CPU the process used while sampled
    (`used` seconds) that the samples account for; `exe` is the name of the
    service's binary, as perf names its samples. Each row's period is its
    CPU time (cpu-clock counts nanoseconds); the requests are the run's rate
    times the sampled seconds. None when perf report gives nothing."""
    done = subprocess.run(["perf", "report", "-i", data, "--stdio", "-F", "period,dso,sym"],
                          capture_output=True, text=True, check=False)
    per_ns = 1e-3 / max(rps * seconds, 1)
    parts, crates, symbols = {}, {}, {}
    for line in done.stdout.splitlines():
        m = re.match(r"\s*(\d+)\s+(\S+)\s+\[(.)\]\s+(.*)", line)
        if not m:
            continue
        us = int(m.group(1)) * per_ns
        dso, kernel, symbol = m.group(2), m.group(3) == "k", m.group(4).strip()
        part = "kernel" if kernel else ("binary" if dso == exe
                                        else dso.split(".so")[0].strip("[]"))
        crate = "kernel" if kernel else crate_of(symbol)
        for table, key in ((parts, part), (crates, crate), (symbols, symbol)):
            table[key] = table.get(key, 0.0) + us
    if not parts:
        print(f"  (--perf: perf report read no samples for {side}: {done.stderr.strip()[:200]})")
        return None
    if not parts.get("kernel"):
        print(f"  (--perf: no kernel samples for {side}: perf_event_paranoid above 1 hides them)")
    sampled = sum(parts.values()) / per_ns * 1e-9
    return parts, crates, symbols, sampled / used if used > 0 else 0.0


def differences(tollgate, lean, n):
    """The `n` keys where tollgate's µs exceed the lean limit's most."""
    keys = sorted(set(tollgate) | set(lean), key=lambda k: lean.get(k, 0.0) - tollgate.get(k, 0.0))
    return "; ".join(f"{k[:100]} {tollgate.get(k, 0.0) - lean.get(k, 0.0):+.2f}" for k in keys[:n])


def print_perf_split(tollgate, lean):
    """Where tollgate's extra CPU per login goes, against the lean limit's,
    from one sampled round of each at equal load."""
    (t_parts, t_crates, t_syms, t_share), (l_parts, l_crates, l_syms, l_share) = tollgate, lean
    print("\nWhere the CPU per login goes (perf record, cpu-clock, one more round each, not in the "
          "medians above; µs per request; compare the parts, not the totals with the table):")
    print("| part | tollgate | lean | difference |")
    print("|---|---|---|---|")
    for part in sorted(set(t_parts) | set(l_parts), key=lambda p: -t_parts.get(p, 0.0)):
        t, l = t_parts.get(part, 0.0), l_parts.get(part, 0.0)
        if max(t, l) >= 0.05:
            print(f"| {part} | {t:.2f} | {l:.2f} | {t - l:+.2f} |")
    t, l = sum(t_parts.values()), sum(l_parts.values())
    print(f"| all | {t:.2f} | {l:.2f} | {t - l:+.2f} |")
    print(f"| sampled / CPU used while sampling | {t_share:.0%} | {l_share:.0%} | |")
    if min(t_share, l_share) < 0.8:
        # Seen on a VM without a PMU: cpu-clock samples went missing for
        # one process and not the other, and the split said nothing true.
        print("Warning: perf's samples account for under 80 % of the CPU a process used while it "
              "sampled: this machine loses cpu-clock samples, and the split below is not reliable.")
    print("The crates that differ most (µs per request, tollgate − lean): "
          + differences(t_crates, l_crates, 12))
    print("The symbols that differ most: " + differences(t_syms, l_syms, 12))


def rotations(sides, rounds):
    """The order of each round: the first as given, each next one starting
    one side later (A B C, B C A, C A B, A B C ...), so that no side always
    runs first after a flush. On the ninth machine one binary measured
    against itself (SMS, five rounds) gave 0.94x in the fixed order and
    1.04x rotated: the order is within the noise there, but no longer a
    question (docs/benchmarks.md)."""
    for r in range(rounds):
        k = r % len(sides)
        yield sides[k:] + sides[:k]


class Bench:
    def __init__(self, args):
        self.args = args
        self.tmp = tempfile.mkdtemp(prefix="tollgate-bench-")
        self.procs = []
        self.db = f"tollgate_bench_{uuid.uuid4().hex[:12]}"
        # One audit database per binary: a baseline of another version finds
        # migrations it does not know in the newer one's and audits nothing.
        self.dbs = {}
        # Whether each tollgate binary knows `server.workers`.
        self.knows_workers = {}

    # -- processes ---------------------------------------------------------

    def start(self, cmd, log, env=None, cwd=None):
        proc = subprocess.Popen(cmd, stdout=open(log, "w"), stderr=subprocess.STDOUT,
                                env={**os.environ, **(env or {})}, cwd=cwd)
        self.procs.append(proc)
        return proc

    def start_redis(self):
        ensure_free(REDIS_PORT, "redis")
        self.redis = self.start(
            ["redis-server", "--port", str(REDIS_PORT), "--bind", "127.0.0.1",
             "--save", "", "--appendonly", "no", "--dir", self.tmp],
            os.path.join(self.tmp, "redis.log"))
        wait_port(REDIS_PORT, "redis", proc=self.redis)

    def database_of(self, binary):
        """The audit database of `binary`'s processes, created on first use."""
        if binary not in self.dbs:
            name = f"{self.db}_{len(self.dbs)}"
            psql("postgres", f"CREATE DATABASE {name}")
            self.dbs[binary] = name
        return self.dbs[binary]

    def tollgate_config(self, port, backend="redis", sms="default", binary=None):
        # A directory of its own: tollgate watches its config file's
        # directory for reloads, and every log line written beside it would
        # wake the watcher.
        path = os.path.join(self.tmp, f"config-{port}", "tollgate.toml")
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as f:
            f.write(f"""
[server]
bind = "127.0.0.1:{port}"
api_keys = ["{API_KEY}"]
admin_tokens = ["bench-admin-token-0123456789"]
{self.workers_line(binary or self.args.tollgate)}

[store]
backend = "{backend}"
redis_url = "redis://127.0.0.1:{REDIS_PORT}"

[audit]
database_url = "postgres://postgres@127.0.0.1:5432/{self.database_of(binary or self.args.tollgate)}"
spool_dir = "{self.tmp}/spool-{port}"

[sms]
code_secret = "bench-code-secret-0123456789abcdef"
{SMS_SETTINGS[sms]}""")
        return path

    def workers_line(self, binary):
        """`workers = n` for a binary that knows `server.workers` (a baseline
        built before it refuses the key; it then runs one worker per CPU,
        said once), or nothing with --workers 0."""
        workers = getattr(self.args, "workers", 0)
        if not workers:
            return ""
        known = self.knows_workers
        if binary not in known:
            probe = os.path.join(self.tmp, "workers-probe.toml")
            with open(probe, "w") as f:
                f.write(f"[server]\nworkers = {workers}\n")
            check = subprocess.run([binary, "check-config", "--config", probe],
                                   capture_output=True, text=True)
            known[binary] = check.returncode == 0
            if not known[binary]:
                if "server.workers" not in check.stderr:
                    sys.exit(f"bench: {binary} check-config: {check.stderr.strip()}")
                print(f"note: {binary} has no server.workers; it runs one worker per CPU")
        return f"workers = {workers}" if known[binary] else ""

    def start_tollgate(self, port, backend="redis", log_filter=None, sms="default", binary=None):
        # The development `log` SMS provider prints every code (target tollgate::sms);
        # a real provider is an HTTP call that logs nothing, so its line is
        # filtered out. Everything else logs at the default level.
        env = {"RUST_LOG": log_filter or os.environ.get("RUST_LOG", "info,tollgate::sms=error")}
        ensure_free(port, "tollgate")
        proc = self.start([binary or self.args.tollgate, "serve", "--config",
                           self.tollgate_config(port, backend, sms, binary)],
                          os.path.join(self.tmp, f"tollgate-{port}.log"), env=env)
        wait_port(port, "tollgate", proc=proc)
        return proc

    def start_peers(self):
        self.peers = {}
        for (name, script), port in zip(PEERS.items(), (PEER_PORT, SAMEJOB_PORT)):
            ensure_free(port, f"the {name} peer")
            proc = self.start(["node", script], os.path.join(self.tmp, f"peer-{name}.log"),
                              env={"PORT": str(port), "REDIS_PORT": str(REDIS_PORT)},
                              cwd=self.args.peer)
            wait_port(port, f"the {name} peer", proc=proc)
            self.peers[name] = (port, proc)

    def start_lean(self):
        """The lean limit of /login/attempt (examples/lean_login.rs)."""
        ensure_free(LEAN_PORT, "the lean service")
        workers = [str(self.args.workers)] if self.args.workers else []
        self.lean = self.start([self.args.lean, f"127.0.0.1:{LEAN_PORT}",
                                f"redis://127.0.0.1:{REDIS_PORT}"] + workers,
                               os.path.join(self.tmp, "lean.log"))
        wait_port(LEAN_PORT, "the lean service", proc=self.lean)

    def sides(self, scenario):
        """Every side of a scenario, tollgate first; the lean limit on login."""
        names = ["tollgate"] + (["baseline"] if self.args.baseline else [])
        if self.args.lean and scenario["endpoint"] == "login":
            names.append("lean")
        return names + list(PEERS)

    def tollgate_side(self, side, sms):
        """The (port, process) of tollgate or the baseline for an SMS config,
        started the first time it is needed."""
        key = (side, sms)
        if key not in self.instances:
            base = TOLLGATE_PORT if side == "tollgate" else BASELINE_PORT
            port = base if sms == "default" else base + 100
            binary = self.args.tollgate if side == "tollgate" else self.args.baseline
            self.instances[key] = (port, self.start_tollgate(port, sms=sms, binary=binary))
        return self.instances[key]

    def stop(self):
        for proc in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in self.procs:
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
        for db in self.dbs.values():
            try:
                psql("postgres", f"DROP DATABASE IF EXISTS {db} WITH (FORCE)")
            except subprocess.CalledProcessError as e:
                print(f"bench: could not drop {db}: {e.stderr}", file=sys.stderr)
        shutil.rmtree(self.tmp, ignore_errors=True)

    # -- one wrk run -------------------------------------------------------

    def wrk(self, port, endpoint, identities, duration, connections=50, threads=1, auth=True,
            cores=None):
        env = {**os.environ, "ENDPOINT": endpoint, "IDENTITIES": str(identities),
               "MIX": self.args.mix}
        if auth:
            env["AUTH"] = API_KEY
        cmd = ["wrk", f"-t{threads}", f"-c{connections}", f"-d{duration}s",
               "-s", self.args.wrk_script, f"http://127.0.0.1:{port}"]
        pinned = (lambda: os.sched_setaffinity(0, cores)) if cores else None
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                env=env, text=True, preexec_fn=pinned)
        return proc

    @staticmethod
    def finish(proc):
        out = proc.stdout.read()
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = status
        m = re.search(r"WRKRESULT (.*)", out)
        if not m:
            sys.exit(f"bench: wrk printed no result:\n{out}")
        result = {k: float(v) for k, v in (kv.split("=") for kv in m.group(1).split())}
        setup = re.search(r"WRKINIT cpu_s=([0-9.]+)", out)
        result["wrk_cpu"] = usage.ru_utime + usage.ru_stime - (float(setup.group(1)) if setup else 0.0)
        return result

    def measure(self, side, scenario):
        tollgate = side in ("tollgate", "baseline")
        if tollgate:
            port, proc = self.tollgate_side(side, scenario.get("sms", "default"))
        elif side == "lean":
            port, proc = LEAN_PORT, self.lean
        else:
            port, proc = self.peers[side]
        pid = proc.pid
        redis_cli("FLUSHALL")
        if tollgate and scenario["endpoint"] == "sms" and scenario.get("sms", "default") == "default":
            conversion_history(port)
        before = (cpu_seconds(pid), cpu_seconds(self.redis.pid))
        pg_before = postgres_cpu_seconds()
        audit_before = audit_counts(port) if tollgate else None
        r = self.finish(self.wrk(port, scenario["endpoint"], scenario["identities"],
                                 self.args.duration, auth=tollgate))
        after = (cpu_seconds(pid), cpu_seconds(self.redis.pid))
        n = max(r["requests"], 1)
        r["service_us"] = (after[0] - before[0]) / n * 1e6
        r["redis_us"] = (after[1] - before[1]) / n * 1e6
        r["wrk_us"] = r["wrk_cpu"] / n * 1e6
        if audit_before is not None:
            time.sleep(1.0)  # let the writer flush what the run queued
            audit_after = audit_counts(port)
            r["audit"] = {k: audit_after[k] - audit_before[k] for k in audit_after}
        # After the flush: the rows of this run are in, and their cost counted.
        r["pg_us"] = (postgres_cpu_seconds() - pg_before) / n * 1e6
        return r

    # -- the report --------------------------------------------------------

    def scenarios(self):
        rows = []
        for name in self.args.scenarios:
            scenario = SCENARIOS[name]
            runs = {side: [] for side in self.sides(scenario)}
            for order in rotations(list(runs), self.args.rounds):
                for side in order:
                    runs[side].append(self.measure(side, scenario))
            rows.append((scenario["title"], runs))
            self.print_scenario(scenario["title"], runs)
        return rows

    @staticmethod
    def median(runs, key):
        return statistics.median(r[key] for r in runs)

    def print_scenario(self, title, runs):
        print(f"\n### {title}  (medians of {self.args.rounds} runs of {self.args.duration}s per side, "
              f"rotated {' → '.join(runs)}, each round starting one side later)")
        print("| side | req/s | p50 ms | p99 ms | p99.9 ms | non-2xx | service CPU/req | Redis CPU/req "
              "| service + Redis | PostgreSQL CPU/req | wrk CPU/req | audit queued / written / spooled |")
        print("|---|---|---|---|---|---|---|---|---|---|---|---|")
        for side, rs in runs.items():
            m = lambda k: self.median(rs, k)
            audit = "—"
            if "audit" in rs[0]:
                total = {k: sum(r["audit"][k] for r in rs)
                         for k in ("refusals", "queued", "written", "spooled")}
                audit = (f"{total['queued']:,} / {total['written']:,} / {total['spooled']:,}"
                         f" ({total['refusals']:,} refusals answered)")
            print(f"| {side} | {m('rps'):,.0f} | {m('p50_us')/1000:.2f} | {m('p99_us')/1000:.2f} | "
                  f"{m('p999_us')/1000:.2f} | {m('non2xx'):.0f} | {m('service_us'):.0f} µs | "
                  f"{m('redis_us'):.0f} µs | {m('service_us') + m('redis_us'):.0f} µs | "
                  f"{m('pg_us'):.0f} µs | {m('wrk_us'):.0f} µs | {audit} |")
        t = runs["tollgate"]
        cost = lambda rs: self.median(rs, "service_us") + self.median(rs, "redis_us")
        for side, rs in runs.items():
            if side == "tollgate":
                continue
            rps = self.median(t, "rps") / self.median(rs, "rps")
            per_round = ", ".join(f"{a['rps'] / b['rps']:.2f}" for a, b in zip(t, rs))
            print(f"tollgate / {side}: req/s {rps:.2f} (per round: {per_round}), "
                  f"service + Redis CPU per request {cost(t) / cost(rs):.2f}")
        sys.stdout.flush()

    def equal_load(self):
        """tollgate and the lean limit at the same load: each service alone
        on one core, Redis and wrk on another. Redis's core is then the
        bottleneck of both, so both serve about as many logins a second and
        their CPU per request compares like for like."""
        scenario = SCENARIOS["login-1m"]
        sides = {"tollgate": (TOLLGATE_PORT, self.tollgate), "lean": (LEAN_PORT, self.lean)}
        service_core, redis_core = sorted(os.sched_getaffinity(0))[:2]
        print(f"\n### {scenario['title']}, equal load: each service alone on core {service_core}, "
              f"Redis and wrk on core {redis_core} (medians of {self.args.rounds} runs of "
              f"{self.args.duration}s, alternated)")
        print("| side | req/s | non-2xx | service CPU/req | Redis CPU/req | service context switches/req "
              "| service page faults/req |")
        print("|---|---|---|---|---|---|---|")
        runs = {side: [] for side in sides}
        profiles = {}
        redis_mask = os.sched_getaffinity(self.redis.pid)
        pin(self.redis.pid, {redis_core})
        try:
            for order in rotations(list(sides), self.args.rounds):
                for side in order:
                    port, proc = sides[side]
                    runs[side].append(self.pinned_round(side, port, proc, service_core, redis_core))
            # One more round each, sampled by perf: its interrupts are billed
            # to the service and perf itself runs on either core, so it is
            # not one of the rounds above.
            if self.args.perf:
                for side, (port, proc) in sides.items():
                    r = self.pinned_round(side, port, proc, service_core, redis_core, sample=True)
                    if r.get("profile"):
                        profiles[side] = r["profile"]
        finally:
            pin(self.redis.pid, redis_mask)
        for side, rs in runs.items():
            m = lambda k: self.median(rs, k)
            print(f"| {side} | {m('rps'):,.0f} | {m('non2xx'):.0f} | {m('service_us'):.1f} µs | "
                  f"{m('redis_us'):.1f} µs | {m('switches'):.3f} | {m('faults'):.3f} |")
        for side, rs in runs.items():
            names = sorted({name for r in rs for name in r["switches_by_thread"]})
            share = {name: statistics.median(r["switches_by_thread"].get(name, 0.0) for r in rs)
                     for name in names}
            busiest = sorted(share.items(), key=lambda kv: -kv[1])[:4]
            print(f"  {side}'s context switches per request by thread: "
                  + ", ".join(f"{name} {v:.3f}" for name, v in busiest))
        t, lean = runs["tollgate"], runs["lean"]
        rps = self.median(t, "rps") / self.median(lean, "rps")
        per_round = ", ".join(f"{a['service_us'] / b['service_us']:.2f}" for a, b in zip(t, lean))
        # Three decimals: the target is "within 10 %", and 1.105 printed as
        # 1.10 reads as met.
        print(f"tollgate / lean at equal load: req/s {rps:.2f}, service CPU per request "
              f"{self.median(t, 'service_us') / self.median(lean, 'service_us'):.3f} "
              f"(per round: {per_round})")
        if abs(rps - 1) > 0.1:
            print("  (the loads differ by more than 10 %: the CPU ratio is not like for like)")
        if len(profiles) == 2:
            print_perf_split(profiles["tollgate"], profiles["lean"])
        sys.stdout.flush()

    def pinned_round(self, side, port, proc, service_core, redis_core, sample=False):
        """One equal-load run of `side`: the service on `service_core`, wrk
        (and Redis, pinned by the caller) on `redis_core`."""
        scenario = SCENARIOS["login-1m"]
        mask = os.sched_getaffinity(proc.pid)
        pin(proc.pid, {service_core})
        try:
            redis_cli("FLUSHALL")
            before = (cpu_seconds(proc.pid), cpu_seconds(self.redis.pid))
            switches = context_switches_by_thread(proc.pid)
            faults = page_faults(proc.pid)
            load = self.wrk(port, "login", scenario["identities"], self.args.duration,
                            auth=side == "tollgate", cores={redis_core})
            sampled = self.perf_record(proc.pid, side) if sample else None
            r = self.finish(load)
            if sampled:
                r["profile"] = perf_split(*sampled, r["rps"], side)
            n = max(r["requests"], 1)
            r["service_us"] = (cpu_seconds(proc.pid) - before[0]) / n * 1e6
            r["redis_us"] = (cpu_seconds(self.redis.pid) - before[1]) / n * 1e6
            by_thread = context_switches_by_thread(proc.pid)
            r["switches_by_thread"] = {name: (c - switches.get(name, 0)) / n
                                       for name, c in by_thread.items()}
            r["switches"] = sum(r["switches_by_thread"].values())
            r["faults"] = (page_faults(proc.pid) - faults) / n
        finally:
            pin(proc.pid, mask)
        return r

    def perf_record(self, pid, side):
        """Sample `pid` with `perf record` (cpu-clock, so that it works on a
        virtual machine without hardware counters) through the middle of a
        wrk run: from its second second to one second before its end."""
        if not shutil.which("perf"):
            print("  (--perf: no perf here; Debian's linux-perf has it)")
            return None
        seconds = self.args.duration - 2
        data = os.path.join(self.tmp, "perf", f"perf-{side}.data")
        os.makedirs(os.path.dirname(data), exist_ok=True)
        time.sleep(1)
        # cpu-clock, not the default `cycles`: the same event on a machine
        # with hardware counters and on one without.
        # A copied binary keeps its new name: perf names samples by file.
        exe = os.path.basename(os.readlink(f"/proc/{pid}/exe"))
        before = cpu_seconds(pid)
        done = subprocess.run(["perf", "record", "-q", "-e", "cpu-clock", "-F", str(PERF_HZ),
                               "-p", str(pid), "-o", data, "--", "sleep", str(seconds)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                              check=False)
        if done.returncode != 0 or not os.path.exists(data) or os.path.getsize(data) == 0:
            print(f"  (--perf: perf record failed for {side}: {done.stderr.strip()[:200]})")
            return None
        return data, seconds, cpu_seconds(pid) - before, exe

    def memory_per_subject(self):
        """Redis bytes for one IP subject after N login failures from it."""
        print("\n### Redis bytes per tracked subject (one IP, N login failures by distinct users)")
        print("| events | keys of the IP | bytes (MEMORY USAGE) |")
        print("|---|---|---|")
        redis_cli("FLUSHALL")
        conn = http.client.HTTPConnection("127.0.0.1", TOLLGATE_PORT, timeout=10)
        headers = {"Content-Type": "application/json", "Authorization": f"Bearer {API_KEY}"}
        sent = 0
        for target in (1_000, 100_000):
            while sent < target:
                body = json.dumps({"user": f"mem{sent}", "ip": "192.0.2.1", "success": False})
                conn.request("POST", "/login/attempt", body, headers)
                conn.getresponse().read()
                sent += 1
            keys = [k for k in redis_cli("--scan", "--pattern", "tg:{ip:192.0.2.1}:*").split("\n") if k]
            total = sum(int(redis_cli("MEMORY", "USAGE", k, "SAMPLES", "0") or 0) for k in keys)
            print(f"| {sent:,} | {len(keys)} | {total:,} |")
        conn.close()

    def two_processes(self):
        """Two tollgate processes on one Redis, each driven by its own wrk."""
        second = self.start_tollgate(TOLLGATE2_PORT)
        print(f"\n### Scale-out: /login/attempt, 1,000,000 users, {self.args.duration}s")
        print("| tollgate processes | req/s (sum) | Redis CPU | services' CPU |")
        print("|---|---|---|---|")
        for ports in ((TOLLGATE_PORT,), (TOLLGATE_PORT, TOLLGATE2_PORT)):
            redis_cli("FLUSHALL")
            pids = [self.tollgate.pid, second.pid][:len(ports)]
            before = [cpu_seconds(p) for p in pids], cpu_seconds(self.redis.pid)
            started = time.time()
            procs = [self.wrk(p, "login", 1_000_000, self.args.duration) for p in ports]
            results = [self.finish(p) for p in procs]
            elapsed = time.time() - started
            svc = sum(cpu_seconds(p) for p in pids) - sum(before[0])
            redis = cpu_seconds(self.redis.pid) - before[1]
            print(f"| {len(ports)} | {sum(r['rps'] for r in results):,.0f} | "
                  f"{redis / elapsed * 100:.0f} % of a core | {svc / elapsed * 100:.0f} % of a core |")
        second.send_signal(signal.SIGTERM)
        second.wait(timeout=20)

    def logging_cost(self):
        """The in-process store (where logging weighs most), logging at the
        default level against logging nothing, alternated."""
        ports = {"info (default)": 18082, "off": 18083}
        procs = [self.start_tollgate(port, "memory", "info" if "info" in name else "off")
                 for name, port in ports.items()]
        print(f"\n### Logging cost: /login/attempt, 1,000,000 users, in-process store "
              f"(medians of {self.args.rounds} runs of {self.args.duration}s, alternated)")
        print("| RUST_LOG | req/s | p99 ms |")
        print("|---|---|---|")
        runs = {name: [] for name in ports}
        for order in rotations(list(ports), self.args.rounds):
            for name in order:
                port = ports[name]
                runs[name].append(self.finish(self.wrk(port, "login", 1_000_000, self.args.duration)))
        for name in ports:
            print(f"| {name} | {self.median(runs[name], 'rps'):,.0f} | "
                  f"{self.median(runs[name], 'p99_us') / 1000:.2f} |")
        cost = 1 - self.median(runs["info (default)"], "rps") / self.median(runs["off"], "rps")
        print(f"logging at the default level costs {cost * 100:.1f} % of throughput")
        for proc in procs:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=20)

    def run(self):
        self.start_redis()
        self.instances = {}
        self.tollgate = self.tollgate_side("tollgate", "default")[1]
        if self.args.baseline:
            self.tollgate_side("baseline", "default")
        self.start_peers()
        if self.args.lean:
            self.start_lean()
        print(f"tollgate {self.args.tollgate}; baseline {self.args.baseline or '-'}; "
              f"peers {self.args.peer}; {os.cpu_count()} cores; "
              f"HTTP workers {self.args.workers or 'one per CPU'}; wrk -t1 -c50; CPU per request from /proc/<pid>/stat (service, Redis) and wait4 (wrk)")
        self.scenarios()
        if self.args.lean and "login-1m" in self.args.scenarios and len(os.sched_getaffinity(0)) >= 2:
            self.equal_load()
        if not self.args.no_extras:
            self.memory_per_subject()
            self.two_processes()
            self.logging_cost()
        for binary, db in self.dbs.items():
            rows = int(psql(db, "SELECT count(*) FROM audit_events"))
            print(f"\naudit: {rows:,} rows in PostgreSQL from every process of {binary}")


def non_negative(text):
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError("must be 0 or more")
    return value


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tollgate", required=True, help="the release binary")
    parser.add_argument("--peer", required=True, help="node-peer directory with node_modules")
    parser.add_argument("--mix", required=True, help="../shared/bench/wrk/anti_abuse.lua")
    parser.add_argument("--wrk-script", required=True, help="benches/wrk/anti_abuse.lua")
    parser.add_argument("--baseline", help="an earlier tollgate binary, measured in the same rotation")
    parser.add_argument("--lean", help="the lean limit of /login/attempt (examples/lean_login.rs, release)")
    parser.add_argument("--workers", type=non_negative, default=0,
                        help="HTTP workers of tollgate, the baseline and the lean limit "
                             "(0: one per CPU, their default)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--duration", type=int, default=6)
    parser.add_argument("--scenarios", nargs="+", default=list(SCENARIOS), choices=list(SCENARIOS))
    parser.add_argument("--no-extras", action="store_true",
                        help="skip the memory and two-process measurements")
    parser.add_argument("--perf", action="store_true",
                        help="at equal load, sample one more round of each service with perf record "
                             "and print where tollgate's CPU per login goes against the lean limit's")
    args = parser.parse_args()
    if args.perf and args.duration < 3:
        parser.error("--perf samples from a run's second second to one before its end: --duration 3 or more")
    # SIGTERM (a timeout, `kill`) ends a run through `finally`, as Ctrl-C
    # does: before, the services stayed up and the next run found their
    # ports taken.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))
    bench = Bench(args)
    try:
        bench.run()
    finally:
        bench.stop()


if __name__ == "__main__":
    main()
