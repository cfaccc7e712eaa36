-- otp_check.lua: check a one-time code. A match deletes it (single use); a miss
-- uses up one attempt of the trying address's (see below); the asker's last
-- attempt burns it, and the burnt code is kept
-- until its expiry so that further tries answer "burnt". Without a code
-- (never sent, used or expired) a stand-in takes the try: an empty mac, which
-- nothing matches, with the attempts and the ttl a code gets, so that the
-- answers never tell whether a code is pending.
--
-- Two counts of tries: the address that asked for the code (n) has its own
-- (left), every other address shares another (lo), as many. Strangers who
-- use up theirs are refused from then on, but cannot burn the asker's code;
-- the asker's last wrong try burns it for everyone. A stand-in, a code sent
-- without an address, and one stored before n existed have no asker: every
-- try counts in lo.
--
-- KEYS[1]  the subject's code HASH: mac, left (the asker's attempts left),
--          lo (everyone else's; absent in a code stored before it: left), n (the
--          asker's address, as its IP subject's id; '' for none), exp
--          (expiry, ms), ne (the exp n and lo were written with: they count
--          only while it is exp's), u ('1' when its send was not counted:
--          otp_put.lua; '0' or absent when it was)
-- ARGV[1]  mac of the code offered
-- ARGV[2]  attempts a stand-in allows (those of a code)
-- ARGV[3]  a stand-in's ttl in ms (a code's)
-- ARGV[4]  the trying address, as its IP subject's id; '' for none
-- ARGV[5]  deadline: the caller stops waiting after this TIME in ms (0: none);
--          a call that runs later answers { 3, 0, 0 } and changes nothing
--          (src/store/redis/deadline.rs): a match its caller never heard of
--          must not use the code up
--
-- Returns an array of three integers: { outcome, value, counted }
--   0 = valid (value = the try's attempts left before it), 1 = wrong (value =
--       attempts left, 0 = now burnt for this address: for everyone when it
--       is the asker's),
--   2 = burnt (value = a code's ttl in ms: as long as it may stay burnt, the
--       same whether a code was pending, unlike its own expiry, which would
--       tell that and when it was sent).
--   counted: 1 unless the code's send was not counted by the pumping guard
--       (then its verify is not counted either); 1 for a stand-in.
--
-- The MACs are compared in time independent of where they differ, and a
-- stand-in goes through the same comparison as a code.
--
-- Commands per call: TIME, HMGET; a miss HSET (six fields) and PEXPIREAT,
-- for a code and a stand-in alike; a match DEL.
--
-- Example:
--   EVALSHA <sha> 1 "tg:{phone:+33612345678}:otp" "9f86d08..." 5 300000 "203.0.113.7" 0
--   -> { 1, 4, 1 }

local key = KEYS[1]
local offered = ARGV[1]

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local deadline = tonumber(ARGV[5]) or 0
if deadline > 0 and now > deadline then return { 3, 0, 0 } end

local h = redis.call('HMGET', key, 'mac', 'left', 'exp', 'u', 'n', 'lo', 'ne')
local mac, left, exp = h[1], tonumber(h[2]), tonumber(h[3])
local counted = 1
if h[4] == '1' then counted = 0 end
local asker, lo = h[5] or '', tonumber(h[6])
-- n and lo hold only when written with this exp: a send by an earlier build
-- (during a rolling upgrade) writes mac, left and exp over a stand-in's or
-- another code's n and lo, which are not this code's
if h[7] ~= h[3] then asker, lo = '', nil end
if not mac or not left or not exp then
  local ttl = tonumber(ARGV[3])
  if ttl <= 0 then return { 1, 0, 1 } end
  mac, left, exp, asker, lo = '', tonumber(ARGV[2]), now + ttl, '', nil
end
-- a code stored before lo existed goes on with the tries it has left
if not lo then lo = left end
local own = asker ~= '' and asker == ARGV[4]
local tries = lo
if own then tries = left end
if left <= 0 or tries <= 0 then return { 2, tonumber(ARGV[3]), counted } end

local diff = 0
if #mac ~= #offered or #mac == 0 then diff = 1 end
for i = 1, #offered do
  local a = string.byte(mac, i) or 0
  local b = string.byte(offered, i)
  diff = bit.bor(diff, bit.bxor(a, b))
end

if diff == 0 then
  redis.call('DEL', key)
  return { 0, tries, counted }
end
-- A code and a stand-in are written alike (the same fields, the same expiry
-- call), so that a miss costs the same whether a code is pending: a code's
-- expiry is set to the time it already has.
tries = tries - 1
if own then left = tries else lo = tries end
local exp_s = string.format('%d', exp)
redis.call('HSET', key, 'mac', mac, 'left', left, 'lo', lo, 'n', asker, 'exp', exp_s, 'ne', exp_s)
redis.call('PEXPIREAT', key, exp_s)
return { 1, tries, counted }
