-- The console's overview lists the locks that have not run out: a small
-- index of the lock rows alone, so that it never reads the whole trail.
CREATE INDEX IF NOT EXISTS audit_events_locks ON audit_events (occurred_at) WHERE decision = 'lock';
