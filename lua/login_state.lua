-- login_state.lua: a user's lock and failure counts, recording nothing.
--
-- KEYS[1]  the user's failure ZSET (score = failure time in ms)
-- KEYS[2]  the user's lock HASH (field until = lock end in ms)
-- ARGV[1]  captcha_window_ms
-- ARGV[2]  lock_window_ms
--
-- Returns an array of integers:
--   { locked_retry_after_ms, failures, lock_window_failures }
--   locked_retry_after_ms is -1 when the user is not locked.
--
-- Example:
--   EVALSHA <sha> 2 "tg:{user:alice}:login_attempt" "tg:{user:alice}:lock" 900000 900000
--   -> { 41000, 10, 10 }

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)

local function count(length)
  return redis.call('ZCOUNT', KEYS[1], string.format('(%d', now - tonumber(length)), '+inf')
end

local retry = -1
local lock_until = tonumber(redis.call('HGET', KEYS[2], 'until'))
if lock_until and lock_until > now then retry = lock_until - now end

return { retry, count(ARGV[1]), count(ARGV[2]) }
