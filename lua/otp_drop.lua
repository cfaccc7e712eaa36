-- otp_drop.lua: delete a one-time code if it is still the one sealed as
-- ARGV[1]: the roll-back of a send whose delivery failed. A send that raced
-- it and wrote its own code since keeps that code, which its SMS carries.
--
-- KEYS[1]  the subject's code HASH (otp_put.lua)
-- ARGV[1]  mac of the failed send's code
--
-- Returns 1 when the code was deleted, 0 when another (or none) is there.
-- Commands per call: HGET, and DEL when it matches.
--
-- Example:
--   EVALSHA <sha> 1 "tg:{phone:+33612345678}:otp" "9f86d08..."
--   -> 1

if redis.call('HGET', KEYS[1], 'mac') == ARGV[1] then
  redis.call('DEL', KEYS[1])
  return 1
end
return 0
