//! The rows of `audit_events` as both databases read them, and the queries
//! written once for both: the column list, the filter conditions, the page
//! query, a row back into an [`AuditEvent`].

use chrono::{DateTime, Utc};

use super::AuditError;
use crate::audit::AuditEvent;

pub(super) const COLUMNS: &str = r#"id, occurred_at, action, decision, reason, subject_kind, subject, ip, rule, observed, "limit", window_ms, retry_after_ms, request_id, user_agent, shadow, actor"#;

/// Appends ` WHERE …` for a filter and a cursor to a query builder of either
/// database; `$time` and `$id` turn a time and a UUID into that database's
/// bind types.
macro_rules! push_conditions {
    ($qb:expr, $filter:expr, $cursor:expr, $time:expr, $id:expr) => {{
        let filter: &$crate::audit::query::EventFilter = $filter;
        let mut sep = " WHERE ";
        macro_rules! cond {
            ($sql:literal, $value:expr) => {{
                $qb.push(sep).push($sql).push_bind($value);
                sep = " AND ";
            }};
        }
        if let Some(kind) = filter.subject_kind {
            cond!("subject_kind = ", kind.as_str());
        }
        if let Some(subject) = &filter.subject {
            cond!("subject = ", subject.clone());
        }
        if let Some(action) = filter.action {
            cond!("action = ", action.as_str());
        }
        if let Some(decision) = filter.decision {
            // A literal, not a bind: the planner can then prove that an admin
            // decision matches the partial index of admin rows
            // (`audit_events_admin`). The value is an enum's name, never text
            // from outside.
            let decision: $crate::audit::AuditDecision = decision;
            $qb.push(sep)
                .push("decision = '")
                .push(decision.as_str())
                .push("'");
            sep = " AND ";
        }
        if let Some(ip) = &filter.ip {
            cond!("ip = ", ip.clone());
        }
        if let Some(actor) = &filter.actor {
            cond!("actor = ", actor.clone());
        }
        if let Some(since) = filter.since {
            cond!("occurred_at >= ", $time(since));
        }
        if let Some(until) = filter.until {
            cond!("occurred_at <= ", $time(until));
        }
        if let Some(cursor) = $cursor {
            let cursor: &$crate::audit::query::Cursor = cursor;
            $qb.push(sep)
                .push("(occurred_at, id) < (")
                .push_bind($time(cursor.occurred_at))
                .push(", ")
                .push_bind($id(cursor.id))
                .push(")");
        }
        let _ = sep;
    }};
}
pub(super) use push_conditions;

/// The queries, written once and instantiated per database. Each database
/// module defines `bind_time`, `bind_id` (its column types) and a `Row` with
/// `into_event`, then calls `repository!(DatabaseType, PoolType)`.
macro_rules! repository {
    ($db:ty, $pool:ty) => {
        /// A page of events on `conn`: newest first, after `cursor`, at
        /// most `limit` rows.
        async fn read_page(
            conn: &mut <$db as sqlx::Database>::Connection,
            filter: &EventFilter,
            cursor: Option<&Cursor>,
            limit: usize,
        ) -> Result<Vec<AuditEvent>, AuditError> {
            let mut qb = QueryBuilder::<$db>::new(format!("SELECT {COLUMNS} FROM audit_events"));
            push_conditions!(qb, filter, cursor, bind_time, bind_id);
            qb.push(" ORDER BY occurred_at DESC, id DESC LIMIT ")
                .push_bind(limit as i64);
            let rows: Vec<Row> = qb.build_query_as().fetch_all(&mut *conn).await?;
            rows.into_iter().map(Row::into_event).collect()
        }

        /// Delete the top summaries no period reads any more
        /// (`rollup::TOP_KEPT_MS`), a day of stretches per statement so that
        /// writers merging into today's summaries never wait long; how many.
        pub async fn trim_summaries(pool: &$pool, now_ms: i64) -> Result<u64, AuditError> {
            let mut trimmed = 0;
            for (width_ms, kept_ms) in crate::audit::rollup::TOP_KEPT_MS {
                let before = now_ms - kept_ms;
                for table in ["audit_top", "audit_top_error"] {
                    let (oldest,): (Option<i64>,) = sqlx::query_as(&format!(
                        "SELECT MIN(start_ms) FROM {table} WHERE width_ms = $1"
                    ))
                    .bind(width_ms)
                    .fetch_one(pool)
                    .await?;
                    let Some(mut from) = oldest else { continue };
                    while from < before {
                        let to = (from + crate::audit::rollup::DAY_MS).min(before);
                        trimmed += sqlx::query(&format!(
                            "DELETE FROM {table} WHERE width_ms = $1 AND start_ms >= $2 AND start_ms < $3"
                        ))
                        .bind(width_ms)
                        .bind(from)
                        .bind(to)
                        .execute(pool)
                        .await?
                        .rows_affected();
                        from = to;
                        tokio::time::sleep(std::time::Duration::from_millis(2)).await;
                    }
                }
            }
            Ok(trimmed)
        }

        /// Delete the rollups of stretches that end by `before_ms` (a day
        /// summary of a day whose later hours are kept stays).
        async fn cut_rollups(pool: &$pool, before_ms: i64) -> Result<(), AuditError> {
            for sql in [
                "DELETE FROM audit_counts WHERE bucket_ms + 300000 <= $1",
                "DELETE FROM audit_top WHERE start_ms + width_ms <= $1",
                "DELETE FROM audit_top_error WHERE start_ms + width_ms <= $1",
            ] {
                sqlx::query(sql).bind(before_ms).execute(pool).await?;
            }
            Ok(())
        }
    };
}
pub(super) use repository;

pub(super) fn corrupt(what: &str, value: &str) -> AuditError {
    AuditError::Corrupt(format!("{what} {value:?}"))
}

/// The columns both databases read alike: all but the id and the time,
/// whose types differ (UUID and TIMESTAMPTZ in PostgreSQL, text in SQLite).
#[derive(sqlx::FromRow)]
pub(super) struct EventColumns {
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
    actor: Option<String>,
}

/// Rebuilds an event from a row (shared by both databases); a value no
/// version of tollgate writes is `AuditError::Corrupt`.
pub(super) fn event_from_columns(
    id: uuid::Uuid,
    occurred_at: DateTime<Utc>,
    row: EventColumns,
) -> Result<AuditEvent, AuditError> {
    Ok(AuditEvent {
        id,
        occurred_at,
        action: crate::domain::Action::parse(&row.action)
            .ok_or_else(|| corrupt("action", &row.action))?,
        decision: crate::audit::AuditDecision::parse(&row.decision)
            .ok_or_else(|| corrupt("decision", &row.decision))?,
        reason: row.reason,
        subject_kind: crate::domain::SubjectKind::parse(&row.subject_kind)
            .ok_or_else(|| corrupt("subject_kind", &row.subject_kind))?,
        subject: row.subject,
        ip: row.ip,
        rule: row.rule,
        observed: row.observed,
        limit: row.limit,
        window_ms: row.window_ms,
        retry_after_ms: row.retry_after_ms,
        request_id: row.request_id,
        user_agent: row.user_agent,
        shadow: row.shadow,
        actor: row.actor,
    })
}
