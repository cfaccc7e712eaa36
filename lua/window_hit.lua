-- window_hit.lua: offer one event to one subject's sliding windows, atomically.
--
-- KEYS[1]  the subject's window ZSET (score = event time in ms, member = event id)
-- ARGV[1]  member: unique id of this event
-- ARGV[2]  gate_open: 1 when the request passed a captcha, else 0
-- ARGV[3]  force: 1 to record the event even when a window refuses it (shadow mode)
-- ARGV[4]  n: number of windows, then n triples:
-- ARGV[5+3i], ARGV[6+3i], ARGV[7+3i]  limit, window length in ms, mode (0 = enforce, 1 = gate)
--
-- Returns an array of integers:
--   { verdict, window, retry_after_ms, added, next_retry_after_ms, count_1, ..., count_n }
--   verdict 0 = allowed, 1 = denied (window = refusing window with the longest
--   wait, 0-based; retry_after_ms = that wait), 2 = gated (window = first full
--   gate window); counts are before this event; next_retry_after_ms is how long
--   until every enforce window admits one more event, after this call.
--
-- Time is the server's TIME in ms. An event at t counts in a window of length w
-- while now - w < t. At most max(limit) newest members are kept; the key expires
-- after the longest window.
--
-- Example:
--   EVALSHA <sha> 1 "tg:{phone:+33612345678}:sms_send" "01J...-uuid" 0 0 \
--     3  1 60000 0  5 3600000 0  10 86400000 0
--   -> { 0, 0, 0, 1, 60000, 0, 0, 0 }

local key = KEYS[1]
local member = ARGV[1]
local gate_open = ARGV[2] == '1'
local force = ARGV[3] == '1'
local n = tonumber(ARGV[4])

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)

local limits, lengths, modes = {}, {}, {}
local longest, max_limit = 0, 0
for i = 1, n do
  local base = 4 + (i - 1) * 3
  limits[i] = tonumber(ARGV[base + 1])
  lengths[i] = tonumber(ARGV[base + 2])
  modes[i] = tonumber(ARGV[base + 3])
  if lengths[i] > longest then longest = lengths[i] end
  if limits[i] > max_limit then max_limit = limits[i] end
end

-- How long until window i holds fewer than limit members, given it holds count.
local function wait(i, count)
  local limit, length = limits[i], lengths[i]
  if count < limit then return 0 end
  if limit == 0 then return length end
  local m = redis.call('ZRANGEBYSCORE', key, string.format('(%d', now - length), '+inf',
    'WITHSCORES', 'LIMIT', count - limit, 1)
  if m[2] == nil then return length end
  return tonumber(m[2]) + length - now
end

-- 1. drop members older than the longest window
redis.call('ZREMRANGEBYSCORE', key, '-inf', now - longest)

-- 2. count every window
local counts = {}
for i = 1, n do
  counts[i] = redis.call('ZCOUNT', key, string.format('(%d', now - lengths[i]), '+inf')
end

-- 3. the verdict
local verdict, window, retry = 0, 0, 0
for i = 1, n do
  if modes[i] == 0 and counts[i] >= limits[i] then
    local w = wait(i, counts[i])
    if verdict ~= 1 or w > retry then
      verdict, window, retry = 1, i - 1, w
    end
  end
end
if verdict == 0 and not gate_open then
  for i = 1, n do
    if modes[i] == 1 and counts[i] >= limits[i] then
      verdict, window = 2, i - 1
      break
    end
  end
end

-- 4. record
local added = 0
if verdict == 0 or force then
  redis.call('ZADD', key, now, member)
  added = 1
end

-- 5. bound memory and set the expiry
redis.call('ZREMRANGEBYRANK', key, 0, -(max_limit + 1))
if redis.call('EXISTS', key) == 1 then
  redis.call('PEXPIRE', key, longest)
end

-- 6. next retry from the counts after the add
local next_retry = 0
for i = 1, n do
  if modes[i] == 0 then
    local c = redis.call('ZCOUNT', key, string.format('(%d', now - lengths[i]), '+inf')
    local w = wait(i, c)
    if w > next_retry then next_retry = w end
  end
end

local out = { verdict, window, retry, added, next_retry }
for i = 1, n do out[5 + i] = counts[i] end
return out
