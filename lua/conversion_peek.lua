-- conversion_peek.lua: a conversion's counts in its window and its live block
-- (see reserve.lua), recording nothing.
--
-- KEYS[1]  the subject's conversion HASH
-- ARGV[1]  slice_ms
-- ARGV[2]  slices a count sums, the current one included
--
-- Returns an array of integers:
--   { events, successes, block_retry_after_ms (-1: no live block),
--     block_events, block_successes, block_shadow (1/0) }
--
-- Commands per call: TIME, HGETALL.
--
-- Example:
--   EVALSHA <sha> 1 "tg:{country:CN}:conversion" 300000 12
--   -> { 0, 0, 43170123, 20, 3, 0 }

local slice_ms = tonumber(ARGV[1])

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local oldest = math.floor(now / slice_ms) - tonumber(ARGV[2]) + 1

local raw = redis.call('HGETALL', KEYS[1])
local events, successes, block = 0, 0, {}
for j = 1, #raw, 2 do
  local kind, slice = string.match(raw[j], '^([es]):(%d+)$')
  if kind == nil then
    block[raw[j]] = raw[j + 1]
  elseif tonumber(slice) >= oldest then
    if kind == 'e' then
      events = events + tonumber(raw[j + 1])
    else
      successes = successes + tonumber(raw[j + 1])
    end
  end
end

local block_until = tonumber(block['until'])
if block_until and block_until > now then
  return { events, successes, block_until - now, tonumber(block['events']) or 0,
    tonumber(block['successes']) or 0, block['shadow'] == '1' and 1 or 0 }
end
return { events, successes, -1, 0, 0, 0 }
