-- login_attempt.lua: record one login outcome, atomically with the lock check,
-- the lock decision and (when the IP's window is given) the IP's block, captcha
-- tier and failure record, so concurrent failures record exactly lock_after of
-- them per user and ip_block_after per IP, and lock exactly once.
--
-- The script is a template: the policy is written into it as Lua literals in
-- place of the POLICY marker below (src/store/redis/login_script.rs), one
-- script per policy and request shape (with or without the pair, the IP's
-- window and the network's), loaded once and called by its SHA. Twelve policy numbers parsed
-- from ARGV at every call, and numbers formatted for every redis.call, were
-- a sixth of the call's cost in Redis (docs/benchmarks.md).
--
-- KEYS[1]  the user's failure ZSET (score = failure time in ms, member = attempt
--          id; with pairs, "<ip>|<attempt id>", so that a pair's failures are
--          the members that start with its IP and no key per pair is written)
-- KEYS[2]  the user's lock HASH: until (lock end, ms), level (escalation level),
--          s_until and s_level (the lock shadow calls started, apart)
-- when the policy has the pair, its keys, under the user's hash tag:
--   KEYS[3] the pair's lock HASH (written only when the pair locks)
--   KEYS[4] the user's index of locked pairs ZSET (member = IP, score = lock start)
-- then, when the policy has it: the IP's failure ZSET (Redis Cluster callers,
--          whose IP lives in another slot, pass what they read of it in
--          ARGV[4] and ARGV[6] instead)
-- last, when the policy has it: the IP's network's failure ZSET, a captcha
--          tier only (an IPv6 client; on a cluster its own call instead)
-- ARGV[1]  member: unique id of this attempt
-- ARGV[2]  success (1/0)        ARGV[3]  captcha_passed (1/0)
-- ARGV[4]  captcha_demanded (1/0): something outside the user demands a captcha
-- ARGV[5]  shadow (1/0)
-- ARGV[6]  ip_blocked (1/0): something outside the user refuses the attempt
-- ARGV[7]  with the pair: the pair's IP
-- ARGV[last] deadline: the caller stops waiting after this TIME in ms (0: no
--          deadline); a call that runs later answers "late" and changes
--          nothing (src/store/redis/deadline.rs)
--
-- Returns 11 numbers packed as little-endian doubles (struct.pack('<d...')):
--   { verdict, retry_after_ms, failures, captcha_crossed, locked_for_ms,
--     ip_count, ip_retry_after_ms, pair_locked_for_ms,
--     captcha_count, lock_count, pair_count }
--   verdict 0 = the user's rules admit it, 1 = locked (retry_after_ms =
--   remaining lock), 2 = challenged, 3 = the pair is locked (retry_after_ms =
--   its remaining lock); the outcome is recorded when verdict is 0
--   and the IP is not blocked, or in shadow mode. failures = captcha-window
--   failures after this call; captcha_crossed 1 when this call's failure made
--   them reach captcha_after; locked_for_ms = the lock this call started, -1
--   when none. ip_count = the IP's failures in its window before this call and
--   ip_retry_after_ms = how long the IP stays blocked, both -1 without the IP's key
--   (and the retry -1 when it is not blocked). pair_locked_for_ms = the pair
--   lock this call started, -1 when none. captcha_count, lock_count and
--   pair_count are the user's failures in the captcha window, in the lock
--   window, and the pair's in the lock window, before this call (pair_count
--   -1 without the pair): what the rules' metrics count against.
--   With the network's key, a 12th: the network's failures in its window
--   before this call.
--
-- A lock lasts lock_ms * 2^level, capped at lock_max_ms; level is the previous
-- level + 1 when the lock starts within escalation_reset_ms of the previous
-- lock's end, else 0. The lock key expires escalation_reset_ms after the lock
-- ends. A pair's lock works the same way at pair_lock_after, counted over the
-- user's failures in the lock window that carry the pair's IP (from the same
-- read), so a pair costs one HMGET and writes nothing until it locks. A shadow
-- call records as if allowed; while a lock is live it never starts a new one.
-- The locks it starts are kept apart (s_until, s_level): enforcing calls read
-- none of them.
-- The user keeps at most max(captcha_after, lock_after) newest failures
-- (lock_after being the account's threshold, above the pair's), the IP
-- max(ip_captcha_after, ip_block_after), the network net_captcha_after. The
-- index of locked pairs keeps its PAIR_INDEX_KEEP newest for lock_max_ms +
-- escalation_reset_ms, longer than any lock it lists.
--
-- Commands per call: TIME, ZRANGE (the user's failures, at most keep), HMGET
-- (and HMGET for the pair); with the IP one ZCOUNT (and a ZREVRANGE when it is
-- blocked), with the network one ZCOUNT. A recorded failure adds ZADD and
-- PEXPIRE per set (ZREMRANGEBYRANK for a full user set, always for the IP and
-- the network); HSET and PEXPIRE when it locks (and ZADD, ZREMRANGEBYRANK,
-- PEXPIRE on the index for a pair); a recorded success one DEL.
--
-- Example (user and IP in one call):
--   EVALSHA <sha> 3 "tg:{user:alice}:login_attempt" "tg:{user:alice}:lock" \
--     "tg:{ip:192.0.2.7}:login_attempt" "0190...-uuid" 0 0 0 0 0 0
--   -> the packed { 0, 0, 1, 0, -1, 0, -1, -1, 0, 0, -1 }

-- The policy: captcha_after, captcha_window, lock_after, lock_window,
-- lock_ms, lock_max_ms, reset_on_success, escalation_reset, pair_lock_after,
-- keep (the user's newest failures kept: max(captcha_after, lock_after)),
-- keep_rank, user_ttl, index_ttl; pair (whether KEYS[3], KEYS[4] and ARGV[7]
-- are the pair's), pair_index_keep_rank (the index keeps its newest
-- PAIR_INDEX_KEEP, src/store/login.rs); ipkey (the IP's key, or false) with ip_captcha_after,
-- ip_block_after, ip_window, ip_keep_rank, ip_ttl; netkey (the network's key,
-- or false) with net_captcha_after, net_window, net_keep_rank, net_ttl. Ranks and TTLs
-- come as strings: redis.call formats a number with snprintf("%.17g").
--@POLICY@

local wkey, lkey = KEYS[1], KEYS[2]
local member = ARGV[1]
local success = ARGV[2] == '1'
local captcha_passed = ARGV[3] == '1'
local captcha_demanded = ARGV[4] == '1'
local shadow = ARGV[5] == '1'
local ip_blocked = ARGV[6] == '1'
local plkey, pindex, pair_ip
if pair then
  plkey, pindex, pair_ip = KEYS[3], KEYS[4], ARGV[7]
end

-- A number Redis answers as a string is made a number by arithmetic, not by
-- tonumber, which parses it twice (see reserve.lua).
local t = redis.call('TIME')
local now = t[1] * 1000 + math.floor(t[2] / 1000)
-- Numbers handed to redis.call are formatted each time: format `now` once.
local now_s = string.format('%d', now)
-- Nobody waits for a call that runs after its deadline: the failure it would
-- count, and the lock it would start, must not hold without their audit rows.
local deadline = ARGV[#ARGV] + 0
if deadline > 0 and now > deadline then return 'late' end

local function count(key, length)
  return redis.call('ZCOUNT', key, string.format('(%d', now - length), '+inf')
end

-- The IP: its count, block and captcha tier.
local ip_count, ip_retry = -1, -1
if ipkey then
  ip_count = count(ipkey, ip_window)
  if ip_count >= ip_block_after then
    ip_blocked = true
    ip_retry = ip_window
    if ip_block_after > 0 then
      local m = redis.call('ZREVRANGE', ipkey, ip_block_after - 1, ip_block_after - 1, 'WITHSCORES')
      if m[2] then ip_retry = math.max(m[2] + ip_window - now, 0) end
    end
  end
  if ip_count >= ip_captcha_after then captcha_demanded = true end
end

-- The network: its captcha tier. Written only with the failure, below.
local net_count = -1
if netkey then
  net_count = count(netkey, net_window)
  if net_count >= net_captcha_after then captcha_demanded = true end
end

-- A lock record: its end and level, and whether it holds now. The locks
-- shadow calls start are what would have been, kept apart (s_until,
-- s_level): an enforcing call reads only until and level, so switching
-- shadow mode off locks no one. A shadow call reads the enforced lock while
-- it holds, else whichever of the two ended later (its escalation history).
local function read_lock(key)
  local l = redis.call('HMGET', key, 'until', 'level', 's_until', 's_level')
  local until_ms = l[1] and l[1] + 0
  local level = (l[2] or 0) + 0
  local s_until = l[3] and l[3] + 0
  if shadow and not (until_ms and until_ms > now) and s_until
    and (not until_ms or s_until >= until_ms) then
    until_ms, level = s_until, (l[4] or 0) + 0
  end
  return until_ms, level, until_ms and until_ms > now
end

-- Start a lock one level above the previous one when that ended recently.
local function lock(key, prev_until, prev_level)
  local level = 0
  if prev_until and now - prev_until <= escalation_reset then
    level = math.min(prev_level + 1, 40)
  end
  local duration = math.min(lock_ms * 2 ^ level, lock_max_ms)
  local u, lv = 'until', 'level'
  if shadow then u, lv = 's_until', 's_level' end
  redis.call('HSET', key, u, string.format('%d', now + duration), lv, level)
  -- One key holds both locks: it lives as long as the longer needs.
  local ttl = duration + escalation_reset
  if redis.call('PTTL', key) < ttl then
    redis.call('PEXPIRE', key, string.format('%d', ttl))
  end
  return duration
end


local prev_until, prev_level, locked = read_lock(lkey)
local pprev_until, pprev_level, pair_locked = nil, 0, false
if pair then pprev_until, pprev_level, pair_locked = read_lock(plkey) end

-- The user's failures, oldest first: never more than keep of them, so one
-- read gives every count this call needs.
local ids, scores = {}, {}
local raw = redis.call('ZRANGE', wkey, 0, -1, 'WITHSCORES')
for j = 1, #raw, 2 do
  ids[#ids + 1] = raw[j]
  scores[#scores + 1] = raw[j + 1] + 0
end

-- The user's failures in the last `length` ms; with `tag`, those whose id
-- starts with it (a pair's).
local function recent(length, tag)
  local c = 0
  for j = #scores, 1, -1 do
    if scores[j] <= now - length then break end
    if tag == nil or string.sub(ids[j], 1, #tag) == tag then c = c + 1 end
  end
  return c
end

local failures = recent(captcha_window)
local captcha_count, lock_count, pair_count = failures, recent(lock_window), -1
if pair then pair_count = recent(lock_window, pair_ip .. '|') end
local verdict, retry = 0, 0
if locked then
  -- The account's lock refuses; with the pair's locked too, the later end
  -- answers (as `/login/check` does): a retry after the earlier one would
  -- only be refused again.
  local ends = prev_until
  if pair_locked and pprev_until > ends then ends = pprev_until end
  verdict, retry = 1, ends - now
elseif pair_locked then
  verdict, retry = 3, pprev_until - now
elseif (failures >= captcha_after or captcha_demanded) and not captcha_passed then
  verdict = 2
end

local crossed, locked_for, pair_locked_for = 0, -1, -1
if (verdict == 0 and not ip_blocked) or shadow then
  if success then
    if reset_on_success then
      redis.call('DEL', wkey)
      failures = 0
    end
  else
    local id = member
    if pair then id = pair_ip .. '|' .. member end
    redis.call('ZADD', wkey, now_s, id)
    ids[#ids + 1], scores[#scores + 1] = id, now
    if #ids > keep then
      redis.call('ZREMRANGEBYRANK', wkey, '0', keep_rank)
      while #ids > keep do
        table.remove(ids, 1)
        table.remove(scores, 1)
      end
    end
    redis.call('PEXPIRE', wkey, user_ttl)
    local in_lock_window = recent(lock_window)
    if not locked and in_lock_window >= lock_after then
      locked_for = lock(lkey, prev_until, prev_level)
    end
    if pair and not pair_locked then
      if in_lock_window >= pair_lock_after
        and recent(lock_window, pair_ip .. '|') >= pair_lock_after then
        pair_locked_for = lock(plkey, pprev_until, pprev_level)
        -- The index of locked pairs outlives every lock it lists.
        redis.call('ZADD', pindex, now_s, pair_ip)
        redis.call('ZREMRANGEBYRANK', pindex, '0', pair_index_keep_rank)
        redis.call('PEXPIRE', pindex, index_ttl)
      end
    end
    if ipkey then
      redis.call('ZADD', ipkey, now_s, member)
      redis.call('ZREMRANGEBYRANK', ipkey, '0', ip_keep_rank)
      redis.call('PEXPIRE', ipkey, ip_ttl)
    end
    if netkey then
      redis.call('ZADD', netkey, now_s, member)
      redis.call('ZREMRANGEBYRANK', netkey, '0', net_keep_rank)
      redis.call('PEXPIRE', netkey, net_ttl)
    end
    -- The set keeps its `keep` newest, and `failures` were the newest.
    local after = math.min(failures + 1, keep)
    if failures < captcha_after and after >= captcha_after then crossed = 1 end
    failures = after
  end
end

-- Packed as doubles: one bulk string is cheaper for Redis to answer than
-- an array of integers (about 4 k instructions of 137 k). Little-endian, as
-- the machines Redis runs on are: struct swaps the bytes of each number
-- otherwise.
if netkey then
  return struct.pack('<dddddddddddd', verdict, retry, failures, crossed, locked_for, ip_count,
    ip_retry, pair_locked_for, captcha_count, lock_count, pair_count, net_count)
end
return struct.pack('<ddddddddddd', verdict, retry, failures, crossed, locked_for, ip_count,
  ip_retry, pair_locked_for, captcha_count, lock_count, pair_count)
