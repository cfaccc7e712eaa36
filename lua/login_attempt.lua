-- login_attempt.lua: record one login outcome, atomically with the lock check and
-- the lock decision, so concurrent failures record exactly lock_after of them and
-- lock exactly once.
--
-- KEYS[1]  the user's failure ZSET (score = failure time in ms, member = attempt id)
-- KEYS[2]  the user's lock HASH: until (lock end, ms), level (escalation level)
-- ARGV[1]  member: unique id of this attempt
-- ARGV[2]  success (1/0)        ARGV[3]  captcha_passed (1/0)
-- ARGV[4]  captcha_demanded (1/0)  ARGV[5]  shadow (1/0)
-- ARGV[6]  captcha_after        ARGV[7]  captcha_window_ms
-- ARGV[8]  lock_after           ARGV[9]  lock_window_ms
-- ARGV[10] lock_ms              ARGV[11] lock_max_ms
-- ARGV[12] reset_on_success (1/0)  ARGV[13] escalation_reset_ms
--
-- Returns an array of integers:
--   { verdict, retry_after_ms, failures, captcha_crossed, locked_for_ms }
--   verdict 0 = recorded, 1 = locked (retry_after_ms = remaining lock),
--   2 = challenged; failures = captcha-window failures after this call;
--   captcha_crossed 1 when this call's failure made them reach captcha_after;
--   locked_for_ms = the lock this call started, -1 when none.
--
-- A lock lasts lock_ms * 2^level, capped at lock_max_ms; level is the previous
-- level + 1 when the lock starts within escalation_reset_ms of the previous
-- lock's end, else 0. The lock key expires escalation_reset_ms after the lock
-- ends. A shadow call records as if allowed; while a lock is live it never
-- starts a new one.
--
-- Example:
--   EVALSHA <sha> 2 "tg:{user:alice}:login_attempt" "tg:{user:alice}:lock" \
--     "0190...-uuid" 0 0 0 0  3 900000  10 900000  60000 3600000  1 86400000
--   -> { 0, 0, 1, 0, -1 }

local wkey, lkey = KEYS[1], KEYS[2]
local member = ARGV[1]
local success = ARGV[2] == '1'
local captcha_passed = ARGV[3] == '1'
local captcha_demanded = ARGV[4] == '1'
local shadow = ARGV[5] == '1'
local captcha_after = tonumber(ARGV[6])
local captcha_window = tonumber(ARGV[7])
local lock_after = tonumber(ARGV[8])
local lock_window = tonumber(ARGV[9])
local lock_ms = tonumber(ARGV[10])
local lock_max_ms = tonumber(ARGV[11])
local reset_on_success = ARGV[12] == '1'
local escalation_reset = tonumber(ARGV[13])

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)

local longest = math.max(captcha_window, lock_window)
local keep = math.max(captcha_after, lock_after)

local function count(length)
  return redis.call('ZCOUNT', wkey, string.format('(%d', now - length), '+inf')
end

redis.call('ZREMRANGEBYSCORE', wkey, '-inf', now - longest)

local lock = redis.call('HMGET', lkey, 'until', 'level')
local prev_until = tonumber(lock[1])
local prev_level = tonumber(lock[2]) or 0

local failures = count(captcha_window)
local verdict, retry, may_lock = 0, 0, true
if prev_until and prev_until > now then
  verdict, retry, may_lock = 1, prev_until - now, false
elseif (failures >= captcha_after or captcha_demanded) and not captcha_passed then
  verdict = 2
end

local crossed, locked_for = 0, -1
if verdict == 0 or shadow then
  if success then
    if reset_on_success then redis.call('DEL', wkey) end
  else
    redis.call('ZADD', wkey, now, member)
    redis.call('ZREMRANGEBYRANK', wkey, 0, -(keep + 1))
    redis.call('PEXPIRE', wkey, longest)
    if may_lock and count(lock_window) >= lock_after then
      local level = 0
      if prev_until and now - prev_until <= escalation_reset then
        level = math.min(prev_level + 1, 40)
      end
      local duration = math.min(lock_ms * 2 ^ level, lock_max_ms)
      redis.call('HSET', lkey, 'until', now + duration, 'level', level)
      redis.call('PEXPIRE', lkey, duration + escalation_reset)
      locked_for = duration
    end
  end
  local after = count(captcha_window)
  if failures < captcha_after and after >= captcha_after then crossed = 1 end
  failures = after
end

return { verdict, retry, failures, crossed, locked_for }
