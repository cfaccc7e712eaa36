-- reserve.lua: offer one event to the sliding windows of one or more subjects,
-- all or nothing, and store a one-time code with it, atomically.
--
-- A template: tollgate renders the request's policy (its conversions,
-- whether a code is stored) as Lua literals in place of its POLICY line
-- below, and writes its subjects' windows out as Lua in place of the DECIDE,
-- RECORD and ANSWER lines, one script per shape of request, loaded once and
-- called by its SHA (src/store/redis/reserve_policy.rs, reserve_subjects.rs).
-- Only what changes from call to call travels as arguments: a policy parsed
-- from ARGV cost Redis more CPU than the rest of a send's script together
-- (about 60 strings pushed, converted with strtod and tabled at every call),
-- and a loop over the windows as tables most of the Lua instructions left.
--
-- KEYS        per subject: its window ZSET (score = event time in ms, member =
--             event id; only when it has log windows), then, when it has
--             meter windows, its meter HASH
--             (field "<limit>/<length>" = level, "<limit>/<length>:t" = when
--             the level was last set, in ms, "exp" = when the key expires, in
--             ms); or, for a subject whose log is read whole, its meters as
--             members of its ZSET: "m:<limit>/<length>" scored -1 - level,
--             and with ":t" -1 - when it was set, below every event
--             (src/store/redis/layout.rs)
--             then per conversion: its conversion HASH (field "e:<slice>" =
--             events and "s:<slice>" = successes counted in that slice; with
--             a surge "n:<bucket>" = events taught to the normal in that
--             bucket of the history; while challenged or blocked "until" (ms),
--             "events", "successes", "shadow" (1/0), and with a surge "level"
--             ("c" challenge, "b" block; absent: block), "normal" (in
--             thousandths) and "from" (the first slice under the challenge);
--             "exp" = when the key expires, in ms; the window's sums as of
--             slice "cur": "be" and "bs" = events and successes of the live
--             slices before it, with a surge "nt" = the events the seven
--             buckets before the current one were taught; made again at the
--             first call of a slice, and dropped by conversion_count.lua when
--             it changes a given slice; "cur" is "-" while an escalation is
--             set, so that a send reads "until" only with the whole hash)
-- KEYS[last]  optional: the subject's code HASH (mac, left, lo, n, exp, ne, u:
--             otp_check.lua; kept: the codes it replaced, otp_keep.lua),
--             written when the event is recorded
-- ARGV[1] member: unique id of this event
-- ARGV[2] gate_open: 1 when the request passed a captcha, else 0
-- ARGV[3] force: 1 to record the event even when a window refuses it (shadow mode)
-- ARGV[4], ARGV[5], ARGV[6], ARGV[7] when a code is stored: its mac, attempts
--         allowed (the asker's and everyone else's), ttl in ms, and the address
--         that asked for it as its IP subject's id ('' for none)
-- ARGV[last] deadline: the caller stops waiting after this TIME in ms (0:
--         no deadline); a call that runs later answers "late" and changes
--         nothing (src/store/redis/deadline.rs)
--
-- The policy rendered, per subject its windows: limit, window length in ms
-- and mode (enforce; gate: refuses only without a passed captcha; observe:
-- counted, never refuses, a rule in shadow), a meter (GCRA) or a sliding log;
-- per conversion: min_events, min_ratio_ppm (successes per million events),
-- slice_ms, slices (how many a count sums, the current one included),
-- block_ms, count (count the event when it is recorded, or check only: the
-- caller counts it later), surge (the multiple of the normal a surge needs,
-- in thousandths; 0: no surge, a block at once) and with a surge bucket_ms
-- (a seventh of the history) and escalate (a challenge may turn into a
-- block).
--
-- Returns the answer's integers packed as little-endian doubles, 8 bytes
-- each (struct.pack; little-endian, as the machines Redis runs on are:
-- struct swaps the bytes of each number otherwise): one bulk string instead
-- of an array Redis converts number by number (a fifth of the instructions
-- left outside the commands). In order:
--   { recorded, then per subject:
--     verdict, window, retry_after_ms, next_retry_after_ms, count_1, ..., count_n,
--     and, only for a subject with an observe window, observed_wait_1, ..., observed_wait_n,
--     then per conversion: verdict, events, successes, retry_after_ms, slice,
--     normal }
--   recorded 1 when the event was added to every subject (every subject allowed
--   it, or force) and the code stored; 0 when nothing was written.
--   verdict 0 = allowed, 1 = denied (window = refusing window with the longest
--   wait, 0-based; retry_after_ms = that wait), 2 = gated (window = first full
--   gate window); counts are before this event; next_retry_after_ms is how long
--   until every enforce window admits one more event, after this call;
--   observed_wait_w is, for a full observe window, the wait it would have
--   answered had it been enforced (0 for any other window).
--   A conversion's verdict: 0 = open, 1 = blocked (events and successes are
--   the block's figures, retry_after_ms when it ends), 2 = tripped by this
--   call (blocked for block_ms on the figures given), 3 = challenged (a
--   captcha is needed; the challenge's figures, retry_after_ms when it
--   ends), 4 = challenged by this call; otherwise events and successes are
--   the window's before this event. slice is where the event was counted
--   (when recorded), else -1. normal (thousandths of an event per window,
--   rounded half up; 0 without a surge) is the one the escalation was set
--   on, else the normal now.
--
-- Conversions come first. Stale slices are dropped; with a surge, each one
-- whose successes * 10^6 >= min_ratio_ppm * events (and events > 0) first
-- adds its events to its bucket (slice * slice_ms / bucket_ms), and buckets
-- older than the seven before the current one are dropped. The normal is
-- taught * span / (7 * bucket_ms), taught being the events of those
-- seven buckets, span = slices * slice_ms the time a count sums. A
-- conversion "trips" when events >= min_events and
-- successes * 10^6 < min_ratio_ppm * events, and with a surge also
-- events * 1000 >= surge * normal.
-- A live escalation (an enforced one; with force a shadow one too) answers:
-- a block refuses; a challenge refuses unless gate_open, and when escalate
-- and the event is of the challenge's mode (force = shadow) it becomes a
-- block if the slices from "from" on trip. Else, when the window trips, a
-- conversion without a surge is blocked (its counts replaced by the block),
-- one with a surge challenged (its counts kept, "from" the next slice);
-- shadow when force; for block_ms. A block tripped from a challenge drops
-- the slices too, never the history. When a block refuses and not force, no
-- window is read and nothing else is written (each subject's answer is then
-- 0s); a challenge refusing lets the windows be read, so that a rate limit
-- answers before it, and records nothing. When the event is recorded it is
-- counted in the current slice of every conversion that asks it (expiry:
-- keep = span, plus 8 buckets with a surge, or the escalation's end when
-- later; a trip sets block_ms, or with a surge the larger of it and keep).
--
-- Time is the server's TIME in ms. An event at t counts in a window of length w
-- while now - w < t. A subject keeps at most max(limit) newest events (and
-- its meters' members, when they are in its ZSET) and expires after its
-- longest log window, or its longest meter when that is in the ZSET and
-- longer. A member of the ZSET scored below 0 that no meter of the policy
-- names (a meter since changed) is dropped when an event is recorded.
--
-- A meter (GCRA as a leaky bucket) with limit L and length W keeps a level
-- that each event raises by W and that drains by L per ms, so it admits L
-- events at once and then one per W/L ms: the level is at most L*W, its count
-- is ceil(level / W), it is full when level > (L-1)*W, and its wait is
-- ceil((level + W - L*W) / L). A forced event (shadow mode) raises it to at
-- most L*W, as a log keeps at most its limit. All integers (start-up keeps
-- L*W < 2^53).
--
-- Expiry: a hash (meters, conversion) must live `keep` past its last write.
-- Its "exp" field says when it expires; a write renews the expiry only when
-- "exp" is sooner than now + keep, to keep + keep / 8, so a key every send
-- writes (a prefix's, the global one) takes a PEXPIRE once per keep / 8 and
-- not at every call. A key is never cut short: every script that sets such
-- a key's expiry sets "exp" with it (conversion_count.lua renews by the same
-- rule), and a DEL takes "exp" with the key.
--
-- Commands per call: TIME; per subject one read (ZRANGE of the whole set when
-- max(limit) <= 32, else one ZCOUNT per window), plus one ZREVRANGE per full
-- window of a large set, and one HMGET of its meters (none when they are
-- in its ZSET); when recorded, per subject ZADD (of the event, and of its
-- meters when they are in its ZSET) and PEXPIRE (and ZREMRANGEBYRANK when
-- the set is full, always for a large set), HSET of its meters in a hash
-- (and PEXPIRE when renewed), and EXISTS, HSET and PEXPIRE for the code
-- (and HMGET when it exists: otp_keep.lua). A refused
-- request reads and writes nothing else.
-- A subject with only meter windows never touches its ZSET. Per conversion:
-- HMGET of its sums and its current slice, and, at the first call of a
-- slice, after a count taken back, in a slice spanning two buckets or while
-- an escalation is set, HGETALL (and HDEL of stale fields,
-- with a surge HINCRBY of the bucket taught, and HSET of the sums made
-- again; or, for a busy hash, DEL, HSET and PEXPIRE to write it again in
-- the order a send reads it: see conv_read); HSET of the slice's count
-- when recorded (and HSET and PEXPIRE when renewed); DEL
-- (HDEL with a surge), HSET and PEXPIRE when it trips. A surge adds no call
-- to an ordinary send.
--
-- Example (a phone with windows 1/1m, 5/1h and a gate 3/1h, its IP with
-- 20/1h, a code; the policy rendered, only the event's values as arguments):
--   EVALSHA <sha> 3 "tg:{phone:+33612345678}:sms_send" "tg:{ip:192.0.2.7}:sms_send" \
--     "tg:{phone:+33612345678}:otp" "01J...-uuid" 0 0 "9f86d0..." 5 300000 \
--     "192.0.2.7" 0
--   -> { 1,  0, 0, 0, 60000, 0, 0, 0,  0, 0, 0, 0, 0 } (packed)
-- (a prefix's conversion, alone, checked only: the pumping guard's check on
-- a cluster; min 20 events, 200,000 ppm, 12 slices of 5 minutes)
--   EVALSHA <sha> 1 "tg:{prefix:+3361234}:conversion" "-" 0 0
--   -> { 1,  0, 7, 2, 0, -1, 0 }
-- (a country's with a surge of 5 times a daily normal, alone: 600 sends,
-- 3 verified, at 30 times its normal of 20)
--   EVALSHA <sha> 1 "tg:{country:FR}:conversion" "-" 0 0
--   -> { 0,  4, 600, 3, 43200000, -1, 20000 }

-- Globals and library fields cost a table lookup at every use: bind them once.
-- On an ordinary send's path (TIME, the meters, the logs, the conversions'
-- cached sums, the code's TTL) a number that comes as a string is made a
-- number by arithmetic (`s + 0`, `(s or 0) + ...`, or the sum that uses
-- it), not by tonumber: Lua 5.1's tonumber parses a string twice
-- (lua_isnumber, then lua_tonumber), a strtod of about 500 instructions
-- each, besides the call of a C function. Every such field is one this
-- script or its siblings wrote as an integer. A conversion's first call of
-- a slice, which reads its whole hash, keeps tonumber: once a slice.
local call, tonumber, unpack, ipairs, pairs = redis.call, tonumber, unpack, ipairs, pairs
local floor, ceil, max, min = math.floor, math.ceil, math.max, math.min
local fmt, match = string.format, string.match
local KEYS, ARGV = KEYS, ARGV

--@KEEP@

local member = ARGV[1]
local gate_open = ARGV[2] == '1'
local force = ARGV[3] == '1'

local t = call('TIME')
local now = t[1] * 1000 + floor(t[2] / 1000)
-- A number handed to redis.call is formatted with "%.17g" at every call:
-- what is passed more than once is formatted once.
local now_s = fmt('%d', now)
-- Nobody waits for a call that runs after its deadline: what it would count
-- must not hold without the audit row its caller would have written.
local deadline = ARGV[#ARGV] + 0
if deadline > 0 and now > deadline then return 'late' end

-- The policy, rendered by tollgate (src/store/redis/reserve_policy.rs):
--   code_key: the code HASH in KEYS, or false;
--   level: a meter's level by the index of its window over all the
--     subjects' windows; out, the answer, made at its full size (a Lua table
--     that grows rehashes at every power of 2), and packing, its
--     struct.pack format;
--   then the locals the subjects' pieces share (sc<i>: the scores of subject
--   i's log read whole; renew<i>: its meter hash's expiry falls short).
-- Neither the subjects nor the conversions are tables: each conversion is a
-- call of conv_read (and conv_count when the event is counted) with its
-- policy as literal arguments (CONVERSIONS and COUNT below), and the
-- subjects' windows are written out as Lua, with every limit and length a
-- literal and every count, wait and verdict stored at its place in `out`
-- (src/store/redis/reserve_subjects.rs), in three pieces: DECIDE, RECORD
-- and ANSWER below. A row of 21 fields per conversion, built at every call
-- and read by index, cost Redis about 3 k instructions per conversion.
--@POLICY@


-- How long until a log holding `sc` (scores, oldest first) holds fewer than
-- limit events of the last length ms, given it holds at least limit.
local function lwait(sc, limit, length)
  local score = sc[#sc - limit + 1]
  if score == nil then return length end
  return max(score + length - now, 0)
end

-- The same for a log too large to be read whole: its limit-th newest member.
local function zwait(key, limit, length)
  local m = call('ZREVRANGE', key, limit - 1, limit - 1, 'WITHSCORES')
  local score = m[2]
  if score == nil then return length end
  return max(score + length - now, 0)
end

-- How long until a meter at level lv admits one more event.
local function mwait(lv, limit, length)
  local over = min(lv, limit * length) + length - limit * length
  if over <= 0 then return 0 end
  if limit == 0 then return length end
  return ceil(over / limit)
end

-- A meter's level now: what was set, drained by `limit` per ms since.
local function drained(lv, at, limit, length)
  if not lv or not at then return 0 end
  local elapsed = now - at
  if elapsed >= length then return 0 end
  return max(lv - max(elapsed, 0) * limit, 0)
end

-- 0. the conversions, before any window
local EMPTY = {}
local conv_blocked, conv_gated = false, false

-- Read and decide one conversion (KEYS[key]; its policy as in the header,
-- surge 0 without one), its answer into out[o + 1] .. out[o + 6] (counted:
-- -1 until conv_count); returns its slice now, that slice's events field
-- ("e:<slice>", made once) and count (0 once a block dropped it), the end
-- of its live escalation (or nil) and when its hash expires (or false).
--
-- The hash keeps its window's sums as of its current slice (see "cur" in
-- the header), so that a call reads six fields (seven with a surge) and
-- not the whole history: a country's hash after a day of sends holds some
-- forty fields, and reading and matching each of them cost Redis more than
-- all of a send's commands together. The sums are made again from the
-- whole hash, folding the stale slices in, at the first call of a slice,
-- after a count taken back (conversion_count.lua drops them), and in a
-- slice that spans two buckets of the history; the whole hash is read, and
-- the sums left alone, while an escalation is set (the escalation's check
-- reads every slice).
local function conv_read(o, key, min_events, ppm, slice_ms, slices, block_ms, surge_milli,
                         bucket_ms, escalate, span, keep_ms)
  local slice = floor(now / slice_ms)
  local oldest = slice - slices + 1
  local surge = surge_milli > 0
  local slice_s = fmt('%d', slice)
  local e_cur, s_cur = 'e:' .. slice_s, 's:' .. slice_s
  local got
  -- Not 'until': an escalation's "cur" is never a slice (see `set`), and
  -- asking for a field the hash lacks is a scan of all of it.
  if surge then
    got = call('HMGET', key, 'cur', 'exp', 'be', 'bs', e_cur, s_cur, 'nt')
  else
    got = call('HMGET', key, 'cur', 'exp', 'be', 'bs', e_cur, s_cur)
  end
  -- the normal cached holds while the slice lies in one bucket
  local cached = got[1] == slice_s and (not surge
      or floor(slice * slice_ms / bucket_ms) == floor((slice * slice_ms + slice_ms - 1) / bucket_ms))
  -- the other fields (an escalation's) and the fields to delete; with a
  -- surge the stale slices' counts (slice -> count) and the buckets: each
  -- table made only when needed, an ordinary send makes none
  local events, successes, fields, doomed, raw, exp = 0, 0, EMPTY, nil, nil, false
  -- read with the whole hash: the buckets of the history (bucket -> events)
  -- and what this call teaches them, the previous slice's events
  local buckets, taught, prev_e, first_bucket = nil, nil, 0, 0
  -- what the cache is made of: the current slice's counts, the taught events
  local cur_e, cur_s, taught_sum, normal = 0, 0, 0, 0
  if cached then
    cur_e = (got[5] or 0) + 0
    events = (got[3] or 0) + cur_e
    successes = (got[4] or 0) + (got[6] or 0)
    if surge then normal = (got[7] or 0) * span / (7 * bucket_ms) end
    exp = got[2] and got[2] + 0
  else
    raw = call('HGETALL', key)
    local old_e, old_s = nil, nil
    local prev_s = fmt('%d', slice - 1)
    for j = 1, #raw, 2 do
      local kind, n = match(raw[j], '^([esn]):(%d+)$')
      if kind == nil then
        if fields == EMPTY then fields = {} end
        fields[raw[j]] = raw[j + 1]
      elseif kind == 'n' then
        buckets = buckets or {}
        buckets[tonumber(n)] = tonumber(raw[j + 1])
      elseif tonumber(n) > slice then
        -- a slice "after" now: counted under a longer sms.pumping.window
        -- (slices numbered from a longer length): stale, and teaches nothing
        doomed = doomed or {}
        doomed[#doomed + 1] = raw[j]
      elseif tonumber(n) < oldest then
        doomed = doomed or {}
        doomed[#doomed + 1] = raw[j]
        if surge and kind == 'e' then
          old_e = old_e or {}
          old_e[n] = tonumber(raw[j + 1])
        elseif surge then
          old_s = old_s or {}
          old_s[n] = tonumber(raw[j + 1])
        end
      elseif kind == 'e' then
        events = events + tonumber(raw[j + 1])
        if n == slice_s then cur_e = tonumber(raw[j + 1])
        elseif n == prev_s then prev_e = tonumber(raw[j + 1]) end
      else
        successes = successes + tonumber(raw[j + 1])
        if n == slice_s then cur_s = tonumber(raw[j + 1]) end
      end
    end
    if surge then
      -- teach the normal what left the window, then read the last seven buckets
      for n, e in pairs(old_e or EMPTY) do
        if e > 0 and ((old_s or EMPTY)[n] or 0) * 1000000 >= ppm * e then
          local b = floor(tonumber(n) * slice_ms / bucket_ms)
          taught = taught or {}
          taught[b] = (taught[b] or 0) + e
        end
      end
      if taught then
        buckets = buckets or {}
        for b, e in pairs(taught) do buckets[b] = (buckets[b] or 0) + e end
      end
      local current = floor(now / bucket_ms)
      first_bucket = current - 7
      for b, e in pairs(buckets or EMPTY) do
        -- a bucket "after" now: taught under a longer country_history
        if b < first_bucket or b > current then
          doomed = doomed or {}
          doomed[#doomed + 1] = 'n:' .. fmt('%d', b)
        elseif b < current then
          taught_sum = taught_sum + e
        end
      end
      normal = taught_sum * span / (7 * bucket_ms)
    end
    exp = tonumber(fields['exp']) or false
  end
  local normal_milli = floor(normal * 1000 + 0.5)
  local until_at = fields['until']
  if until_at then until_at = until_at + 0 end
  if until_at and until_at <= now then
    doomed = doomed or {}
    for _, f in ipairs({ 'until', 'events', 'successes', 'shadow', 'level', 'normal', 'from' }) do
      doomed[#doomed + 1] = f
    end
    until_at = nil
  end
  local verdict, ev, su, retry = 0, events, successes, 0
  local shadow = fields['shadow'] == '1'
  -- the escalation to set, if any: { level, events, successes, from }
  local set = nil
  if until_at and (force or not shadow) then
    retry = until_at - now
    ev = tonumber(fields['events']) or 0
    su = tonumber(fields['successes']) or 0
    normal_milli = tonumber(fields['normal']) or 0
    if fields['level'] ~= 'c' then
      verdict = 1
    else
      verdict = 3
      if escalate and shadow == force then
        -- the slices from the challenge's first on, and every live slice
        local from = tonumber(fields['from']) or 0
        -- a first slice after the next was numbered under a longer window:
        -- counted from this one
        if from > slice + 1 then from = slice end
        local since, passed, live = 0, 0, {}
        for j = 1, #raw, 2 do
          local kind, n = match(raw[j], '^([es]):(%d+)$')
          if kind and tonumber(n) >= oldest and tonumber(n) <= slice then
            live[#live + 1] = raw[j]
            if tonumber(n) >= from then
              if kind == 'e' then since = since + tonumber(raw[j + 1])
              else passed = passed + tonumber(raw[j + 1]) end
            end
          end
        end
        if since >= min_events and passed * 1000000 < ppm * since
            and since * 1000 >= surge_milli * normal then
          set = { 'b', since, passed, from }
          doomed = doomed or {}
          for _, f in ipairs(live) do doomed[#doomed + 1] = f end
          normal_milli = floor(normal * 1000 + 0.5)
        end
      end
    end
  elseif events >= min_events and successes * 1000000 < ppm * events
      and (not surge or events * 1000 >= surge_milli * normal) then
    shadow = force
    if surge then
      set = { 'c', events, successes, slice + 1 }
    else
      set = { 'b', events, successes, 0 }
    end
  end
  if set and not surge then
    call('DEL', key)
    doomed = nil
  end
  -- the sums as of this slice, made again (none for a hash without an
  -- expiry yet: its first count sets one; none while an escalation is set,
  -- which reads the whole hash anyway)
  local resum = not cached and not set and not until_at and exp
  if resum and prev_e >= 16 and got[1] ~= slice_s then
    -- The hash is a listpack: a field is found by a scan from its first,
    -- and the fields a send reads and writes are its sums and its current
    -- slice's counts, which a hash made field by field keeps last, after
    -- every live slice and bucket (some forty fields in a country's hash:
    -- 17 k of Redis's instructions a send). A hash busy enough to be read
    -- again within the slice (16 events in the slice before) is written
    -- again here, those fields first: the sums, the current slice's counts
    -- (made 0 when absent: a zero count is no count wherever one is read),
    -- then the live slices, the buckets (with what this call taught them)
    -- and any other field; its expiry stays "exp". A quiet hash, read
    -- about once a slice, keeps its order: the rewrite would cost it more
    -- than the scans. Once a slice: in a slice that spans two buckets
    -- every send reads the whole hash, and only the first, which finds
    -- "cur" stale, writes it again.
    local f = { 'cur', slice_s, 'exp', fmt('%d', exp), 'be', fmt('%d', events - cur_e),
      'bs', fmt('%d', successes - cur_s) }
    if surge then f[#f + 1] = 'nt'; f[#f + 1] = fmt('%d', taught_sum) end
    f[#f + 1] = e_cur; f[#f + 1] = fmt('%d', cur_e)
    f[#f + 1] = s_cur; f[#f + 1] = fmt('%d', cur_s)
    -- the sums, written above, and an ended escalation's fields (doomed);
    -- without a surge "nt" is left as it was, as the sums' HSET leaves it
    local drop = { cur = 1, exp = 1, be = 1, bs = 1, nt = surge and 1 or nil, ['until'] = 1,
      events = 1, successes = 1, shadow = 1, level = 1, normal = 1, from = 1 }
    for j = 1, #raw, 2 do
      local name = raw[j]
      local kind, n = match(name, '^([esn]):(%d+)$')
      if kind == nil then
        if not drop[name] then f[#f + 1] = name; f[#f + 1] = raw[j + 1] end
      elseif kind ~= 'n' and n ~= slice_s and tonumber(n) >= oldest and tonumber(n) <= slice then
        f[#f + 1] = name; f[#f + 1] = raw[j + 1]
      end
    end
    local last_bucket = bucket_ms > 0 and floor(now / bucket_ms) or math.huge
    for b, e in pairs(buckets or EMPTY) do
      if b >= first_bucket and b <= last_bucket then f[#f + 1] = 'n:' .. fmt('%d', b); f[#f + 1] = fmt('%d', e) end
    end
    call('DEL', key)
    call('HSET', key, unpack(f))
    call('PEXPIRE', key, fmt('%d', max(exp - now, 1)))
  else
    for b, e in pairs(taught or EMPTY) do call('HINCRBY', key, 'n:' .. fmt('%d', b), e) end
    if doomed then call('HDEL', key, unpack(doomed)) end
    if resum and surge then
      call('HSET', key, 'cur', slice_s, 'be', fmt('%d', events - cur_e),
        'bs', fmt('%d', successes - cur_s), 'nt', fmt('%d', taught_sum))
    elseif resum then
      call('HSET', key, 'cur', slice_s, 'be', fmt('%d', events - cur_e),
        'bs', fmt('%d', successes - cur_s))
    end
  end
  if set then
    -- a block drops the slices (all of the hash without a surge)
    if set[1] == 'b' then cur_e = 0 end
    verdict = set[1] == 'b' and 2 or 4
    ev, su, retry = set[2], set[3], block_ms
    until_at = now + block_ms
    local flag = shadow and '1' or '0'
    local keep = block_ms
    if surge and keep_ms > keep then keep = keep_ms end
    exp = now + keep
    if surge then
      -- "cur" no slice: the sums are not read while the escalation lives
      call('HSET', key, 'until', fmt('%d', until_at), 'events', set[2],
        'successes', set[3], 'shadow', flag, 'level', set[1],
        'normal', fmt('%d', normal_milli), 'from', fmt('%d', set[4]), 'exp', fmt('%d', exp),
        'cur', '-')
    else
      call('HSET', key, 'until', fmt('%d', until_at), 'events', set[2],
        'successes', set[3], 'shadow', flag, 'exp', fmt('%d', exp))
    end
    call('PEXPIRE', key, fmt('%d', keep))
  end
  if verdict == 1 or verdict == 2 then conv_blocked = true end
  if (verdict == 3 or verdict == 4) and not gate_open then conv_gated = true end
  out[o + 1], out[o + 2], out[o + 3] = verdict, ev, su
  out[o + 4], out[o + 5], out[o + 6] = retry, -1, normal_milli
  return slice, e_cur, cur_e, until_at, exp
end

-- Count the event in conversion KEYS[key]'s current slice (as conv_read
-- found it: slice, its field e_cur and count cur_e, until_at, exp), its
-- hash kept keep_ms, or to the end of its escalation when later. An HSET
-- of the count read, not an HINCRBY, which finds the field twice (to read
-- it, then to write it): in a listpack each is a scan of the hash, and
-- the current slice's field is its last.
local function conv_count(o, key, slice, e_cur, cur_e, until_at, exp, keep_ms)
  call('HSET', key, e_cur, fmt('%d', cur_e + 1))
  local keep = keep_ms
  if until_at and until_at - now > keep then keep = until_at - now end
  if not exp or exp < now + keep then
    keep = keep + floor(keep / 8)
    call('HSET', key, 'exp', fmt('%d', now + keep))
    call('PEXPIRE', key, fmt('%d', keep))
  end
  out[o + 5] = slice
end

-- every conversion's conv_read
--@CONVERSIONS@
-- A blocking conversion answers before any window is read.
local skip = conv_blocked and not force

-- 1. read and decide every subject
local all_allowed = true
--@DECIDE@

-- 2. record everywhere, or nowhere
local recorded = (all_allowed and not conv_blocked and not conv_gated) or force
if recorded then
  -- every counting conversion's conv_count
--@COUNT@
--@RECORD@
  if code_key then
    -- u = 0: a counted send's code, over whatever an exempt one left
    -- (otp_put.lua); kept: the live codes it replaces (otp_keep.lua)
    -- A first send finds no hash, and reads nothing more: EXISTS costs a
    -- quarter of an HMGET of eight fields (callgrind).
    local code_exp = fmt('%d', now + ARGV[6])
    if call('EXISTS', code_key) == 1 then
      local h = call('HMGET', code_key, 'mac', 'left', 'lo', 'n', 'exp', 'ne', 'u', 'kept')
      call('HSET', code_key, 'mac', ARGV[4], 'left', ARGV[5], 'lo', ARGV[5], 'n', ARGV[7],
        'exp', code_exp, 'ne', code_exp, 'u', 0, 'kept', kept_after(h, now))
    else
      call('HSET', code_key, 'mac', ARGV[4], 'left', ARGV[5], 'lo', ARGV[5], 'n', ARGV[7],
        'exp', code_exp, 'ne', code_exp, 'u', 0)
    end
    call('PEXPIRE', code_key, ARGV[6])
  end
end

-- 3. answer: the subjects' counts and verdicts are in place; their next
-- retry is from the counts after this call
out[1] = recorded and 1 or 0
local added = recorded and 1 or 0
--@ANSWER@
return struct.pack(packing, unpack(out))
