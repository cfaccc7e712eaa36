-- One row per denied, challenged, locking or admin event (DESIGN.md §4).
CREATE TABLE IF NOT EXISTS audit_events (
    id             UUID        PRIMARY KEY,  -- UUIDv7: time-ordered, made by the app
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
    shadow         BOOLEAN     NOT NULL DEFAULT FALSE
);

-- Newest first, by subject, by IP: each ends with the keyset order.
CREATE INDEX IF NOT EXISTS audit_events_newest  ON audit_events (occurred_at DESC, id DESC);
CREATE INDEX IF NOT EXISTS audit_events_subject ON audit_events (subject_kind, subject, occurred_at DESC, id DESC);
CREATE INDEX IF NOT EXISTS audit_events_ip      ON audit_events (ip, occurred_at DESC, id DESC);
