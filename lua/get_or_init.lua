-- get_or_init.lua: set a key to a candidate value unless it holds one; return
-- the stored value. Used for process-wide secrets shared by every instance.
--
-- KEYS[1]  the key (a plain string, no expiry)
-- ARGV[1]  candidate value
--
-- Returns the value stored after this call (a bulk string).
--
-- Example:
--   EVALSHA <sha> 1 "tg:secret:otp_hmac_key" "3q2+7w..."
--   -> "3q2+7w..."

local current = redis.call('GET', KEYS[1])
if current then return current end
redis.call('SET', KEYS[1], ARGV[1])
return ARGV[1]
