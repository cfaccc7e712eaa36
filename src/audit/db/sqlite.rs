//! SQLite: ids and times stored as TEXT; WAL journal, batches in one
//! transaction.

use std::str::FromStr;
use std::time::Duration;

use chrono::{DateTime, Utc};
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions};
use sqlx::{FromRow, QueryBuilder, Sqlite};
use uuid::Uuid;

use super::{
    event_from_columns, push_conditions, repository, AuditError, EventColumns, COLUMNS,
    ROWS_PER_STATEMENT,
};
use crate::audit::query::{Cursor, EventFilter};
use crate::audit::AuditEvent;

/// A lazily connecting pool of at most 4 connections, WAL journal, 5 s busy
/// timeout; creates the file when missing.
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
pub(super) fn bind_time(t: DateTime<Utc>) -> String {
    t.format("%Y-%m-%dT%H:%M:%S%.3fZ").to_string()
}

fn bind_id(id: Uuid) -> String {
    id.to_string()
}

#[derive(FromRow)]
struct Row {
    id: String,
    occurred_at: String,
    #[sqlx(flatten)]
    columns: EventColumns,
}

impl Row {
    fn into_event(self) -> Result<AuditEvent, AuditError> {
        let id = Uuid::parse_str(&self.id).map_err(|_| super::corrupt("id", &self.id))?;
        let occurred_at = DateTime::parse_from_rfc3339(&self.occurred_at)
            .map_err(|_| super::corrupt("occurred_at", &self.occurred_at))?
            .with_timezone(&Utc);
        event_from_columns(id, occurred_at, self.columns)
    }
}

repository!(Sqlite, SqlitePool);

/// Multi-row INSERTs, all in one transaction (one commit, one fsync).
pub async fn insert(pool: &SqlitePool, events: &[AuditEvent]) -> Result<u64, AuditError> {
    let mut tx = pool.begin().await?;
    let mut inserted = 0;
    for chunk in events.chunks(ROWS_PER_STATEMENT) {
        let mut qb = QueryBuilder::<Sqlite>::new(format!("INSERT INTO audit_events ({COLUMNS}) "));
        qb.push_values(chunk, |mut row, e| {
            row.push_bind(bind_id(e.id))
                .push_bind(bind_time(e.occurred_at))
                .push_bind(e.action.as_str())
                .push_bind(e.decision.as_str())
                .push_bind(e.reason.clone())
                .push_bind(e.subject_kind.as_str())
                .push_bind(e.subject.clone())
                .push_bind(e.ip.clone())
                .push_bind(e.rule.clone())
                .push_bind(e.observed)
                .push_bind(e.limit)
                .push_bind(e.window_ms)
                .push_bind(e.retry_after_ms)
                .push_bind(e.request_id.clone())
                .push_bind(e.user_agent.clone())
                .push_bind(e.shadow)
                .push_bind(e.actor.clone());
        });
        qb.push(" ON CONFLICT (id) DO NOTHING");
        inserted += qb.build().execute(&mut *tx).await?.rows_affected();
    }
    tx.commit().await?;
    Ok(inserted)
}
