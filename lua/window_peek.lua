-- window_peek.lua: count a subject's windows without recording anything.
--
-- KEYS[1]  the subject's window ZSET (score = event time in ms)
-- KEYS[2]  optional: its meter HASH (see reserve.lua), when a window is a
--          meter; absent, its meters are members of KEYS[1]
--          ("m:<limit>/<length>" scored -1 - level, and with ":t" -1 - when
--          it was set: src/store/redis/layout.rs)
-- ARGV[1]  n: number of windows, then n triples:
-- ARGV[3i-1], ARGV[3i], ARGV[3i+1]  limit, window length in ms, meter (1) or log (0)
--
-- Returns an array of integers:
--   { count_1, ..., count_n, retry_after_ms_1, ..., retry_after_ms_n }
--   retry_after_ms_i is how long until window i holds fewer than its limit
--   (0 when it already does). A meter's count is ceil(level / length).
--
-- Time is the server's TIME in ms; an event at t counts while now - w < t.
--
-- Commands per call: TIME, one ZCOUNT per log window (and a ZRANGEBYSCORE
-- per full one), two HGET (or ZSCORE) per meter window.
--
-- Example:
--   EVALSHA <sha> 1 "tg:{ip:192.0.2.7}:sms_send" 2  20 3600000 0  100 86400000 0
--   -> { 3, 3, 0, 0 }

local key = KEYS[1]
local n = tonumber(ARGV[1])

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)

local out = {}
for i = 1, n do
  local limit = tonumber(ARGV[3 * i - 1])
  local length = tonumber(ARGV[3 * i])
  local count, retry = 0, 0
  if ARGV[3 * i + 1] == '1' then
    local field = ARGV[3 * i - 1] .. '/' .. ARGV[3 * i]
    local level, at
    if KEYS[2] then
      level = tonumber(redis.call('HGET', KEYS[2], field))
      at = tonumber(redis.call('HGET', KEYS[2], field .. ':t'))
    else
      level = tonumber(redis.call('ZSCORE', key, 'm:' .. field))
      at = tonumber(redis.call('ZSCORE', key, 'm:' .. field .. ':t'))
      level = level and -1 - level
      at = at and -1 - at
    end
    if level and at and now - at < length then
      level = math.max(level - math.max(now - at, 0) * limit, 0)
    else
      level = 0
    end
    count = math.ceil(level / length)
    local over = level + length - limit * length
    if over > 0 then
      if limit == 0 then retry = length else retry = math.ceil(over / limit) end
    end
  else
    local floor = string.format('(%d', now - length)
    count = redis.call('ZCOUNT', key, floor, '+inf')
    if count >= limit then
      if limit == 0 then
        retry = length
      else
        local m = redis.call('ZRANGEBYSCORE', key, floor, '+inf',
          'WITHSCORES', 'LIMIT', count - limit, 1)
        if m[2] == nil then retry = length else retry = tonumber(m[2]) + length - now end
      end
    end
  end
  out[i] = count
  out[n + i] = retry
end
return out
