-- The overview's open locks ask, for each running lock, whether its subject
-- was unblocked since. Through the subject index that walks every row of the
-- subject after the lock, so one user with thousands of pair locks (one
-- client, many addresses) made it quadratic: 4,100 locks took seconds.
-- Unblocks are few; an index of them alone answers each lock in one probe.
CREATE INDEX IF NOT EXISTS audit_events_unblocks
    ON audit_events (subject_kind, subject, occurred_at) WHERE decision = 'unblock';
