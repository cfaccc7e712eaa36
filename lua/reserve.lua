-- reserve.lua: offer one event to the sliding windows of one or more subjects,
-- all or nothing, and store a one-time code with it, atomically.
--
-- KEYS        per subject: its window ZSET (score = event time in ms, member =
--             event id), then, when it has meter windows, its meter HASH
--             (field "<limit>/<length>" = level, "<limit>/<length>:t" = when
--             the level was last set, in ms)
--             then per conversion: its conversion HASH (field "e:<slice>" =
--             events and "s:<slice>" = successes counted in that slice; while
--             blocked "until" (ms), "events", "successes", "shadow" (1/0))
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
--         when it is recorded; 0: check only, the caller counts it later)
-- then, when the code's key is given: mac, attempts allowed, code ttl in ms
--
-- Returns an array of integers:
--   { recorded, then per subject:
--     verdict, window, retry_after_ms, next_retry_after_ms, count_1, ..., count_n,
--     and, only for a subject with an observe window, observed_wait_1, ..., observed_wait_n,
--     then per conversion: verdict, events, successes, retry_after_ms, slice }
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
--   call (blocked for block_ms on the figures given); otherwise events and
--   successes are the window's before this event. slice is where the event
--   was counted (when recorded), else -1.
--
-- Conversions come first: a live block (an enforced one; with force a shadow
-- one too) refuses; else the window's slices are summed (stale ones
-- dropped), and events >= min_events with successes * 10^6 < min_ratio_ppm *
-- events blocks the subject: its counts are replaced by the block (shadow
-- when force), which expires after block_ms. When a conversion refuses and
-- not force, no window is read and nothing else is written (each subject's
-- answer is then 0s). When the event is recorded it is counted in the
-- current slice of every conversion that asks it (expiry: the window, or the
-- block's end when later).
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
-- only meter windows never touches its ZSET. Per conversion: HGETALL (and
-- HDEL of stale slices, once a slice), HINCRBY and PEXPIRE when recorded;
-- DEL, HSET and PEXPIRE when it trips.
--
-- Example (a phone and its IP, with a code):
--   EVALSHA <sha> 3 "tg:{phone:+33612345678}:sms_send" "tg:{ip:192.0.2.7}:sms_send" \
--     "tg:{phone:+33612345678}:otp" "01J...-uuid" 0 0 2 \
--     3  1 60000 0  5 3600000 0  3 3600000 1   1  20 3600000 0   0   "9f86d0..." 5 300000
--   -> { 1,  0, 0, 0, 60000, 0, 0, 0,  0, 0, 0, 0, 0 }
-- (a prefix's conversion, alone: the pumping guard's check on a cluster)
--   EVALSHA <sha> 1 "tg:{prefix:+3361234}:conversion" "-" 0 0 0 \
--     1  20 200000 300000 12 43200000 0
--   -> { 1,  0, 7, 2, 0, -1 }

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
  convs[i] = { key = KEYS[k], min = tonumber(ARGV[a]), ppm = tonumber(ARGV[a + 1]),
    slice_ms = tonumber(ARGV[a + 2]), slices = tonumber(ARGV[a + 3]),
    block_ms = tonumber(ARGV[a + 4]), count = ARGV[a + 5] == '1', counted = -1 }
  k = k + 1
  a = a + 6
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
local BLOCK_FIELDS = { 'until', 'events', 'successes', 'shadow' }
local conv_refused = false
for _, cv in ipairs(convs) do
  cv.slice = math.floor(now / cv.slice_ms)
  local oldest = cv.slice - cv.slices + 1
  local raw = redis.call('HGETALL', cv.key)
  local events, successes, stale, block = 0, 0, {}, {}
  for j = 1, #raw, 2 do
    local kind, slice = string.match(raw[j], '^([es]):(%d+)$')
    if kind == nil then
      block[raw[j]] = raw[j + 1]
    elseif tonumber(slice) < oldest then
      stale[#stale + 1] = raw[j]
    elseif kind == 'e' then
      events = events + tonumber(raw[j + 1])
    else
      successes = successes + tonumber(raw[j + 1])
    end
  end
  cv.until_at = tonumber(block['until'])
  if cv.until_at and cv.until_at <= now then
    for _, f in ipairs(BLOCK_FIELDS) do stale[#stale + 1] = f end
    cv.until_at = nil
  end
  cv.verdict, cv.events, cv.successes, cv.retry = 0, events, successes, 0
  if cv.until_at and (force or block['shadow'] ~= '1') then
    cv.verdict, cv.retry = 1, cv.until_at - now
    cv.events = tonumber(block['events']) or 0
    cv.successes = tonumber(block['successes']) or 0
  elseif events >= cv.min and successes * 1000000 < cv.ppm * events then
    cv.verdict, cv.retry, cv.until_at = 2, cv.block_ms, now + cv.block_ms
    redis.call('DEL', cv.key)
    redis.call('HSET', cv.key, 'until', string.format('%d', cv.until_at),
      'events', events, 'successes', successes, 'shadow', force and '1' or '0')
    redis.call('PEXPIRE', cv.key, string.format('%d', cv.block_ms))
    stale = {}
  end
  if #stale > 0 then redis.call('HDEL', cv.key, unpack(stale)) end
  if cv.verdict ~= 0 then conv_refused = true end
end
-- A refusing conversion answers before any window is read.
local skip = conv_refused and not force

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
local recorded = (all_allowed and not conv_refused) or force
if recorded then
  for _, cv in ipairs(convs) do
    if cv.count then
      redis.call('HINCRBY', cv.key, 'e:' .. cv.slice, 1)
      local keep = cv.slices * cv.slice_ms
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
end
return out
