#!/usr/bin/env python3
"""Instructions per request of one service, counted by callgrind.

Wall time on a shared 2-core machine moves by 10 % from run to run; an
instruction count of the same binary and requests does not. This starts a
private Redis (and, for tollgate, a fresh PostgreSQL audit database, dropped
at the end), runs the service under `valgrind --tool=callgrind`, sends
--warmup requests, zeroes the counters, sends --requests more one at a time
over one keep-alive connection, and prints the instructions per request
(every thread of the service, memset and memcpy included). With --keep the
callgrind file stays, for `callgrind_annotate --inclusive=yes`.

  scripts/service_cost.py --binary target/dist/tollgate --endpoint login
  scripts/service_cost.py --binary target/dist/examples/lean_login --lean
  scripts/service_cost.py --binary ... --endpoint hammered   # 50 users, refusals audited
  scripts/service_cost.py --binary ... --endpoint sms
  scripts/service_cost.py --binary ... --endpoint hammered --threads   # each thread apart
  scripts/service_cost.py --binary target/dist/tollgate --idle 30   # natively: idle CPU, wake-ups

Nothing here asserts: it prints a figure. Standard library only; the
request bodies are those of ../shared/bench/wrk/anti_abuse.lua.
"""

import argparse
import glob
import http.client
import itertools
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench  # noqa: E402  (the benchmark's ports, key and SMS settings)

PORT = 18090
REDIS_PORT = 6396


def body(endpoint, k):
    ip = f"10.{k // 65536 % 256}.{k // 256 % 256}.{k % 256}"
    if endpoint == "sms":
        return f'{{"phone":"+86138{k:08d}","ip":"{ip}"}}'
    return f'{{"user":"user{k:05d}","ip":"{ip}","success":false}}'


def cpu_ticks(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])


def threads(pid):
    """Per thread: its name, CPU nanoseconds and voluntary context switches
    (each one a sleep the thread woke from)."""
    out = {}
    for task in glob.glob(f"/proc/{pid}/task/*"):
        try:
            with open(f"{task}/comm") as f:
                name = f.read().strip()
            with open(f"{task}/schedstat") as f:
                ns = int(f.read().split()[0])
            with open(f"{task}/status") as f:
                woke = int(re.search(r"^voluntary_ctxt_switches:\s+(\d+)", f.read(), re.M).group(1))
        except (OSError, AttributeError):
            continue  # a thread that ended
        out[task.rsplit("/", 1)[1]] = (name, ns, woke)
    return out


def idle_cost(pid, seconds):
    """Print what the service costs doing nothing for `seconds`: CPU and
    wake-ups a second, every thread, and the threads that woke most."""
    before = threads(pid)
    time.sleep(seconds)
    after = threads(pid)
    rows = []
    for tid, (name, ns, woke) in after.items():
        _, ns0, woke0 = before.get(tid, (name, 0, 0))
        rows.append((name, (ns - ns0) / 1e9 / seconds, (woke - woke0) / seconds))
    cpu = sum(r[1] for r in rows)
    wakes = sum(r[2] for r in rows)
    print(f"idle over {seconds:g} s: {cpu * 100:.2f} % of a core, {wakes:.1f} wake-ups a second "
          f"({len(rows)} threads)")
    for name, share, woke in sorted(rows, key=lambda r: -r[2])[:6]:
        if woke > 0:
            print(f"  {name:<20} {woke:6.1f} wake-ups/s  {share * 100:.3f} % of a core")


def wait_idle(pid, quiet_s=2.0, timeout=300.0):
    """Until the process spends under 12 % of a core for quiet_s (tollgate
    compiles its phone patterns on a thread at start-up: a minute under
    valgrind at a whole core, which would otherwise be counted). Not 5 %:
    an idle tollgate's timers (mostly the Redis store's timer floor, each
    HTTP worker's 37 wake-ups a second: `--idle`) cost about 0.3 % of a
    core natively, which valgrind makes 4-6 % on some machines, so it
    never looked idle there."""
    deadline = time.time() + timeout
    last = cpu_ticks(pid)
    while time.time() < deadline:
        time.sleep(quiet_s)
        now = cpu_ticks(pid)
        if (now - last) / bench.TICKS < 0.12 * quiet_s:
            return
        last = now
    sys.exit("service_cost: the service never went idle")


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--binary", required=True)
    p.add_argument("--lean", action="store_true", help="the binary is examples/lean_login")
    p.add_argument("--endpoint", choices=["login", "hammered", "sms"], default="login")
    p.add_argument("--requests", type=int, default=2000)
    p.add_argument("--warmup", type=int, default=500)
    p.add_argument("--keep", metavar="FILE", help="keep the callgrind output here")
    p.add_argument("--cache-sim", action="store_true",
                   help="also simulate the caches (callgrind --cache-sim=yes): first-level "
                        "instruction and data misses and last-level misses a request, where "
                        "the CPU time of two builds differs by more than their instructions")
    p.add_argument("--threads", action="store_true",
                   help="count each thread apart (callgrind --separate-threads=yes) and print "
                        "each one's instructions a request besides the total (threads under 1 %% "
                        "of it left out): the HTTP worker against the audit writer's runtime, say")
    p.add_argument("--idle", type=float, metavar="SECONDS",
                   help="run natively, send nothing, and print the service's CPU and wake-ups "
                        "a second over SECONDS once start-up's work is done")
    args = p.parse_args()
    if args.lean and args.endpoint != "login":
        sys.exit("service_cost: the lean limit serves the login only")

    tmp = tempfile.mkdtemp(prefix="tollgate-cost-")
    procs, db = [], None
    try:
        bench.ensure_free(REDIS_PORT, "redis")
        redis = subprocess.Popen(["redis-server", "--port", str(REDIS_PORT), "--bind", "127.0.0.1",
                                  "--save", "", "--appendonly", "no", "--dir", tmp],
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        procs.append(redis)
        bench.wait_port(REDIS_PORT, "redis", proc=redis)
        out = args.keep or os.path.join(tmp, "callgrind.out")
        grind = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}"]
        if args.idle:
            grind = []
        else:
            if args.cache_sim:
                grind.append("--cache-sim=yes")
            if args.threads:
                grind.append("--separate-threads=yes")
        if args.lean:
            cmd = grind + [args.binary, f"127.0.0.1:{PORT}", f"redis://127.0.0.1:{REDIS_PORT}"]
            env = {}
        else:
            db = f"tollgate_cost_{os.getpid()}"
            bench.psql("postgres", f"CREATE DATABASE {db}")
            config = os.path.join(tmp, "tollgate.toml")
            with open(config, "w") as f:
                f.write(f"""
[server]
bind = "127.0.0.1:{PORT}"
api_keys = ["{bench.API_KEY}"]

[store]
backend = "redis"
redis_url = "redis://127.0.0.1:{REDIS_PORT}"

[audit]
database_url = "postgres://postgres@127.0.0.1:5432/{db}"
spool_dir = "{tmp}/spool"

[sms]
code_secret = "bench-code-secret-0123456789abcdef"
{bench.SMS_SETTINGS['default']}""")
            cmd = grind + [args.binary, "serve", "--config", config]
            env = {"RUST_LOG": "info,tollgate::sms=error"}
        started = time.time()
        service = subprocess.Popen(cmd, stdout=open(os.path.join(tmp, "service.log"), "w"),
                                   stderr=subprocess.STDOUT, env={**os.environ, **env})
        procs.append(service)
        bench.wait_port(PORT, "the service", timeout=120, proc=service)
        wait_idle(service.pid)
        if args.idle:
            time.sleep(2)  # the first probes and the journal's first pass
            idle_cost(service.pid, args.idle)
            return

        path = "/sms/send" if args.endpoint == "sms" else "/login/attempt"
        users = 50 if args.endpoint == "hammered" else 1_000_000
        headers = {"Content-Type": "application/json", "Authorization": f"Bearer {bench.API_KEY}"}
        conn = http.client.HTTPConnection("127.0.0.1", PORT, timeout=60)
        rng = random.Random(7)
        statuses = {}

        def send(n):
            for _ in range(n):
                conn.request("POST", path, body(args.endpoint, rng.randrange(users)), headers)
                r = conn.getresponse()
                r.read()
                statuses[r.status] = statuses.get(r.status, 0) + 1

        send(args.warmup)
        wait_idle(service.pid, quiet_s=1.0)
        subprocess.run(["callgrind_control", "--zero", str(service.pid)], check=True,
                       capture_output=True)
        statuses.clear()
        send(args.requests)
        # The audit writer (hammered login) works behind the answers.
        wait_idle(service.pid, quiet_s=1.0)
        subprocess.run(["callgrind_control", "--dump", str(service.pid)], check=True,
                       capture_output=True)
        # This run's dumps only: a --keep path used before may hold older ones.
        dumps = sorted((d for d in glob.glob(out + ".*") if os.path.getmtime(d) >= started),
                       key=os.path.getmtime)
        if not dumps:
            sys.exit("service_cost: callgrind wrote no dump")
        # With --threads the dump is one file a thread: OUT.<n>-<thread>.
        last = re.sub(r"-\d+$", "", dumps[-1]) if args.threads else dumps[-1]
        files = sorted(d for d in dumps if re.fullmatch(re.escape(last) + r"-\d+", d)) \
            if args.threads else [last]
        per_thread = []
        for fname in files:
            with open(fname) as f:
                dump = f.read()
            m = re.search(r"^(?:totals|summary): (.*)$", dump, re.M)
            if not m:
                sys.exit(f"service_cost: no totals in {fname}")
            per_thread.append((fname, [int(x) for x in m.group(1).split()]))
        # A thread that ran nothing has one total (Ir): pad the others' events.
        counts = [sum(c) for c in itertools.zip_longest(*(c for _, c in per_thread), fillvalue=0)]
        # A send may meet its phone's window again (a repeat among a million
        # phones): a 429 is a decision too. Anything else is a failure.
        decided = {200, 429} if args.endpoint == "sms" else {200}
        if set(statuses) - decided:
            sys.exit(f"service_cost: not every request was decided: {statuses}")
        name = "lean limit" if args.lean else "tollgate"
        kept = f"; dump {last}" + ("-*" if args.threads else "") if args.keep else ""
        print(f"{name} {args.endpoint}: {counts[0] / args.requests:,.0f} instructions a request "
              f"({args.requests} requests, statuses {statuses}){kept}")
        if args.threads:
            for fname, c in per_thread:
                if c[0] >= counts[0] / 100:
                    print(f"  thread {fname.rsplit('-', 1)[-1]}: {c[0] / args.requests:,.0f} a request")
        if args.cache_sim:
            # events: Ir I1mr ILmr Dr D1mr DLmr Dw D1mw DLmw, in that order
            names = re.search(r"^events: (.*)$", dump, re.M).group(1).split()
            per = dict(zip(names, (c / args.requests for c in counts)))
            get = lambda *keys: sum(per.get(k, 0) for k in keys)
            print(f"  a request: {get('I1mr'):,.0f} instruction misses in L1, "
                  f"{get('D1mr', 'D1mw'):,.0f} data misses in L1, "
                  f"{get('ILmr', 'DLmr', 'DLmw'):,.0f} last-level misses (simulated caches)")
    finally:
        for proc in reversed(procs):
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(timeout=60)
                except subprocess.TimeoutExpired:
                    proc.kill()
        if db:
            bench.psql("postgres", f"DROP DATABASE IF EXISTS {db} WITH (FORCE)")
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
