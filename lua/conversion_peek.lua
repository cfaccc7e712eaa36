-- conversion_peek.lua: a conversion's counts in its window, its normal and
-- its live escalation (see reserve.lua), recording nothing.
--
-- KEYS[1]  the subject's conversion HASH
-- ARGV[1]  slice_ms
-- ARGV[2]  slices a count sums, the current one included
-- ARGV[3]  min_ratio_ppm (which stale slices would teach the normal)
-- ARGV[4]  bucket_ms; 0 without a surge (no normal)
--
-- Returns an array of integers:
--   { events, successes, retry_after_ms (-1: no live escalation),
--     escalation_events, escalation_successes, escalation_shadow (1/0),
--     level (1 challenge, 2 block, 0 none), escalation_normal, normal }
-- normal is in thousandths of an event per window, rounded half up: the
-- taught events of the seven buckets before the current one, counting the
-- stale slices reserve.lua has not folded in yet as it would fold them.
--
-- Commands per call: TIME, HGETALL.
--
-- Example:
--   EVALSHA <sha> 1 "tg:{country:CN}:conversion" 300000 12 200000 86400000
--   -> { 0, 0, 43170123, 600, 3, 0, 1, 20000, 20000 }

local slice_ms = tonumber(ARGV[1])
local ppm = tonumber(ARGV[3])
local span = slice_ms * tonumber(ARGV[2])
local bucket = tonumber(ARGV[4])

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local slice = math.floor(now / slice_ms)
local oldest = slice - tonumber(ARGV[2]) + 1
local current = bucket > 0 and math.floor(now / bucket) or 0

local function read(b) return b >= current - 7 and b < current end

local raw = redis.call('HGETALL', KEYS[1])
local events, successes, fields, old, sum = 0, 0, {}, {}, 0
for j = 1, #raw, 2 do
  local kind, n = string.match(raw[j], '^([esn]):(%d+)$')
  local value = tonumber(raw[j + 1])
  if kind == nil then
    fields[raw[j]] = raw[j + 1]
  elseif kind == 'n' then
    if bucket > 0 and read(tonumber(n)) then sum = sum + value end
  elseif tonumber(n) > slice then
    -- counted under a longer window (reserve.lua drops it): not summed
  elseif tonumber(n) >= oldest then
    if kind == 'e' then events = events + value else successes = successes + value end
  else
    old[n] = old[n] or { 0, 0 }
    old[n][kind == 'e' and 1 or 2] = value
  end
end
local normal = 0
if bucket > 0 then
  for n, c in pairs(old) do
    if c[1] > 0 and c[2] * 1000000 >= ppm * c[1]
        and read(math.floor(tonumber(n) * slice_ms / bucket)) then
      sum = sum + c[1]
    end
  end
  normal = math.floor(sum * span / (7 * bucket) * 1000 + 0.5)
end

local until_at = tonumber(fields['until'])
if until_at and until_at > now then
  local level = fields['level'] == 'c' and 1 or 2
  return { events, successes, until_at - now, tonumber(fields['events']) or 0,
    tonumber(fields['successes']) or 0, fields['shadow'] == '1' and 1 or 0, level,
    tonumber(fields['normal']) or 0, normal }
end
return { events, successes, -1, 0, 0, 0, 0, 0, normal }
