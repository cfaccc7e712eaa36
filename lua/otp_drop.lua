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
-- It also tells whether the failed code was tried while its delivery was
-- at the provider: a verify came between the send's reservation, which
-- stores the code, and this call. Its send then keeps the phone's windows
-- (src/guard/sms/send.rs): else each failed send would give a guesser a
-- fresh code's tries on the phone and leave no trace of them.
--
-- KEYS[1]  the subject's code HASH (otp_put.lua)
-- ARGV[1]  mac of the failed send's code
-- ARGV[2]  the tries the code was stored with (sms.max_verify_attempts)
--
-- Returns 1 when the failed code was tried: a wrong try on it (its own
-- tries or everyone else's below ARGV[2], here or where a racing send
-- kept it), or it is gone (a right try used it: no hash, or a hash that
-- neither is nor keeps it); 0 when it was not.
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
if not h[1] then return 1 end
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
local others, prefix, taken, tried = {}, failed .. ',', false, 1
for entry in string.gmatch(kept, '[^;]+') do
  if string.sub(entry, 1, #prefix) == prefix then
    taken = true
    local left, lo = string.match(entry, '^[^,]+,(%d+),(%d+),')
    if tonumber(left) == attempts and tonumber(lo) == attempts then tried = 0 end
  else
    others[#others + 1] = entry
  end
end
if taken then redis.call('HSET', key, 'kept', table.concat(others, ';')) end
return tried
