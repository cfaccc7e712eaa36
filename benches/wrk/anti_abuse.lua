-- The request mix of ../shared/bench/wrk/anti_abuse.lua (loaded from the path in
-- MIX, unchanged), with a done() that also prints p99.9, which the load benchmark
-- (scripts/bench.py) reads, and the CPU its set-up took.
dofile(os.getenv("MIX"))

-- Building a million request strings costs wrk a second or two of CPU before
-- the first request; say how much, so that it is not counted per request.
local build_requests = init
function init(args)
  build_requests(args)
  io.write(string.format("WRKINIT cpu_s=%.3f\n", os.clock()))
end

function done(summary, latency, requests)
  local secs = summary.duration / 1e6
  local e = summary.errors
  io.write(string.format(
    "WRKRESULT rps=%.1f p50_us=%d p90_us=%d p99_us=%d p999_us=%d max_us=%d requests=%d non2xx=%d sock_err=%d timeouts=%d\n",
    summary.requests / secs, latency:percentile(50), latency:percentile(90), latency:percentile(99),
    latency:percentile(99.9), latency.max, summary.requests, e.status,
    e.connect + e.read + e.write, e.timeout))
end
