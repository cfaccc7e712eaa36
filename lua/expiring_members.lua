-- expiring_members.lua: the live members of an expiring set (see
-- expiring_add.lua), latest-ending first, recording nothing.
--
-- KEYS[1]  the set
-- ARGV[1]  limit: most members to return
--
-- Returns an array of strings: { total, member_1, remaining_ms_1, ... }, total
-- being how many members are live in all. Among equal times the member that
-- sorts last comes first (ZREVRANGEBYSCORE's order).
--
-- Commands per call: TIME, ZREVRANGEBYSCORE, ZCOUNT.
--
-- Example:
--   EVALSHA <sha> 1 "tg:conversion_blocks" 20
--   -> { "2", "country:CN", "43190000", "prefix:+3361234", "1200000" }

local key = KEYS[1]
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local after = string.format('(%d', now)

local live = redis.call('ZREVRANGEBYSCORE', key, '+inf', after, 'WITHSCORES',
  'LIMIT', 0, tonumber(ARGV[1]))
local out = { tostring(redis.call('ZCOUNT', key, after, '+inf')) }
for j = 1, #live, 2 do
  out[#out + 1] = live[j]
  out[#out + 1] = string.format('%d', tonumber(live[j + 1]) - now)
end
return out
