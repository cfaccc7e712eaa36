-- otp_drop.lua: the roll-back of a send whose delivery failed. While the
-- code is still the one sealed as ARGV[1], it goes, and the live code it
-- replaced (kept beside it by otp_put.lua or reserve.lua) comes back with
-- the tries it had left, so that a failed resend leaves the phone's earlier
-- code as it was. A send that raced it and wrote its own code since keeps
-- that code, which its SMS carries; if that send had kept the failed code
-- as the one it replaced, it forgets it, so that the failed code, which
-- no SMS carries, never comes back.
--
-- KEYS[1]  the subject's code HASH (otp_put.lua)
-- ARGV[1]  mac of the failed send's code
--
-- Returns 2 when the code was deleted and the earlier one put back, 1 when
-- it was deleted, 0 when another (or none) is there.
-- Commands per call: TIME, HMGET; when it matches DEL, and HSET and
-- PEXPIREAT when an earlier code comes back; when it was kept as the
-- earlier code, HSET.
--
-- Example:
--   EVALSHA <sha> 1 "tg:{phone:+33612345678}:otp" "9f86d08..."
--   -> 1

local key = KEYS[1]
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)

local h = redis.call('HMGET', key, 'mac', 'pm', 'pl', 'plo', 'pn', 'pe', 'pu')
if h[1] == ARGV[1] then
  redis.call('DEL', key)
  local exp = tonumber(h[6])
  if h[2] and h[2] ~= '' and h[3] and h[4] and exp and exp >= now then
    redis.call('HSET', key, 'mac', h[2], 'left', h[3], 'lo', h[4], 'n', h[5] or '',
      'exp', h[6], 'ne', h[6], 'u', h[7] or '0')
    redis.call('PEXPIREAT', key, h[6])
    return 2
  end
  return 1
end
if h[2] == ARGV[1] then
  redis.call('HSET', key, 'pm', '')
end
return 0
