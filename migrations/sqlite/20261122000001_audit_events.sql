-- One row per denied, challenged, locking or admin event (DESIGN.md §4).
-- SQLite has no timestamp type: occurred_at is fixed-width RFC 3339 text in UTC
-- with milliseconds ("2026-11-22T10:01:32.622Z"), so text order is time order;
-- id is the UUIDv7's lowercase text, whose order is its time order too.
CREATE TABLE IF NOT EXISTS audit_events (
    id             TEXT    PRIMARY KEY NOT NULL,
    occurred_at    TEXT    NOT NULL,
    action         TEXT    NOT NULL,
    decision       TEXT    NOT NULL,
    reason         TEXT    NOT NULL,
    subject_kind   TEXT    NOT NULL,
    subject        TEXT    NOT NULL,
    ip             TEXT,
    rule           TEXT,
    observed       INTEGER,
    "limit"        INTEGER,
    window_ms      INTEGER,
    retry_after_ms INTEGER,
    request_id     TEXT,
    user_agent     TEXT,
    shadow         INTEGER NOT NULL DEFAULT 0
);

CREATE INDEX IF NOT EXISTS audit_events_newest  ON audit_events (occurred_at DESC, id DESC);
CREATE INDEX IF NOT EXISTS audit_events_subject ON audit_events (subject_kind, subject, occurred_at DESC, id DESC);
CREATE INDEX IF NOT EXISTS audit_events_ip      ON audit_events (ip, occurred_at DESC, id DESC);
