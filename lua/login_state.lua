-- login_state.lua: a user's lock and failure counts, recording nothing.
--
-- KEYS[1]  the user's failure ZSET (score = failure time in ms)
-- KEYS[2]  the user's lock HASH (until = lock end in ms; s_until = the shadow's)
-- KEYS[3]  optional: a (user, IP) pair's lock HASH
-- ARGV[1]  captcha_window_ms
-- ARGV[2]  lock_window_ms
-- ARGV[3]  shadow (1/0): with 1, a lock shadow calls started (s_until) holds
--          too
--
-- Returns an array of integers:
--   { locked_retry_after_ms, failures, lock_window_failures,
--     pair_locked_retry_after_ms }
--   a retry is -1 when that lock does not hold (or, for the pair, is not asked).
--
-- Example:
--   EVALSHA <sha> 2 "tg:{user:alice}:login_attempt" "tg:{user:alice}:lock" 900000 900000 0
--   -> { 41000, 10, 10, -1 }

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)

local function count(length)
  return redis.call('ZCOUNT', KEYS[1], string.format('(%d', now - tonumber(length)), '+inf')
end

local shadow = ARGV[3] == '1'

local function remaining(key)
  local l = redis.call('HMGET', key, 'until', 's_until')
  local lock_until = tonumber(l[1])
  if lock_until and lock_until > now then return lock_until - now end
  local would_be = shadow and tonumber(l[2])
  if would_be and would_be > now then return would_be - now end
  return -1
end

local pair_retry = -1
if KEYS[3] then pair_retry = remaining(KEYS[3]) end

return { remaining(KEYS[2]), count(ARGV[1]), count(ARGV[2]), pair_retry }
