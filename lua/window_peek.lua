-- window_peek.lua: count a subject's sliding windows without recording anything.
--
-- KEYS[1]  the subject's window ZSET (score = event time in ms)
-- ARGV[1]  n: number of windows, then n pairs:
-- ARGV[2+2i], ARGV[3+2i]  limit, window length in ms
--
-- Returns an array of integers:
--   { count_1, ..., count_n, retry_after_ms_1, ..., retry_after_ms_n }
--   retry_after_ms_i is how long until window i holds fewer than its limit
--   (0 when it already does).
--
-- Time is the server's TIME in ms; an event at t counts while now - w < t.
--
-- Example:
--   EVALSHA <sha> 1 "tg:{ip:192.0.2.7}:sms_send" 2  20 3600000  100 86400000
--   -> { 3, 3, 0, 0 }

local key = KEYS[1]
local n = tonumber(ARGV[1])

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)

local out = {}
for i = 1, n do
  local limit = tonumber(ARGV[2 * i])
  local length = tonumber(ARGV[2 * i + 1])
  local floor = string.format('(%d', now - length)
  local count = redis.call('ZCOUNT', key, floor, '+inf')
  local retry = 0
  if count >= limit then
    if limit == 0 then
      retry = length
    else
      local m = redis.call('ZRANGEBYSCORE', key, floor, '+inf',
        'WITHSCORES', 'LIMIT', count - limit, 1)
      if m[2] == nil then retry = length else retry = tonumber(m[2]) + length - now end
    end
  end
  out[i] = count
  out[n + i] = retry
end
return out
