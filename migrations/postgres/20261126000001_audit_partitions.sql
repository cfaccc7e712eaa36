-- The trail at attack scale (docs/audit.md "Partitions and rollups").
--
-- 1. audit_events becomes partitioned by day of occurred_at (UTC), so that
--    retention drops whole days instead of deleting rows. A partitioned
--    table's primary key must hold the partition key: (occurred_at, id).
--    Existing rows are copied into daily partitions and the old table is
--    dropped; the service creates the partitions of the retention period and
--    some days ahead at start-up (and any missing day on demand).
-- 2. Rollups written in the same transaction as the rows they count:
--    audit_counts (rows per 5 minutes, action, decision, shadow) and
--    audit_top / audit_top_error (bounded Misra-Gries summaries of the refused
--    subjects, client IPs and phone prefixes per 5 minutes, hour and day).

ALTER TABLE audit_events RENAME TO audit_events_unpartitioned;
ALTER INDEX audit_events_pkey RENAME TO audit_events_unpartitioned_pkey;
DROP INDEX IF EXISTS audit_events_newest;
DROP INDEX IF EXISTS audit_events_subject;
DROP INDEX IF EXISTS audit_events_ip;
DROP INDEX IF EXISTS audit_events_locks;
DROP INDEX IF EXISTS audit_events_actor;

CREATE TABLE audit_events (
    id             UUID        NOT NULL,     -- UUIDv7: time-ordered, made by the app
    occurred_at    TIMESTAMPTZ NOT NULL,     -- UTC, millisecond precision
    action         TEXT        NOT NULL,
    decision       TEXT        NOT NULL,
    reason         TEXT        NOT NULL,
    subject_kind   TEXT        NOT NULL,
    subject        TEXT        NOT NULL,
    ip             TEXT,
    rule           TEXT,
    observed       BIGINT,
    "limit"        BIGINT,
    window_ms      BIGINT,
    retry_after_ms BIGINT,
    request_id     TEXT,
    user_agent     TEXT,
    shadow         BOOLEAN     NOT NULL DEFAULT FALSE,
    actor          TEXT,
    -- Also the newest-first order (scanned backwards).
    PRIMARY KEY (occurred_at, id)
) PARTITION BY RANGE (occurred_at);

CREATE INDEX audit_events_subject ON audit_events (subject_kind, subject, occurred_at DESC, id DESC);
CREATE INDEX audit_events_ip      ON audit_events (ip, occurred_at DESC, id DESC);
CREATE INDEX audit_events_locks   ON audit_events (occurred_at) WHERE decision = 'lock';
CREATE INDEX audit_events_actor   ON audit_events (actor, occurred_at DESC, id DESC) WHERE actor IS NOT NULL;

-- A day's partition for every day the old table has rows on.
DO $$
DECLARE
    first_day DATE;
    last_day  DATE;
    day       DATE;
BEGIN
    SELECT MIN(occurred_at AT TIME ZONE 'UTC')::date, MAX(occurred_at AT TIME ZONE 'UTC')::date
      INTO first_day, last_day FROM audit_events_unpartitioned;
    IF first_day IS NOT NULL THEN
        day := first_day;
        WHILE day <= last_day LOOP
            EXECUTE format(
                'CREATE TABLE %I PARTITION OF audit_events FOR VALUES FROM (%L) TO (%L)',
                'audit_events_p' || to_char(day, 'YYYYMMDD'),
                day::text || ' 00:00:00+00',
                (day + 1)::text || ' 00:00:00+00');
            day := day + 1;
        END LOOP;
    END IF;
END $$;

INSERT INTO audit_events (id, occurred_at, action, decision, reason, subject_kind, subject, ip, rule,
                          observed, "limit", window_ms, retry_after_ms, request_id, user_agent, shadow, actor)
SELECT id, occurred_at, action, decision, reason, subject_kind, subject, ip, rule,
       observed, "limit", window_ms, retry_after_ms, request_id, user_agent, shadow, actor
  FROM audit_events_unpartitioned;

DROP TABLE audit_events_unpartitioned;

CREATE TABLE audit_counts (
    bucket_ms BIGINT  NOT NULL,  -- start of a 5-minute bucket, ms since 1970
    action    TEXT    NOT NULL,
    decision  TEXT    NOT NULL,
    shadow    BOOLEAN NOT NULL,
    n         BIGINT  NOT NULL,
    PRIMARY KEY (bucket_ms, action, decision, shadow)
);

CREATE TABLE audit_top (
    width_ms BIGINT NOT NULL,  -- 300000 (5 minutes), 3600000 (an hour) or 86400000 (a day)
    start_ms BIGINT NOT NULL,  -- where the summary's stretch starts, ms since 1970
    list     TEXT   NOT NULL,  -- subject (kind:id) | ip | prefix
    key      TEXT   NOT NULL,
    n        BIGINT NOT NULL,  -- a lower bound of the key's refusals
    PRIMARY KEY (width_ms, start_ms, list, key)
);

CREATE TABLE audit_top_error (
    width_ms BIGINT NOT NULL,
    start_ms BIGINT NOT NULL,
    list     TEXT   NOT NULL,
    dropped  BIGINT NOT NULL,  -- what any key's count may lack, at most
    PRIMARY KEY (width_ms, start_ms, list)
);

-- The rollups of the rows copied above.
INSERT INTO audit_counts (bucket_ms, action, decision, shadow, n)
SELECT (FLOOR(EXTRACT(EPOCH FROM occurred_at) * 1000)::bigint / 300000) * 300000,
       action, decision, shadow, COUNT(*)
  FROM audit_events GROUP BY 1, 2, 3, 4;

-- Exact counts per stretch, then cut to 100 keys the Misra-Gries way: the
-- 101st count is taken off every key and recorded as the error. Phones are
-- cut at sms.prefix_digits' default (7 digits).
CREATE TEMPORARY TABLE audit_top_counted AS
WITH refused AS (
    SELECT FLOOR(EXTRACT(EPOCH FROM occurred_at) * 1000)::bigint AS t, subject_kind, subject, ip
      FROM audit_events
     WHERE NOT shadow AND decision IN ('deny', 'challenge', 'lock')
), keyed AS (
    SELECT t, 'subject' AS list, subject_kind || ':' || subject AS key FROM refused
     WHERE subject_kind NOT IN ('ip', 'prefix')
    UNION ALL SELECT t, 'ip', ip FROM refused WHERE ip IS NOT NULL
    UNION ALL SELECT t, 'prefix', CASE WHEN subject_kind = 'phone' THEN substr(subject, 1, 8) ELSE subject END
      FROM refused WHERE subject_kind IN ('phone', 'prefix')
), counted AS (
    SELECT w.width_ms, (k.t / w.width_ms) * w.width_ms AS start_ms, k.list, k.key, COUNT(*) AS n
      FROM keyed k CROSS JOIN (VALUES (300000::bigint), (3600000::bigint), (86400000::bigint)) AS w(width_ms)
     GROUP BY 1, 2, 3, 4
)
SELECT *, ROW_NUMBER() OVER (PARTITION BY width_ms, start_ms, list ORDER BY n DESC, key) AS rank
  FROM counted;

INSERT INTO audit_top_error (width_ms, start_ms, list, dropped)
SELECT width_ms, start_ms, list, n FROM audit_top_counted WHERE rank = 101;

INSERT INTO audit_top (width_ms, start_ms, list, key, n)
SELECT c.width_ms, c.start_ms, c.list, c.key, c.n - COALESCE(e.dropped, 0)
  FROM audit_top_counted c
  LEFT JOIN audit_top_error e USING (width_ms, start_ms, list)
 WHERE c.n - COALESCE(e.dropped, 0) > 0;

DROP TABLE audit_top_counted;
