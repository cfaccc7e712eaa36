-- The admin who acted, on admin rows: `token:<name>` or `oidc:<email or
-- subject>`. Null on other rows and on rows written before admins had names.
ALTER TABLE audit_events ADD COLUMN actor TEXT;
-- The trail filtered by actor, newest first.
CREATE INDEX IF NOT EXISTS audit_events_actor ON audit_events (actor, occurred_at DESC, id DESC) WHERE actor IS NOT NULL;
