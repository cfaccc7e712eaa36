-- undo.lua: take one recorded event back from a subject's windows (the
-- roll-back of a reservation whose delivery failed).
--
-- KEYS[1]  the subject's window ZSET
-- KEYS[2]  its meter HASH (see reserve.lua); absent when its meters are
--          members of the ZSET (src/store/redis/layout.rs)
-- ARGV[1]  member: the event's id
-- ARGV[2..] per meter window: its field ("<limit>/<length>") or, in the
--          ZSET, its member ("m:<limit>/<length>", scored -1 - level), and
--          its length in ms
--
-- The event's member leaves the ZSET; each meter's level goes down by the
-- window's length (what the event raised it by), never below 0. A meter
-- that has expired is left alone.
--
-- Returns 1. Commands per call: ZREM, then EXISTS and per meter window HGET
-- and HSET; or, in the ZSET, per meter window ZSCORE and ZADD.
--
-- Example:
--   EVALSHA <sha> 2 "tg:{global:sms_send}:sms_send" "tg:{global:sms_send}:sms_send:meter" \
--     "9f3c2a1b00d4e5f6" "100000/60000" 60000
--   -> 1

redis.call('ZREM', KEYS[1], ARGV[1])
if not KEYS[2] then
  for i = 2, #ARGV, 2 do
    local score = tonumber(redis.call('ZSCORE', KEYS[1], ARGV[i]))
    if score then
      local left = math.max(-1 - score - tonumber(ARGV[i + 1]), 0)
      redis.call('ZADD', KEYS[1], 'XX', string.format('%d', -1 - left), ARGV[i])
    end
  end
elseif redis.call('EXISTS', KEYS[2]) == 1 then
  for i = 2, #ARGV, 2 do
    local level = tonumber(redis.call('HGET', KEYS[2], ARGV[i]))
    if level then
      local left = math.max(level - tonumber(ARGV[i + 1]), 0)
      redis.call('HSET', KEYS[2], ARGV[i], string.format('%d', left))
    end
  end
end
return 1
