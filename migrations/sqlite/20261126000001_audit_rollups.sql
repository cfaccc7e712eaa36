-- Rollups written in the same transaction as the rows they count
-- (docs/audit.md "Partitions and rollups"): audit_counts (rows per 5
-- minutes, action, decision, shadow) and audit_top / audit_top_error
-- (bounded Misra-Gries summaries of the refused subjects, client IPs and
-- phone prefixes per 5 minutes, hour and day). SQLite keeps one events table:
-- retention deletes in small batches.

CREATE TABLE audit_counts (
    bucket_ms INTEGER NOT NULL,  -- start of a 5-minute bucket, ms since 1970
    action    TEXT    NOT NULL,
    decision  TEXT    NOT NULL,
    shadow    INTEGER NOT NULL,
    n         INTEGER NOT NULL,
    PRIMARY KEY (bucket_ms, action, decision, shadow)
);

CREATE TABLE audit_top (
    width_ms INTEGER NOT NULL,  -- 300000 (5 minutes), 3600000 (an hour) or 86400000 (a day)
    start_ms INTEGER NOT NULL,  -- where the summary's stretch starts, ms since 1970
    list     TEXT    NOT NULL,  -- subject (kind:id) | ip | prefix
    key      TEXT    NOT NULL,
    n        INTEGER NOT NULL,  -- a lower bound of the key's refusals
    PRIMARY KEY (width_ms, start_ms, list, key)
);

CREATE TABLE audit_top_error (
    width_ms INTEGER NOT NULL,
    start_ms INTEGER NOT NULL,
    list     TEXT    NOT NULL,
    dropped  INTEGER NOT NULL,  -- what any key's count may lack, at most
    PRIMARY KEY (width_ms, start_ms, list)
);

-- The rollups of the rows already there.
INSERT INTO audit_counts (bucket_ms, action, decision, shadow, n)
SELECT ((CAST(strftime('%s', occurred_at) AS INTEGER) * 1000 + CAST(substr(occurred_at, 21, 3) AS INTEGER)) / 300000) * 300000,
       action, decision, shadow, COUNT(*)
  FROM audit_events GROUP BY 1, 2, 3, 4;

-- Exact counts per stretch, then cut to 100 keys the Misra-Gries way: the
-- 101st count is taken off every key and recorded as the error. Phones are
-- cut at sms.prefix_digits' default (7 digits).
CREATE TEMPORARY TABLE audit_top_counted AS
WITH refused AS (
    SELECT CAST(strftime('%s', occurred_at) AS INTEGER) * 1000 + CAST(substr(occurred_at, 21, 3) AS INTEGER) AS t,
           subject_kind, subject, ip
      FROM audit_events
     WHERE shadow = 0 AND decision IN ('deny', 'challenge', 'lock')
), keyed AS (
    SELECT t, 'subject' AS list, subject_kind || ':' || subject AS key FROM refused
     WHERE subject_kind NOT IN ('ip', 'prefix')
    UNION ALL SELECT t, 'ip', ip FROM refused WHERE ip IS NOT NULL
    UNION ALL SELECT t, 'prefix', CASE WHEN subject_kind = 'phone' THEN substr(subject, 1, 8) ELSE subject END
      FROM refused WHERE subject_kind IN ('phone', 'prefix')
), counted AS (
    SELECT w.width_ms, (k.t / w.width_ms) * w.width_ms AS start_ms, k.list, k.key, COUNT(*) AS n
      FROM keyed k CROSS JOIN (SELECT 300000 AS width_ms UNION ALL SELECT 3600000 UNION ALL SELECT 86400000) AS w
     GROUP BY 1, 2, 3, 4
)
SELECT *, ROW_NUMBER() OVER (PARTITION BY width_ms, start_ms, list ORDER BY n DESC, key) AS rank
  FROM counted;

INSERT INTO audit_top_error (width_ms, start_ms, list, dropped)
SELECT width_ms, start_ms, list, n FROM audit_top_counted WHERE rank = 101;

INSERT INTO audit_top (width_ms, start_ms, list, key, n)
SELECT c.width_ms, c.start_ms, c.list, c.key, c.n - COALESCE(e.dropped, 0)
  FROM audit_top_counted c
  LEFT JOIN audit_top_error e ON e.width_ms = c.width_ms AND e.start_ms = c.start_ms AND e.list = c.list
 WHERE c.n - COALESCE(e.dropped, 0) > 0;

DROP TABLE audit_top_counted;
