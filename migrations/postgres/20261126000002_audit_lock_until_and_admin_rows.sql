-- When a lock row's lock runs out (ms since 1970: occurred_at + retry_after_ms),
-- written by the service on lock rows only, so that the overview finds the
-- locks still running through an index of their ends instead of reading
-- every lock row retention keeps (seconds at 10 M rows).
ALTER TABLE audit_events ADD COLUMN lock_until_ms BIGINT;
UPDATE audit_events
   SET lock_until_ms = FLOOR(EXTRACT(EPOCH FROM occurred_at) * 1000)::bigint + retry_after_ms
 WHERE decision = 'lock' AND retry_after_ms IS NOT NULL;
CREATE INDEX audit_events_open_locks ON audit_events (lock_until_ms) WHERE decision = 'lock';
DROP INDEX IF EXISTS audit_events_locks;

-- Admin rows (unblocks, list changes, exports, sign-ins) are few among the
-- refusals: filtering the trail by one of their decisions would read every
-- partition without an index of them alone. The service writes the decision
-- into such a query as a literal, so that the planner can use this index.
CREATE INDEX audit_events_admin ON audit_events (decision, occurred_at DESC, id DESC)
 WHERE decision NOT IN ('deny', 'challenge', 'lock');
