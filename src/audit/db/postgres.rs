use std::time::Duration;

use chrono::{DateTime, Utc};
use sqlx::postgres::{PgPool, PgPoolOptions};
use sqlx::{FromRow, Postgres, QueryBuilder};
use uuid::Uuid;

use super::{event_from_columns, push_conditions, repository, AuditError, COLUMNS};
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

repository!(Postgres, PgPool);
