-- otp_drop.lua: the roll-back of a send whose delivery failed. While the
-- code is still the one sealed as ARGV[1], it goes, and the code it
-- replaced, the first it kept (otp_keep.lua), comes back if it is still
-- live, with the tries it had left and the codes kept behind it, so that a
-- failed resend leaves the phone's earlier code as it was. Only the first:
-- one further back was replaced by a send whose SMS may have gone (a code
-- sent with a longer sms.code_ttl before a reload can outlive the one that
-- replaced it). A send that raced it and wrote its own code since keeps
-- that code, which its SMS carries, and takes the failed code out of those
-- it kept, so that a code no SMS carried never comes back.
--
-- KEYS[1]  the subject's code HASH (otp_put.lua)
-- ARGV[1]  mac of the failed send's code
--
-- Returns 2 when the code was deleted and an earlier one put back, 1 when
-- it was deleted, 0 when another (or none) is there.
-- Commands per call: TIME, HMGET; when it matches DEL, and HSET and
-- PEXPIREAT when an earlier code comes back; when it was kept, HSET.
--
-- Example:
--   EVALSHA <sha> 1 "tg:{phone:+33612345678}:otp" "9f86d08..."
--   -> 2

local key, failed = KEYS[1], ARGV[1]
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)

local h = redis.call('HMGET', key, 'mac', 'kept')
local kept = h[2] or ''
if h[1] == failed then
  redis.call('DEL', key)
  local first, rest = kept, ''
  local at = string.find(kept, ';', 1, true)
  if at then first, rest = string.sub(kept, 1, at - 1), string.sub(kept, at + 1) end
  local mac, left, lo, n, exp, u =
    string.match(first, '^([^,]+),(%d+),(%d+),([^,]*),(%d+),([01])$')
  -- PEXPIREAT at now or before would delete the key at once
  if mac and exp + 0 > now then
    redis.call('HSET', key, 'mac', mac, 'left', left, 'lo', lo, 'n', n, 'exp', exp, 'ne', exp,
      'u', u, 'kept', rest)
    redis.call('PEXPIREAT', key, exp)
    return 2
  end
  return 1
end
if kept ~= '' then
  local others, prefix, taken = {}, failed .. ',', false
  for entry in string.gmatch(kept, '[^;]+') do
    if string.sub(entry, 1, #prefix) == prefix then
      taken = true
    else
      others[#others + 1] = entry
    end
  end
  if taken then redis.call('HSET', key, 'kept', table.concat(others, ';')) end
end
return 0
