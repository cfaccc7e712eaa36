-- otp_check.lua: check a one-time code. A match deletes it (single use); a miss
-- uses up one attempt; the last attempt burns it, and the burnt code is kept
-- until its expiry so that further tries answer "burnt".
--
-- KEYS[1]  the subject's code HASH: mac, left (attempts left), exp (expiry, ms)
-- ARGV[1]  mac of the code offered
--
-- Returns an array of two integers: { outcome, value }
--   0 = valid (value = attempts left before this try), 1 = wrong (value = attempts left, 0 = now burnt),
--   2 = burnt (value = ms until the code expires), 3 = missing (value 0).
--
-- The MACs are compared in time independent of where they differ.
--
-- Example:
--   EVALSHA <sha> 1 "tg:{phone:+33612345678}:otp" "9f86d08..."
--   -> { 1, 4 }

local key = KEYS[1]
local offered = ARGV[1]

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)

local h = redis.call('HMGET', key, 'mac', 'left', 'exp')
local mac, left, exp = h[1], tonumber(h[2]), tonumber(h[3])
if not mac or not left or not exp then return { 3, 0 } end
if left <= 0 then return { 2, math.max(exp - now, 0) } end

local diff = 0
if #mac ~= #offered then diff = 1 end
for i = 1, #mac do
  local a = string.byte(mac, i)
  local b = string.byte(offered, i) or 0
  diff = bit.bor(diff, bit.bxor(a, b))
end

if diff == 0 then
  redis.call('DEL', key)
  return { 0, left }
end
left = left - 1
redis.call('HSET', key, 'left', left)
return { 1, left }
