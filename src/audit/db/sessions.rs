//! The `admin_sessions` table: console sessions of single-sign-on admins,
//! kept where every instance reads them, so that signing out and expiry
//! hold on all of them. Rows are keyed by the SHA-256 of the session id
//! (the id itself is only in the browser's cookie). Both databases keep
//! the same plain columns (TEXT, BIGINT ms), so one macro writes the
//! queries for each, with its placeholders.

use super::AuditError;

/// A stored session: who, with which roles, until when.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredSession {
    /// Hex SHA-256 of the session id.
    pub id_hash: String,
    /// `oidc:<email or subject>`.
    pub actor: String,
    /// `operator,auditor`: the roles at sign-in, as `Roles::to_list` writes
    /// them (for whoever reads the table; a session's roles come from
    /// `grants`).
    pub roles: String,
    /// Unix milliseconds.
    pub created_at_ms: i64,
    /// Unix milliseconds; the session is over from then on.
    pub expires_at_ms: i64,
    /// The claim values that granted the roles, as JSON
    /// (`oidc::Grants`): mapped again on each use. `None` in rows written
    /// before they were kept.
    pub grants: Option<String>,
}

type Columns = (String, String, String, i64, i64, Option<String>);

fn from_columns(
    (id_hash, actor, roles, created_at_ms, expires_at_ms, grants): Columns,
) -> StoredSession {
    StoredSession {
        id_hash,
        actor,
        roles,
        created_at_ms,
        expires_at_ms,
        grants,
    }
}

macro_rules! session_queries {
    ($module:ident, $pool:ty, insert: $insert:literal, find: $find:literal,
     delete: $delete:literal, purge: $purge:literal) => {
        pub mod $module {
            use super::*;

            /// Store a new session; expired ones are deleted on the way, so
            /// the table holds only live sessions and those of the last
            /// `session_ttl`.
            pub async fn insert(
                pool: &$pool,
                s: &StoredSession,
                now_ms: i64,
            ) -> Result<(), AuditError> {
                sqlx::query($purge).bind(now_ms).execute(pool).await?;
                sqlx::query($insert)
                    .bind(&s.id_hash)
                    .bind(&s.actor)
                    .bind(&s.roles)
                    .bind(s.created_at_ms)
                    .bind(s.expires_at_ms)
                    .bind(&s.grants)
                    .execute(pool)
                    .await?;
                Ok(())
            }

            /// The session `id_hash` names, unless it has expired at `now_ms`.
            pub async fn find(
                pool: &$pool,
                id_hash: &str,
                now_ms: i64,
            ) -> Result<Option<StoredSession>, AuditError> {
                let row: Option<Columns> = sqlx::query_as($find)
                    .bind(id_hash)
                    .bind(now_ms)
                    .fetch_optional(pool)
                    .await?;
                Ok(row.map(from_columns))
            }

            /// End the session `id_hash`; whether there was one.
            pub async fn delete(pool: &$pool, id_hash: &str) -> Result<bool, AuditError> {
                let done = sqlx::query($delete).bind(id_hash).execute(pool).await?;
                Ok(done.rows_affected() > 0)
            }
        }
    };
}

session_queries!(postgres, sqlx::PgPool,
    insert: "INSERT INTO admin_sessions (id_hash, actor, roles, created_at_ms, expires_at_ms, grants) VALUES ($1, $2, $3, $4, $5, $6)",
    find: "SELECT id_hash, actor, roles, created_at_ms, expires_at_ms, grants FROM admin_sessions WHERE id_hash = $1 AND expires_at_ms > $2",
    delete: "DELETE FROM admin_sessions WHERE id_hash = $1",
    purge: "DELETE FROM admin_sessions WHERE expires_at_ms <= $1");

session_queries!(sqlite, sqlx::SqlitePool,
    insert: "INSERT INTO admin_sessions (id_hash, actor, roles, created_at_ms, expires_at_ms, grants) VALUES (?, ?, ?, ?, ?, ?)",
    find: "SELECT id_hash, actor, roles, created_at_ms, expires_at_ms, grants FROM admin_sessions WHERE id_hash = ? AND expires_at_ms > ?",
    delete: "DELETE FROM admin_sessions WHERE id_hash = ?",
    purge: "DELETE FROM admin_sessions WHERE expires_at_ms <= ?");
