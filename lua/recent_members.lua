-- recent_members.lua: the members of a window ZSET scored within the last
-- window_ms, newest first, at most max of them; reads only.
--
-- KEYS[1]  a window ZSET (score = event time in ms)
-- ARGV[1]  window_ms        ARGV[2]  max
--
-- Example:
--   EVALSHA <sha> 1 "tg:{user:alice}:login_attempt" 3600000 100
--   -> { "203.0.113.66|5f0c...", "203.0.113.66|91ab..." }

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
return redis.call('ZREVRANGEBYSCORE', KEYS[1], '+inf',
  string.format('(%d', now - tonumber(ARGV[1])), 'LIMIT', 0, tonumber(ARGV[2]))
