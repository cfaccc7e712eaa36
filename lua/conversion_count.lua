-- conversion_count.lua: add to or take from one count of a conversion HASH
-- (see reserve.lua): an event (a code sent) or a success (a code verified)
-- now, or an event taken back (a send not delivered after all) from the
-- slice it was counted in.
--
-- KEYS[1]  the subject's conversion HASH
-- ARGV[1]  which count: "s" (successes) or "e" (events)
-- ARGV[2]  delta: 1 or -1
-- ARGV[3]  the slice, or -1 for the current one (now / slice_ms)
-- ARGV[4]  slice_ms
-- ARGV[5]  keep_ms: how long the key lives after a count (the window, and
--          with a surge the history too)
--
-- A count that reaches 0 is deleted (a hash left empty is no key). Adding
-- keeps the key for keep_ms, or until the escalation's end when later:
-- renewed by reserve.lua's rule (its "exp" field says when the key expires;
-- renewed, with "exp", only when that is sooner, to keep + keep / 8).
-- Taking back leaves the expiry alone.
--
-- Returns the slice changed. Commands per call: TIME, HINCRBY; for a given
-- slice HDEL of reserve.lua's sums; when adding HMGET (and HSET and PEXPIRE
-- when renewed); HDEL and HLEN when it reaches 0 (and HEXISTS, DEL when
-- only "exp" is left).
--
-- Example (a code verified for a number prefix):
--   EVALSHA <sha> 1 "tg:{prefix:+3361234}:conversion" s 1 -1 300000 3600000
--   -> 5895348

local key = KEYS[1]
local delta = tonumber(ARGV[2])
local slice_ms = tonumber(ARGV[4])

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)

local slice = tonumber(ARGV[3])
if slice < 0 then
  slice = math.floor(now / slice_ms)
else
  -- A count taken from a given slice (a send taken back), which may be one
  -- before the current: the sums reserve.lua keeps of the slices before
  -- the current one ("cur", "be", "bs", "nt") are made again at its next
  -- call. The caller does not say which slice is current, so this drops
  -- them even when it is. A count of the current slice (slice -1) needs
  -- nothing: reserve.lua reads that slice's own fields.
  redis.call('HDEL', key, 'cur', 'be', 'bs', 'nt')
end
local field = ARGV[1] .. ':' .. string.format('%d', slice)

local count = redis.call('HINCRBY', key, field, delta)
if count <= 0 then
  redis.call('HDEL', key, field)
  -- the renewal's "exp" alone is no count: the hash is empty
  if redis.call('HLEN', key) == 1 and redis.call('HEXISTS', key, 'exp') == 1 then
    redis.call('DEL', key)
  end
  return slice
end
if delta > 0 then
  local keep = tonumber(ARGV[5])
  local got = redis.call('HMGET', key, 'until', 'exp')
  local block_until, exp = tonumber(got[1]), tonumber(got[2])
  if block_until and block_until - now > keep then keep = block_until - now end
  if not exp or exp < now + keep then
    keep = keep + math.floor(keep / 8)
    redis.call('HSET', key, 'exp', string.format('%d', now + keep))
    redis.call('PEXPIRE', key, string.format('%d', keep))
  end
end
return slice
