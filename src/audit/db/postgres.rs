//! PostgreSQL: native UUID and TIMESTAMPTZ columns; a batch is one statement.

use std::time::Duration;

use chrono::{DateTime, Utc};
use sqlx::postgres::{PgPool, PgPoolOptions};
use sqlx::{FromRow, Postgres, QueryBuilder};
use uuid::Uuid;

use super::{event_from_columns, push_conditions, repository, AuditError, EventColumns, COLUMNS};
use crate::audit::query::{Cursor, EventFilter};
use crate::audit::AuditEvent;

/// A lazily connecting pool of at most 5 connections.
pub fn pool(url: &str) -> Result<PgPool, AuditError> {
    Ok(PgPoolOptions::new()
        .max_connections(5)
        .acquire_timeout(Duration::from_secs(3))
        .connect_lazy(url)?)
}

fn bind_time(t: DateTime<Utc>) -> DateTime<Utc> {
    t
}

fn bind_id(id: Uuid) -> Uuid {
    id
}

#[derive(FromRow)]
struct Row {
    id: Uuid,
    occurred_at: DateTime<Utc>,
    #[sqlx(flatten)]
    columns: EventColumns,
}

impl Row {
    fn into_event(self) -> Result<AuditEvent, AuditError> {
        event_from_columns(self.id, self.occurred_at, self.columns)
    }
}

repository!(Postgres, PgPool);

/// One statement per batch: each column goes as one array bind.
pub async fn insert(pool: &PgPool, events: &[AuditEvent]) -> Result<u64, AuditError> {
    fn column<'a, T>(events: &'a [AuditEvent], f: impl Fn(&'a AuditEvent) -> T) -> Vec<T> {
        events.iter().map(f).collect()
    }
    let sql = format!(
        "INSERT INTO audit_events ({COLUMNS}) SELECT * FROM UNNEST(\
         $1::uuid[], $2::timestamptz[], $3::text[], $4::text[], $5::text[], $6::text[], \
         $7::text[], $8::text[], $9::text[], $10::bigint[], $11::bigint[], $12::bigint[], \
         $13::bigint[], $14::text[], $15::text[], $16::bool[], $17::text[]) ON CONFLICT (id) DO NOTHING"
    );
    let done = sqlx::query(&sql)
        .bind(column(events, |e| e.id))
        .bind(column(events, |e| e.occurred_at))
        .bind(column(events, |e| e.action.as_str()))
        .bind(column(events, |e| e.decision.as_str()))
        .bind(column(events, |e| e.reason.as_str()))
        .bind(column(events, |e| e.subject_kind.as_str()))
        .bind(column(events, |e| e.subject.as_str()))
        .bind(column(events, |e| e.ip.as_deref()))
        .bind(column(events, |e| e.rule.as_deref()))
        .bind(column(events, |e| e.observed))
        .bind(column(events, |e| e.limit))
        .bind(column(events, |e| e.window_ms))
        .bind(column(events, |e| e.retry_after_ms))
        .bind(column(events, |e| e.request_id.as_deref()))
        .bind(column(events, |e| e.user_agent.as_deref()))
        .bind(column(events, |e| e.shadow))
        .bind(column(events, |e| e.actor.as_deref()))
        .execute(pool)
        .await?;
    Ok(done.rows_affected())
}
