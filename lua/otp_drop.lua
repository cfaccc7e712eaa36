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
-- It also tells what the failed code had come to, for what its send gives
-- back (src/guard/sms/decision.rs, `guessed_at`): a verify may have come
-- between the send's reservation, which stores the code, and this call.
--
-- KEYS[1]  the subject's code HASH (otp_put.lua)
-- ARGV[1]  mac of the failed send's code
-- ARGV[2]  the tries the code was stored with (sms.max_verify_attempts)
--
-- Returns 0 when the failed code was found untried (its own tries and
-- everyone else's at ARGV[2], here or where a racing send kept it), 1 when
-- found tried (a wrong try took one of them), 2 when it is not here (no
-- hash, or a hash that neither is nor keeps it: a right try used it, or
-- one used the racing send's code that kept it).
-- Commands per call: TIME, HMGET; when it matches DEL, and HSET and
-- PEXPIREAT when an earlier code comes back; when it was kept, HSET.
--
-- Example:
--   EVALSHA <sha> 1 "tg:{phone:+33612345678}:otp" "9f86d08..." 5
--   -> 0

local key, failed, attempts = KEYS[1], ARGV[1], tonumber(ARGV[2])
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)

local h = redis.call('HMGET', key, 'mac', 'kept', 'left', 'lo')
local kept = h[2] or ''
if not h[1] then return 2 end
if h[1] == failed then
  local tried = 0
  if tonumber(h[3]) ~= attempts or tonumber(h[4] or attempts) ~= attempts then tried = 1 end
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
  end
  return tried
end
local others, prefix, taken, tried = {}, failed .. ',', false, 2
for entry in string.gmatch(kept, '[^;]+') do
  if string.sub(entry, 1, #prefix) == prefix then
    taken = true
    local left, lo = string.match(entry, '^[^,]+,(%d+),(%d+),')
    tried = 1
    if tonumber(left) == attempts and tonumber(lo) == attempts then tried = 0 end
  else
    others[#others + 1] = entry
  end
end
if taken then redis.call('HSET', key, 'kept', table.concat(others, ';')) end
return tried
