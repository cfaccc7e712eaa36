-- otp_put.lua: store a one-time code's MAC, replacing any previous code.
--
-- KEYS[1]  the subject's code HASH: mac, left (the asker's attempts left), lo
--          (everyone else's), n (the asker's address), exp (expiry, ms), ne
--          (exp again: n and lo are this code's), and u:
--          1 when its send was not counted by the pumping guard, 0 when it was
--          (reserve.lua writes 0 too); otp_check.lua says how they are used;
--          then kept: the live codes this one replaced, which otp_drop.lua
--          puts back should this one's delivery fail (otp_keep.lua).
-- ARGV[1]  mac of the code
-- ARGV[2]  attempts allowed
-- ARGV[3]  ttl in ms
-- ARGV[4]  1 when the send was counted (the guard counts its verify), 0 when
--          it was exempt (an allow-listed phone or address); a code stored
--          by reserve.lua, or by a build before this field, is counted
-- ARGV[5]  the address that asked for the code, as its IP subject's id; ''
--          for none
-- ARGV[6]  deadline: the caller stops waiting after this TIME in ms (0 or
--          absent: none); a call that runs later answers 3 and changes
--          nothing (src/store/redis/deadline.rs): its caller, given up,
--          may have kept the code in its local fallback, and a second copy
--          here would verify a second time
--
-- Returns 1, or 3 when late. The key expires after ttl (a kept code is put
-- back only before its own exp).
--
-- Commands per call: TIME, and only it when late; EXISTS; HMGET and DEL
-- when a hash is there; HSET and PEXPIRE unless ttl <= 0.
--
-- Example:
--   EVALSHA <sha> 1 "tg:{phone:+33612345678}:otp" "9f86d08..." 5 300000 1 "203.0.113.7" 0
--   -> 1

local key = KEYS[1]
local ttl = tonumber(ARGV[3])

--@KEEP@

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local deadline = tonumber(ARGV[6]) or 0
if deadline > 0 and now > deadline then return 3 end

local h = {}
if redis.call('EXISTS', key) == 1 then
  h = redis.call('HMGET', key, 'mac', 'left', 'lo', 'n', 'exp', 'ne', 'u', 'kept')
  redis.call('DEL', key)
end
if ttl <= 0 then return 1 end
local uncounted = 0
if ARGV[4] == '0' then uncounted = 1 end
local attempts, exp = tonumber(ARGV[2]), string.format('%d', now + ttl)
local fields = { 'mac', ARGV[1], 'left', attempts, 'lo', attempts, 'n', ARGV[5] or '',
  'exp', exp, 'ne', exp, 'u', uncounted }
local kept = kept_after(h, now)
if kept ~= '' then
  fields[#fields + 1] = 'kept'
  fields[#fields + 1] = kept
end
redis.call('HSET', key, unpack(fields))
redis.call('PEXPIRE', key, ttl)
return 1
