-- login_attempt.lua: record one login outcome, atomically with the lock check,
-- the lock decision and (when the IP's window is given) the IP's block, captcha
-- tier and failure record, so concurrent failures record exactly lock_after of
-- them per user and ip_block_after per IP, and lock exactly once.
--
-- KEYS[1]  the user's failure ZSET (score = failure time in ms, member = attempt id)
-- KEYS[2]  the user's lock HASH: until (lock end, ms), level (escalation level)
-- KEYS[3]  optional: the IP's failure ZSET on login_attempt (Redis Cluster
--          callers, whose IP lives in another slot, pass what they read of it in
--          ARGV[4] and ARGV[14] instead)
-- ARGV[1]  member: unique id of this attempt
-- ARGV[2]  success (1/0)        ARGV[3]  captcha_passed (1/0)
-- ARGV[4]  captcha_demanded (1/0): something outside the user demands a captcha
-- ARGV[5]  shadow (1/0)
-- ARGV[6]  captcha_after        ARGV[7]  captcha_window_ms
-- ARGV[8]  lock_after           ARGV[9]  lock_window_ms
-- ARGV[10] lock_ms              ARGV[11] lock_max_ms
-- ARGV[12] reset_on_success (1/0)  ARGV[13] escalation_reset_ms
-- ARGV[14] ip_blocked (1/0): something outside the user refuses the attempt
-- with KEYS[3]: ARGV[15] ip_captcha_after  ARGV[16] ip_block_after  ARGV[17] ip_window_ms
--
-- Returns an array of integers:
--   { verdict, retry_after_ms, failures, captcha_crossed, locked_for_ms,
--     ip_count, ip_retry_after_ms }
--   verdict 0 = the user's rules admit it, 1 = locked (retry_after_ms =
--   remaining lock), 2 = challenged; the outcome is recorded when verdict is 0
--   and the IP is not blocked, or in shadow mode. failures = captcha-window
--   failures after this call; captcha_crossed 1 when this call's failure made
--   them reach captcha_after; locked_for_ms = the lock this call started, -1
--   when none. ip_count = the IP's failures in its window before this call and
--   ip_retry_after_ms = how long the IP stays blocked, both -1 without KEYS[3]
--   (and the retry -1 when it is not blocked).
--
-- A lock lasts lock_ms * 2^level, capped at lock_max_ms; level is the previous
-- level + 1 when the lock starts within escalation_reset_ms of the previous
-- lock's end, else 0. The lock key expires escalation_reset_ms after the lock
-- ends. A shadow call records as if allowed; while a lock is live it never
-- starts a new one. The user keeps at most max(captcha_after, lock_after)
-- newest failures, the IP max(ip_captcha_after, ip_block_after).
--
-- Commands per call: TIME, ZRANGE (the user's few failures), HMGET; with the
-- IP one ZCOUNT (and a ZREVRANGE when it is blocked). A recorded failure adds
-- ZADD and PEXPIRE per set (ZREMRANGEBYRANK for a full user set and always for
-- the IP), HSET and PEXPIRE when it locks; a recorded success one DEL.
--
-- Example (user and IP in one call):
--   EVALSHA <sha> 3 "tg:{user:alice}:login_attempt" "tg:{user:alice}:lock" \
--     "tg:{ip:192.0.2.7}:login_attempt" "0190...-uuid" 0 0 0 0 \
--     3 900000  10 3600000  900000 86400000  1 86400000  0  20 100 3600000
--   -> { 0, 0, 1, 0, -1, 0, -1 }

local wkey, lkey, ipkey = KEYS[1], KEYS[2], KEYS[3]
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
local ip_blocked = ARGV[14] == '1'

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
-- Numbers handed to redis.call are formatted each time: format `now` once.
local now_s = string.format('%d', now)

-- The IP: its count, block and captcha tier.
local ip_count, ip_retry = -1, -1
local ip_window, ip_keep
if ipkey then
  local ip_captcha_after, ip_block_after = tonumber(ARGV[15]), tonumber(ARGV[16])
  ip_window = tonumber(ARGV[17])
  ip_keep = math.max(ip_captcha_after, ip_block_after)
  ip_count = redis.call('ZCOUNT', ipkey, string.format('(%d', now - ip_window), '+inf')
  if ip_count >= ip_block_after then
    ip_blocked = true
    ip_retry = ip_window
    if ip_block_after > 0 then
      local m = redis.call('ZREVRANGE', ipkey, ip_block_after - 1, ip_block_after - 1, 'WITHSCORES')
      if m[2] then ip_retry = math.max(tonumber(m[2]) + ip_window - now, 0) end
    end
  end
  if ip_count >= ip_captcha_after then captcha_demanded = true end
end

-- The user: failures, oldest first (never more than keep of them).
local longest = math.max(captcha_window, lock_window)
local keep = math.max(captcha_after, lock_after)
local scores = {}
local raw = redis.call('ZRANGE', wkey, 0, -1, 'WITHSCORES')
for j = 2, #raw, 2 do scores[#scores + 1] = tonumber(raw[j]) end

local function count(length)
  local c = 0
  for j = #scores, 1, -1 do
    if scores[j] > now - length then c = c + 1 else break end
  end
  return c
end

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
if (verdict == 0 and not ip_blocked) or shadow then
  if success then
    if reset_on_success and #scores > 0 then
      redis.call('DEL', wkey)
      scores = {}
    end
  else
    redis.call('ZADD', wkey, now_s, member)
    scores[#scores + 1] = now
    if #scores > keep then
      redis.call('ZREMRANGEBYRANK', wkey, 0, -(keep + 1))
      while #scores > keep do table.remove(scores, 1) end
    end
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
    if ipkey then
      redis.call('ZADD', ipkey, now_s, member)
      redis.call('ZREMRANGEBYRANK', ipkey, 0, -(ip_keep + 1))
      redis.call('PEXPIRE', ipkey, ARGV[17])
    end
  end
  local after = count(captcha_window)
  if failures < captcha_after and after >= captcha_after then crossed = 1 end
  failures = after
end

return { verdict, retry, failures, crossed, locked_for, ip_count, ip_retry }
