-- reserve.lua: offer one event to the sliding windows of one or more subjects,
-- all or nothing, and store a one-time code with it, atomically.
--
-- KEYS        per subject: its window ZSET (score = event time in ms, member =
--             event id), then, when it has meter windows, its meter HASH
--             (field "<limit>/<length>" = level, "<limit>/<length>:t" = when
--             the level was last set, in ms)
--             then per conversion: its conversion HASH (field "e:<slice>" =
--             events and "s:<slice>" = successes counted in that slice; with
--             a surge "n:<bucket>" = events taught to the normal in that
--             bucket of the history; while challenged or blocked "until" (ms),
--             "events", "successes", "shadow" (1/0), and with a surge "level"
--             ("c" challenge, "b" block; absent: block), "normal" (in
--             thousandths) and "from" (the first slice under the challenge))
-- KEYS[last]  optional: the subject's code HASH (mac, left, exp), written when
--             the event is recorded
-- ARGV[1] member: unique id of this event
-- ARGV[2] gate_open: 1 when the request passed a captcha, else 0
-- ARGV[3] force: 1 to record the event even when a window refuses it (shadow mode)
-- ARGV[4] s: number of subjects; then per subject: n (its number of windows)
--         and n triples limit, window length in ms, kind: the mode (0 = enforce,
--         1 = gate, 2 = observe: counted, never refuses; a rule in shadow),
--         plus 4 when the window is a meter (GCRA) rather than a sliding log
-- then c: number of conversions; per conversion: min_events, min_ratio_ppm
--         (successes per million events), slice_ms, slices (how many a count
--         sums, the current one included), block_ms, count (1: count the event
--         when it is recorded; 0: check only, the caller counts it later),
--         surge (the multiple of the normal a surge needs, in thousandths;
--         0: no surge, a block at once, and nothing follows), then with a
--         surge bucket_ms (a seventh of the history) and escalate (1: a
--         challenge may turn into a block). Arguments cost: a conversion
--         without a surge takes one more than a plain count.
-- then, when the code's key is given: mac, attempts allowed, code ttl in ms
--
-- Returns an array of integers:
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
-- while now - w < t. A subject keeps at most max(limit) newest members and
-- expires after its longest window.
--
-- A meter (GCRA as a leaky bucket) with limit L and length W keeps a level
-- that each event raises by W and that drains by L per ms, so it admits L
-- events at once and then one per W/L ms: the level is at most L*W, its count
-- is ceil(level / W), it is full when level > (L-1)*W, and its wait is
-- ceil((level + W - L*W) / L). A forced event (shadow mode) raises it to at
-- most L*W, as a log keeps at most its limit. All integers (start-up keeps
-- L*W < 2^53).
--
-- Commands per call: TIME; per subject one read (ZRANGE of the whole set when
-- max(limit) <= 32, else one ZCOUNT per window), plus one ZREVRANGE per full
-- window of a large set, and one HMGET of its meters; when recorded, per
-- subject ZADD and PEXPIRE (and ZREMRANGEBYRANK when the set is full, always
-- for a large set), HSET and PEXPIRE of its meters, and HSET and PEXPIRE for
-- the code. A refused request reads and writes nothing else. A subject with
-- only meter windows never touches its ZSET. Per conversion: HGETALL (and,
-- once a slice, HDEL of stale fields and with a surge HINCRBY of the bucket
-- taught), HINCRBY and PEXPIRE when recorded; DEL (HDEL with a surge), HSET
-- and PEXPIRE when it trips. A surge adds no call to an ordinary send.
--
-- Example (a phone and its IP, with a code):
--   EVALSHA <sha> 3 "tg:{phone:+33612345678}:sms_send" "tg:{ip:192.0.2.7}:sms_send" \
--     "tg:{phone:+33612345678}:otp" "01J...-uuid" 0 0 2 \
--     3  1 60000 0  5 3600000 0  3 3600000 1   1  20 3600000 0   0   "9f86d0..." 5 300000
--   -> { 1,  0, 0, 0, 60000, 0, 0, 0,  0, 0, 0, 0, 0 }
-- (a prefix's conversion, alone: the pumping guard's check on a cluster)
--   EVALSHA <sha> 1 "tg:{prefix:+3361234}:conversion" "-" 0 0 0 \
--     1  20 200000 300000 12 43200000 0 0
--   -> { 1,  0, 7, 2, 0, -1, 0 }
-- (a country's, alone: 600 sends, 3 verified, at 30 times its normal of 20)
--   EVALSHA <sha> 1 "tg:{country:FR}:conversion" "-" 0 0 0 \
--     1  500 200000 300000 12 43200000 0 5000 86400000 1
--   -> { 0,  4, 600, 3, 43200000, -1, 20000 }

local SMALL = 32

local member = ARGV[1]
local gate_open = ARGV[2] == '1'
local force = ARGV[3] == '1'
local s = tonumber(ARGV[4])

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
-- Numbers handed to redis.call are formatted each time: format `now` once.
local now_s = string.format('%d', now)

-- Parse the subjects' windows.
local subjects = {}
local a, k = 5, 1
for i = 1, s do
  local n = tonumber(ARGV[a])
  local sub = { key = KEYS[k], n = n, limits = {}, lengths = {}, modes = {}, meters = {},
    stamps = {}, longest = 0, keep = 0, logs = 0, meter_longest = 0, observes = false }
  k = k + 1
  for w = 1, n do
    local limit, length = tonumber(ARGV[a + 3 * w - 2]), tonumber(ARGV[a + 3 * w - 1])
    local kind = tonumber(ARGV[a + 3 * w])
    sub.limits[w], sub.lengths[w], sub.modes[w] = limit, length, kind % 4
    if kind % 4 == 2 then sub.observes = true end
    if kind >= 4 then
      sub.meters[w] = ARGV[a + 3 * w - 2] .. '/' .. ARGV[a + 3 * w - 1]
      sub.stamps[w] = sub.meters[w] .. ':t'
      if length > sub.meter_longest then sub.meter_longest = length end
    else
      sub.logs = sub.logs + 1
      if length > sub.longest then sub.longest, sub.longest_s = length, ARGV[a + 3 * w - 1] end
      if limit > sub.keep then sub.keep = limit end
    end
  end
  if sub.meter_longest > 0 then
    sub.mkey = KEYS[k]
    k = k + 1
  end
  sub.small = sub.keep <= SMALL
  subjects[i] = sub
  a = a + 1 + 3 * n
end

-- Parse the conversions.
local convs = {}
local c = tonumber(ARGV[a])
a = a + 1
for i = 1, c do
  -- every field the script sets is named here, so the table is sized once
  local cv = { key = KEYS[k], min = tonumber(ARGV[a]), ppm = tonumber(ARGV[a + 1]),
    slice_ms = tonumber(ARGV[a + 2]), slices = tonumber(ARGV[a + 3]),
    block_ms = tonumber(ARGV[a + 4]), count = ARGV[a + 5] == '1', counted = -1,
    surge = 0, bucket = 0, escalate = false, span = 0, keep = 0, slice = 0, normal = 0,
    until_at = false, verdict = 0, events = 0, successes = 0, retry = 0 }
  cv.span = cv.slices * cv.slice_ms
  cv.keep = cv.span
  if ARGV[a + 6] ~= '0' then
    cv.surge, cv.bucket, cv.escalate = tonumber(ARGV[a + 6]), tonumber(ARGV[a + 7]), ARGV[a + 8] == '1'
    cv.keep = cv.span + 8 * cv.bucket
    a = a + 2
  end
  a = a + 7
  convs[i] = cv
  k = k + 1
end

-- The k-th newest member's score (k >= 1), or nil when there are fewer.
local function kth_newest(sub, k)
  if sub.small then return sub.scores[#sub.scores - k + 1] end
  local m = redis.call('ZREVRANGE', sub.key, k - 1, k - 1, 'WITHSCORES')
  return tonumber(m[2])
end

-- How long until window w holds fewer than its limit, given it holds count
-- (a meter: given `extra` more events than its level holds now).
local function wait(sub, w, count, extra)
  local limit, length = sub.limits[w], sub.lengths[w]
  if sub.meters[w] then
    local level = math.min(sub.levels[w] + extra * length, limit * length)
    local over = level + length - limit * length
    if over <= 0 then return 0 end
    if limit == 0 then return length end
    return math.ceil(over / limit)
  end
  if count < limit then return 0 end
  if limit == 0 then return length end
  local score = kth_newest(sub, limit)
  if score == nil then return length end
  return math.max(score + length - now, 0)
end

-- A meter's level now: what was set, drained by `limit` per ms since.
local function drained(level, at, limit, length)
  if level == nil or at == nil then return 0 end
  local elapsed = now - at
  if elapsed >= length then return 0 end
  return math.max(level - math.max(elapsed, 0) * limit, 0)
end

-- 0. the conversions, before any window
local EMPTY = {}
local conv_blocked, conv_gated = false, false
for _, cv in ipairs(convs) do
  cv.slice = math.floor(now / cv.slice_ms)
  local oldest = cv.slice - cv.slices + 1
  local surge = cv.surge > 0
  local raw = redis.call('HGETALL', cv.key)
  -- the other fields (an escalation's) and the fields to delete; with a
  -- surge the stale slices' counts (slice -> count) and the buckets: each
  -- table made only when needed, an ordinary send makes none
  local events, successes, fields, doomed, old_e, old_s, buckets = 0, 0, EMPTY, {}, nil, nil, nil
  for j = 1, #raw, 2 do
    local kind, n = string.match(raw[j], '^([esn]):(%d+)$')
    if kind == nil then
      if fields == EMPTY then fields = {} end
      fields[raw[j]] = raw[j + 1]
    elseif kind == 'n' then
      buckets = buckets or {}
      buckets[tonumber(n)] = tonumber(raw[j + 1])
    elseif tonumber(n) < oldest then
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
    else
      successes = successes + tonumber(raw[j + 1])
    end
  end
  local normal = 0
  if surge then
    -- teach the normal what left the window, then read the last seven buckets
    local taught = nil
    for n, e in pairs(old_e or EMPTY) do
      if e > 0 and ((old_s or EMPTY)[n] or 0) * 1000000 >= cv.ppm * e then
        local b = math.floor(tonumber(n) * cv.slice_ms / cv.bucket)
        taught = taught or {}
        taught[b] = (taught[b] or 0) + e
      end
    end
    if taught then
      buckets = buckets or {}
      for b, e in pairs(taught) do
        redis.call('HINCRBY', cv.key, 'n:' .. string.format('%d', b), e)
        buckets[b] = (buckets[b] or 0) + e
      end
    end
    local current, sum = math.floor(now / cv.bucket), 0
    for b, e in pairs(buckets or EMPTY) do
      if b < current - 7 then
        doomed[#doomed + 1] = 'n:' .. string.format('%d', b)
      elseif b < current then
        sum = sum + e
      end
    end
    normal = sum * cv.span / (7 * cv.bucket)
    cv.normal = math.floor(normal * 1000 + 0.5)
  else
    cv.normal = 0
  end
  cv.until_at = tonumber(fields['until'])
  if cv.until_at and cv.until_at <= now then
    for _, f in ipairs({ 'until', 'events', 'successes', 'shadow', 'level', 'normal', 'from' }) do
      doomed[#doomed + 1] = f
    end
    cv.until_at = nil
  end
  cv.verdict, cv.events, cv.successes, cv.retry = 0, events, successes, 0
  local shadow = fields['shadow'] == '1'
  -- the escalation to set, if any: { level, events, successes, from }
  local set = nil
  if cv.until_at and (force or not shadow) then
    cv.retry = cv.until_at - now
    cv.events = tonumber(fields['events']) or 0
    cv.successes = tonumber(fields['successes']) or 0
    cv.normal = tonumber(fields['normal']) or 0
    if fields['level'] ~= 'c' then
      cv.verdict = 1
    else
      cv.verdict = 3
      if cv.escalate and shadow == force then
        -- the slices from the challenge's first on, and every live slice
        local from = tonumber(fields['from']) or 0
        local since, passed, live = 0, 0, {}
        for j = 1, #raw, 2 do
          local kind, n = string.match(raw[j], '^([es]):(%d+)$')
          if kind and tonumber(n) >= oldest then
            live[#live + 1] = raw[j]
            if tonumber(n) >= from then
              if kind == 'e' then since = since + tonumber(raw[j + 1])
              else passed = passed + tonumber(raw[j + 1]) end
            end
          end
        end
        if since >= cv.min and passed * 1000000 < cv.ppm * since
            and since * 1000 >= cv.surge * normal then
          set = { 'b', since, passed, from }
          for _, f in ipairs(live) do doomed[#doomed + 1] = f end
          cv.normal = math.floor(normal * 1000 + 0.5)
        end
      end
    end
  elseif events >= cv.min and successes * 1000000 < cv.ppm * events
      and (not surge or events * 1000 >= cv.surge * normal) then
    shadow = force
    if surge then
      set = { 'c', events, successes, cv.slice + 1 }
    else
      set = { 'b', events, successes, 0 }
    end
  end
  if set and not surge then
    redis.call('DEL', cv.key)
    doomed = {}
  end
  if #doomed > 0 then redis.call('HDEL', cv.key, unpack(doomed)) end
  if set then
    cv.verdict = set[1] == 'b' and 2 or 4
    cv.events, cv.successes, cv.retry = set[2], set[3], cv.block_ms
    cv.until_at = now + cv.block_ms
    local flag = shadow and '1' or '0'
    local keep = cv.block_ms
    if surge then
      redis.call('HSET', cv.key, 'until', string.format('%d', cv.until_at), 'events', set[2],
        'successes', set[3], 'shadow', flag, 'level', set[1],
        'normal', string.format('%d', cv.normal), 'from', string.format('%d', set[4]))
      if cv.keep > keep then keep = cv.keep end
    else
      redis.call('HSET', cv.key, 'until', string.format('%d', cv.until_at), 'events', set[2],
        'successes', set[3], 'shadow', flag)
    end
    redis.call('PEXPIRE', cv.key, string.format('%d', keep))
  end
  if cv.verdict == 1 or cv.verdict == 2 then conv_blocked = true end
  if (cv.verdict == 3 or cv.verdict == 4) and not gate_open then conv_gated = true end
end
-- A blocking conversion answers before any window is read.
local skip = conv_blocked and not force

-- 1. read and decide every subject
local all_allowed = true
for _, sub in ipairs(subjects) do
  if skip then break end
  sub.counts, sub.levels = {}, {}
  if sub.logs > 0 and sub.small then
    local raw = redis.call('ZRANGE', sub.key, 0, -1, 'WITHSCORES')
    local scores = {}
    for j = 2, #raw, 2 do scores[#scores + 1] = tonumber(raw[j]) end
    sub.scores = scores
  end
  if sub.mkey then
    local fields = {}
    for w = 1, sub.n do
      if sub.meters[w] then
        fields[#fields + 1] = sub.meters[w]
        fields[#fields + 1] = sub.stamps[w]
      end
    end
    local raw = redis.call('HMGET', sub.mkey, unpack(fields))
    local j = 1
    for w = 1, sub.n do
      if sub.meters[w] then
        local level = drained(tonumber(raw[j]), tonumber(raw[j + 1]), sub.limits[w], sub.lengths[w])
        sub.levels[w] = level
        sub.counts[w] = math.ceil(level / sub.lengths[w])
        j = j + 2
      end
    end
  end
  for w = 1, sub.n do
    if sub.meters[w] then
      -- counted above
    elseif sub.small then
      local floor, c = now - sub.lengths[w], 0
      for j = #sub.scores, 1, -1 do
        if sub.scores[j] > floor then c = c + 1 else break end
      end
      sub.counts[w] = c
    else
      sub.counts[w] = redis.call('ZCOUNT', sub.key, string.format('(%d', now - sub.lengths[w]), '+inf')
    end
  end

  sub.verdict, sub.window, sub.retry, sub.observed = 0, 0, 0, {}
  for w = 1, sub.n do
    sub.observed[w] = 0
    if sub.modes[w] == 2 and sub.counts[w] >= sub.limits[w] then
      sub.observed[w] = wait(sub, w, sub.counts[w], 0)
    end
    if sub.modes[w] == 0 and sub.counts[w] >= sub.limits[w] then
      local ww = wait(sub, w, sub.counts[w], 0)
      if sub.verdict ~= 1 or ww > sub.retry then
        sub.verdict, sub.window, sub.retry = 1, w - 1, ww
      end
    end
  end
  if sub.verdict == 0 and not gate_open then
    for w = 1, sub.n do
      if sub.modes[w] == 1 and sub.counts[w] >= sub.limits[w] then
        sub.verdict, sub.window = 2, w - 1
        break
      end
    end
  end
  if sub.verdict ~= 0 then all_allowed = false end
end

-- 2. record everywhere, or nowhere
local recorded = (all_allowed and not conv_blocked and not conv_gated) or force
if recorded then
  for _, cv in ipairs(convs) do
    if cv.count then
      redis.call('HINCRBY', cv.key, 'e:' .. cv.slice, 1)
      local keep = cv.keep
      if cv.until_at and cv.until_at - now > keep then keep = cv.until_at - now end
      redis.call('PEXPIRE', cv.key, string.format('%d', keep))
      cv.counted = cv.slice
    end
  end
  for _, sub in ipairs(subjects) do
    if sub.logs > 0 then
      redis.call('ZADD', sub.key, now_s, member)
      if sub.small then
        sub.scores[#sub.scores + 1] = now
        if #sub.scores > sub.keep then
          redis.call('ZREMRANGEBYRANK', sub.key, 0, -(sub.keep + 1))
        end
      else
        redis.call('ZREMRANGEBYRANK', sub.key, 0, -(sub.keep + 1))
      end
      redis.call('PEXPIRE', sub.key, sub.longest_s)
    end
    if sub.mkey then
      local fields = {}
      for w = 1, sub.n do
        if sub.meters[w] then
          local level = math.min(sub.levels[w] + sub.lengths[w], sub.limits[w] * sub.lengths[w])
          fields[#fields + 1] = sub.meters[w]
          fields[#fields + 1] = string.format('%d', level)
          fields[#fields + 1] = sub.stamps[w]
          fields[#fields + 1] = now_s
        end
      end
      redis.call('HSET', sub.mkey, unpack(fields))
      redis.call('PEXPIRE', sub.mkey, string.format('%d', sub.meter_longest))
    end
  end
  local code_key = KEYS[k]
  if code_key then
    local ttl = tonumber(ARGV[a + 2])
    redis.call('HSET', code_key, 'mac', ARGV[a], 'left', ARGV[a + 1], 'exp', string.format('%d', now + ttl))
    redis.call('PEXPIRE', code_key, ARGV[a + 2])
  end
end

-- 3. answer, with the next retry from the counts after this call
local out = { recorded and 1 or 0 }
for _, sub in ipairs(subjects) do
  local added = recorded and 1 or 0
  local next_retry = 0
  if skip then
    sub.verdict, sub.window, sub.retry, sub.counts, sub.observed = 0, 0, 0, {}, {}
    for w = 1, sub.n do sub.counts[w], sub.observed[w] = 0, 0 end
  end
  for w = 1, sub.n do
    if sub.modes[w] == 0 and not skip then
      local ww = wait(sub, w, sub.counts[w] + added, added)
      if ww > next_retry then next_retry = ww end
    end
  end
  out[#out + 1] = sub.verdict
  out[#out + 1] = sub.window
  out[#out + 1] = sub.retry
  out[#out + 1] = next_retry
  for w = 1, sub.n do out[#out + 1] = sub.counts[w] end
  if sub.observes then
    for w = 1, sub.n do out[#out + 1] = sub.observed[w] end
  end
end
for _, cv in ipairs(convs) do
  out[#out + 1] = cv.verdict
  out[#out + 1] = cv.events
  out[#out + 1] = cv.successes
  out[#out + 1] = cv.retry
  out[#out + 1] = cv.counted
  out[#out + 1] = cv.normal
end
return out
