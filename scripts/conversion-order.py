#!/usr/bin/env python3
"""The order of the fields in the pumping guard's conversion hashes on a
running service, which the load benchmark's history (bench.py,
conversion_history) copies.

A small hash is a listpack: its fields stay in the order they were made, a
field written again keeps its place, and a read scans from the first field.
So what a send costs Redis depends on where the fields it asks for lie.
This runs tollgate with the benchmark's configuration (a private Redis,
PostgreSQL for the audit trail), the pumping window shrunk to 12 s (slices
of 1 s) and the country's history to 2016 s (buckets of 288 s, 24 windows,
as a day is to the default hour), sends codes for `--seconds` so that
slices come and go, and prints each conversion hash's fields in their
order (HGETALL answers in listpack order). It verifies no code, so an
"s:" field shows only where a busy hash was written again at the first
send of a slice (lua/reserve.lua: the sums and that slice's counts first,
made 0 when absent; a quiet hash makes a slice's "s:" at its first verify,
after its "e:"), and a bucket's "n:" field shows only when a bucket ends
during the run (its first slice gone stale adds it).

    scripts/conversion-order.py --tollgate target/dist/tollgate [--seconds 30]

Standard library only; prints what it finds, asserts nothing.
"""

import argparse
import http.client
import os
import sys
import time
import types

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench  # noqa: E402  (the benchmark's configuration and helpers)

PORT = 18092


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tollgate", required=True, help="a release binary")
    parser.add_argument("--seconds", type=float, default=30.0)
    args = parser.parse_args()
    # A bucket of the country's history 24 windows long, as the defaults'
    # day is to their hour.
    bench.SMS_SETTINGS["default"] += 'window = "12s"\ncountry_history = "2016s"\n'
    b = bench.Bench(types.SimpleNamespace(tollgate=args.tollgate))
    try:
        b.start_redis()
        b.start_tollgate(PORT, binary=args.tollgate)
        conn = http.client.HTTPConnection("127.0.0.1", PORT, timeout=10)
        start, i = time.monotonic(), 0
        while time.monotonic() - start < args.seconds:
            bench.post_one(conn, "sms", i)
            i += 1
            time.sleep(0.05)
        conn.close()
        print(f"{i} sends over {args.seconds:.0f} s")
        for key in bench.redis_cli("--scan", "--pattern", "*:conversion").split("\n"):
            if key:
                flat = bench.redis_cli("HGETALL", key).split("\n")
                print(key, bench.redis_cli("OBJECT", "ENCODING", key), " ".join(flat[0::2]))
    finally:
        b.stop()


if __name__ == "__main__":
    main()
