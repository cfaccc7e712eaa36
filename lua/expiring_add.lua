-- expiring_add.lua: put a member in an expiring set (a ZSET scored by the
-- time each member expires, in ms) until ttl from now, and drop the members
-- whose time has passed.
--
-- KEYS[1]  the set
-- ARGV[1]  member
-- ARGV[2]  ttl in ms
--
-- The key expires with its last member. Returns 1. Commands per call: TIME,
-- ZREMRANGEBYSCORE, ZADD, ZREVRANGE, PEXPIRE.
--
-- Example (a number prefix blocked for 12 hours):
--   EVALSHA <sha> 1 "tg:conversion_blocks" "prefix:+3361234" 43200000
--   -> 1

local key = KEYS[1]
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)

redis.call('ZREMRANGEBYSCORE', key, '-inf', string.format('%d', now))
redis.call('ZADD', key, string.format('%d', now + tonumber(ARGV[2])), ARGV[1])
local last = redis.call('ZREVRANGE', key, 0, 0, 'WITHSCORES')
redis.call('PEXPIRE', key, string.format('%d', math.max(tonumber(last[2]) - now, 1)))
return 1
