use std::time::Duration;

use chrono::{DateTime, Utc};
use sqlx::postgres::{PgPool, PgPoolOptions};
use sqlx::{FromRow, Postgres, QueryBuilder};
use uuid::Uuid;

use super::{event_from_columns, push_conditions, AuditError, COLUMNS};
use crate::audit::query::{Cursor, EventFilter};
use crate::audit::AuditEvent;

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
        event_from_columns(
            self.id,
            self.occurred_at,
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

pub async fn insert(pool: &PgPool, events: &[AuditEvent]) -> Result<u64, AuditError> {
    let mut qb = QueryBuilder::<Postgres>::new(format!("INSERT INTO audit_events ({COLUMNS}) "));
    qb.push_values(events, |mut row, e| {
        row.push_bind(e.id)
            .push_bind(e.occurred_at)
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
            .push_bind(e.shadow);
    });
    qb.push(" ON CONFLICT (id) DO NOTHING");
    Ok(qb.build().execute(pool).await?.rows_affected())
}

pub async fn page(
    pool: &PgPool,
    filter: &EventFilter,
    cursor: Option<&Cursor>,
    limit: usize,
) -> Result<Vec<AuditEvent>, AuditError> {
    let mut qb = QueryBuilder::<Postgres>::new(format!("SELECT {COLUMNS} FROM audit_events"));
    push_conditions!(qb, filter, cursor, bind_time, bind_id);
    qb.push(" ORDER BY occurred_at DESC, id DESC LIMIT ")
        .push_bind(limit as i64);
    let rows: Vec<Row> = qb.build_query_as().fetch_all(pool).await?;
    rows.into_iter().map(Row::into_event).collect()
}

pub async fn purge_before(pool: &PgPool, before: DateTime<Utc>) -> Result<u64, AuditError> {
    let done = sqlx::query("DELETE FROM audit_events WHERE occurred_at < $1")
        .bind(before)
        .execute(pool)
        .await?;
    Ok(done.rows_affected())
}
