-- readyz.lua: /readyz's check that this connection may run a script over
-- keys of more than one hash tag, as each decision's script does outside a
-- Redis Cluster (reserve.lua, login_attempt.lua). A Redis user whose ACL
-- refuses scripts (NOPERM), or a proxy that refuses one command over keys
-- of several slots (CROSSSLOT: a sharding proxy, or a Cluster node reached
-- by a redis:// URL), answers a plain SET and fails every decision: the
-- error of this call makes /readyz 503. It reads only: a script's writes
-- are not what tells a full Redis (the SET before it does).
--
-- KEYS     keys of the readiness probe: two hash tags outside a Cluster,
--          one in it
--
-- Returns how many of them exist.
-- Commands per call: EXISTS.
--
-- Example:
--   EVALSHA <sha> 2 "tg:readyz:{a}" "tg:readyz:{b}"
--   -> 0

return redis.call('EXISTS', unpack(KEYS))
