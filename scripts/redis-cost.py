#!/usr/bin/env python3
"""Redis's instructions per request, counted by callgrind: repeatable on a busy
machine, where Redis's CPU time per request in the load benchmark moves by a
fifth between runs of one build.

Starts a private redis-server under `valgrind --tool=callgrind`, tollgate with
the load benchmark's configuration (scripts/bench.py) pointed at it, sends
warm-up requests of the benchmark's mix (SMS sends to distinct phones, each
from its own address, the pumping guard's hashes given a day of history
first, as the benchmark does; or login failures), zeroes the counters, sends the
measured requests, dumps, and prints Redis's instructions per request and
its commands per request by name (`INFO commandstats`, which counts each
`redis.call` of a script; the script call itself left out). With
several binaries, each is measured against its own Redis, one after the
other (instructions do not depend on the machine's load).

    scripts/redis-cost.py --tollgate target/dist/tollgate [--tollgate other/tollgate]
        [--redis-server /path/with/symbols/redis-server] [--requests 1000] [--ipv6] [--annotate]

`--annotate` prints callgrind_annotate's inclusive view of the last run's
functions: give a redis-server built with symbols (Debian's package is
stripped: `apt-get source redis`, then `make USE_SYSTEM_JEMALLOC=yes
CFLAGS=-g`; see docs/benchmarks.md). Standard library only; prints figures,
asserts nothing.
"""

import argparse
import http.client
import os
import random
import subprocess
import sys
import tempfile
import time
import types

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench  # noqa: E402  (the benchmark's configuration and helpers)

PORT = 18090


def in_scripts(dumped):
    """Instructions inside script calls (EVAL and EVALSHA), 0 without
    symbols: the whole process also counts serverCron, whose active expiry
    work follows the wall clock, which callgrind stretches unevenly."""
    out = subprocess.run(["callgrind_annotate", "--inclusive=yes", "--threshold=100", dumped],
                         capture_output=True, text=True).stdout
    for line in out.splitlines():
        if "evalGenericCommand" in line:
            return int(line.split()[0].replace(",", ""))
    return 0


def measure(args, binary, out_dir):
    """Redis's instructions per request with `binary`, and the callgrind file."""
    out_file = os.path.join(out_dir, f"callgrind.{os.getpid()}.{time.monotonic_ns()}")
    redis = subprocess.Popen(
        ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out_file}",
         args.redis_server, "--port", str(bench.REDIS_PORT), "--bind", "127.0.0.1",
         "--save", "", "--appendonly", "no", "--dir", out_dir],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    b = bench.Bench(types.SimpleNamespace(tollgate=binary))
    b.procs.append(redis)
    try:
        bench.wait_port(bench.REDIS_PORT, "redis under callgrind", timeout=60, proc=redis)
        # Redis under callgrind is some 50 times slower: a call must not time out.
        os.environ["TOLLGATE__STORE__TIMEOUT"] = "10s"
        b.start_tollgate(PORT, binary=binary)
        if args.endpoint == "sms" and not args.empty_history:
            bench.conversion_history(PORT)
        conn = http.client.HTTPConnection("127.0.0.1", PORT, timeout=60)
        ids = random.Random(7).sample(range(1_000_000), args.warmup + args.requests)
        statuses = {}
        for n, i in enumerate(ids):
            if n == args.warmup:
                subprocess.run(["callgrind_control", "--zero", str(redis.pid)],
                               check=True, capture_output=True)
                bench.redis_cli("CONFIG", "RESETSTAT")
            status = bench.post_one(conn, args.endpoint, i, ipv6=args.ipv6)
            if n >= args.warmup:
                statuses[status] = statuses.get(status, 0) + 1
        conn.close()
        subprocess.run(["callgrind_control", "--dump", str(redis.pid)],
                       check=True, capture_output=True)
        commands = commands_per_request(args.requests)
        # The first dump (zeroing writes none) is part 1.
        dumped = f"{out_file}.1"
        with open(dumped) as f:
            total = next(int(line.split()[1]) for line in f if line.startswith("summary:"))
        return (total / args.requests, in_scripts(dumped) / args.requests, statuses, dumped,
                commands)
    finally:
        b.stop()


def commands_per_request(requests):
    """Redis's commands per request since the last `CONFIG RESETSTAT`, a
    script's own `redis.call`s counted one by one (`INFO commandstats`),
    the script call itself and this count's `INFO` left out."""
    counts = {}
    for line in bench.redis_cli("INFO", "commandstats").splitlines():
        if line.startswith("cmdstat_"):
            name, fields = line[len("cmdstat_"):].split(":", 1)
            calls = int(fields.split(",")[0].split("=")[1])
            if name not in ("evalsha", "eval", "info", "config|resetstat"):
                counts[name.upper()] = calls / requests
    return counts


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tollgate", action="append", required=True,
                        help="a release binary; repeat to compare builds")
    parser.add_argument("--redis-server", default="redis-server")
    parser.add_argument("--endpoint", choices=("sms", "login"), default="sms")
    parser.add_argument("--warmup", type=int, default=200)
    parser.add_argument("--requests", type=int, default=1000)
    parser.add_argument("--empty-history", action="store_true",
                        help="SMS: start from empty conversion hashes, as before 2026-11-28 "
                             "(by default they hold a day of history, as in scripts/bench.py)")
    parser.add_argument("--ipv6", action="store_true",
                        help="requests from IPv6 addresses, each in a /48 of its own (the "
                             "network's windows counted too); IPv4 by default, as the benchmark")
    parser.add_argument("--annotate", action="store_true",
                        help="print the last run's functions, inclusive")
    args = parser.parse_args()
    out_dir = tempfile.mkdtemp(prefix="tollgate-redis-cost-")
    dumped = None
    for binary in args.tollgate:
        per, scripts, statuses, dumped, commands = measure(args, binary, out_dir)
        inside = f", {scripts:,.0f} in the script call" if scripts else ""
        print(f"{binary}: Redis {per:,.0f} instructions per {args.endpoint} request{inside} "
              f"({args.requests} after {args.warmup} of warm-up; answers {statuses})")
        listed = ", ".join(f"{name} {n:.2f}" for name, n in sorted(commands.items()))
        print(f"  commands a request: {sum(commands.values()):.2f} ({listed})")
        sys.stdout.flush()
    if args.annotate and dumped:
        out = subprocess.run(["callgrind_annotate", "--inclusive=yes", dumped],
                             capture_output=True, text=True).stdout
        print("\n".join(out.splitlines()[:70]))
    print(f"callgrind files: {out_dir}")


if __name__ == "__main__":
    main()
