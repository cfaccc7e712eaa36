-- Console sessions of admins signed in through single sign-on, shared by
-- every instance: signing out or expiring ends a session everywhere. The
-- browser holds the session id (in an encrypted cookie); the table holds
-- only its SHA-256, so whoever reads the table cannot sign in with it.
CREATE TABLE admin_sessions (
    id_hash       TEXT   PRIMARY KEY,   -- hex SHA-256 of the session id
    actor         TEXT   NOT NULL,      -- oidc:<email or subject>
    roles         TEXT   NOT NULL,      -- viewer,operator,auditor (a subset)
    created_at_ms BIGINT NOT NULL,
    expires_at_ms BIGINT NOT NULL
);
CREATE INDEX admin_sessions_expiry ON admin_sessions (expires_at_ms);
