use std::str::FromStr;
use std::time::Duration;

use chrono::{DateTime, Utc};
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions};
use sqlx::{FromRow, QueryBuilder, Sqlite};
use uuid::Uuid;

use super::{event_from_columns, push_conditions, repository, AuditError, COLUMNS};
use crate::audit::query::{Cursor, EventFilter};
use crate::audit::AuditEvent;

pub fn pool(url: &str) -> Result<SqlitePool, AuditError> {
    let options = SqliteConnectOptions::from_str(url)?
        .create_if_missing(true)
        .journal_mode(SqliteJournalMode::Wal)
        .busy_timeout(Duration::from_secs(5));
    Ok(SqlitePoolOptions::new()
        .max_connections(4)
        .acquire_timeout(Duration::from_secs(3))
        .connect_lazy_with(options))
}

/// Fixed-width UTC text, so that text order is time order.
fn bind_time(t: DateTime<Utc>) -> String {
    t.format("%Y-%m-%dT%H:%M:%S%.3fZ").to_string()
}

fn bind_id(id: Uuid) -> String {
    id.to_string()
}

#[derive(FromRow)]
struct Row {
    id: String,
    occurred_at: String,
    action: String,
    decision: String,
    reason: String,
    subject_kind: String,
    subject: String,
    ip: Option<String>,
    rule: Option<String>,
    observed: Option<i64>,
    limit: Option<i64>,
    window_ms: Option<i64>,
    retry_after_ms: Option<i64>,
    request_id: Option<String>,
    user_agent: Option<String>,
    shadow: bool,
}

impl Row {
    fn into_event(self) -> Result<AuditEvent, AuditError> {
        let id = Uuid::parse_str(&self.id).map_err(|_| super::corrupt("id", &self.id))?;
        let occurred_at = DateTime::parse_from_rfc3339(&self.occurred_at)
            .map_err(|_| super::corrupt("occurred_at", &self.occurred_at))?
            .with_timezone(&Utc);
        event_from_columns(
            id,
            occurred_at,
            &self.action,
            &self.decision,
            self.reason,
            &self.subject_kind,
            self.subject,
            self.ip,
            self.rule,
            [
                self.observed,
                self.limit,
                self.window_ms,
                self.retry_after_ms,
            ],
            self.request_id,
            self.user_agent,
            self.shadow,
        )
    }
}

repository!(Sqlite, SqlitePool);
