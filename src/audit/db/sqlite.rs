//! SQLite: ids and times stored as TEXT; WAL journal, batches in one
//! transaction.

use std::collections::HashSet;
use std::str::FromStr;
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use sqlx::pool::PoolConnection;
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions};
use sqlx::{FromRow, QueryBuilder, Sqlite};
use uuid::Uuid;

use super::{
    event_from_columns, push_conditions, repository, rollups, AuditError, EventColumns,
    RetentionCut, COLUMNS, ROWS_PER_STATEMENT,
};
use crate::audit::query::{Cursor, EventFilter};
use crate::audit::{rollup, AuditEvent};

/// A lazily connecting pool of at most 4 connections, WAL journal, 5 s busy
/// timeout; creates the file when missing. A connection going back to the
/// pool loses the deadline a bounded read gave it ([`bounded`]), so that
/// the writer's batch that takes it next is never cut short by it.
pub fn pool(url: &str) -> Result<SqlitePool, AuditError> {
    let options = SqliteConnectOptions::from_str(url)?
        .create_if_missing(true)
        .journal_mode(SqliteJournalMode::Wal)
        .busy_timeout(Duration::from_secs(5));
    Ok(SqlitePoolOptions::new()
        .max_connections(4)
        .acquire_timeout(Duration::from_secs(3))
        .after_release(|conn, _| {
            Box::pin(async move {
                conn.lock_handle().await?.remove_progress_handler();
                Ok(true)
            })
        })
        .connect_lazy_with(options))
}

/// How many of SQLite's virtual machine steps run between two looks at a
/// bounded read's deadline: a few microseconds of work, so that a read
/// ends within a hair of its bound at the cost of a clock read each.
const STEPS_BETWEEN_LOOKS: i32 = 1_000;

/// A pooled connection whose statements SQLite interrupts past `bound`
/// from now (`SQLITE_INTERRUPT`: [`AuditError::is_timeout`]). PostgreSQL
/// has `statement_timeout`; SQLite only this progress handler, and
/// without it a filter no index serves walks the whole table, even after
/// the admin who asked has gone (the connection's worker thread does not
/// know).
pub(super) async fn bounded(
    pool: &SqlitePool,
    bound: Option<Duration>,
) -> Result<PoolConnection<Sqlite>, AuditError> {
    let mut conn = pool.acquire().await?;
    if let Some(bound) = bound {
        let deadline = Instant::now() + bound;
        conn.lock_handle()
            .await?
            .set_progress_handler(STEPS_BETWEEN_LOOKS, move || Instant::now() < deadline);
    }
    Ok(conn)
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

/// Newest first, after `cursor`, at most `limit` rows, ended past `bound`.
pub async fn page(
    pool: &SqlitePool,
    filter: &EventFilter,
    cursor: Option<&Cursor>,
    limit: usize,
    bound: Option<Duration>,
) -> Result<Vec<AuditEvent>, AuditError> {
    read_page(&mut *bounded(pool, bound).await?, filter, cursor, limit).await
}

/// Multi-row INSERTs and the rollups of the rows that were new, all in one
/// transaction (one commit, one fsync). A statement's text depends on its
/// number of rows, so none is kept prepared (see `rollups`).
pub async fn insert(
    pool: &SqlitePool,
    events: &[AuditEvent],
    prefix_digits: u32,
) -> Result<u64, AuditError> {
    let mut tx = pool.begin().await?;
    let mut new = HashSet::new();
    for chunk in events.chunks(ROWS_PER_STATEMENT) {
        let mut qb = QueryBuilder::<Sqlite>::new(format!(
            "INSERT INTO audit_events ({COLUMNS}, lock_until_ms) "
        ));
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
                .push_bind(e.actor.clone())
                .push_bind(e.lock_until_ms());
        });
        qb.push(" ON CONFLICT (id) DO NOTHING RETURNING id");
        let ids: Vec<(String,)> = qb
            .build_query_as()
            .persistent(false)
            .fetch_all(&mut *tx)
            .await?;
        new.extend(ids.into_iter().map(|(id,)| id));
    }
    let inserted = new.len() as u64;
    // `remove`: an event twice in one batch went in once, and counts once.
    let deltas = rollup::deltas(
        events.iter().filter(|e| new.remove(&bind_id(e.id))),
        prefix_digits,
    );
    rollups::sqlite::write(&mut tx, &deltas).await?;
    tx.commit().await?;
    Ok(inserted)
}

/// Rows one retention statement deletes: a writer waits for at most one
/// such statement (SQLite has one writer at a time).
const DELETE_BATCH: i64 = 2_000;

/// Delete the rows of hours wholly before `cutoff` in small batches, then
/// their rollups.
pub async fn cut_before(
    pool: &SqlitePool,
    cutoff: DateTime<Utc>,
) -> Result<RetentionCut, AuditError> {
    let before_ms = rollup::floor_to(cutoff.timestamp_millis(), rollup::HOUR_MS);
    let before = DateTime::<Utc>::from_timestamp_millis(before_ms).unwrap_or(cutoff);
    let text = bind_time(before);
    let mut rows = 0;
    loop {
        let deleted = sqlx::query(
            "DELETE FROM audit_events WHERE rowid IN \
             (SELECT rowid FROM audit_events WHERE occurred_at < $1 LIMIT $2)",
        )
        .bind(&text)
        .bind(DELETE_BATCH)
        .execute(pool)
        .await?
        .rows_affected();
        rows += deleted;
        if deleted < DELETE_BATCH as u64 {
            break;
        }
        // Let the writer in between two batches.
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    cut_rollups(pool, before_ms).await?;
    Ok(RetentionCut {
        skipped: false,
        before: Some(before),
        partitions: Vec::new(),
        rows,
    })
}

#[cfg(test)]
mod tests {
    use sqlx::sqlite::SqliteConnectOptions;
    use sqlx::Connection as _;

    use super::*;
    use crate::audit::AuditDecision;
    use crate::domain::{Action, Subject, SubjectKind};

    /// A flood's batches come in every size, and each size is a statement
    /// of its own: none may stay prepared, or the connection's statement
    /// cache holds a hundred of them, each as large as a thousand rows
    /// (the process grew by some 1.3 KB a refusal).
    #[tokio::test]
    async fn batches_of_every_size_leave_no_statement_prepared() {
        let dir = tempfile::tempdir().unwrap();
        let options = SqliteConnectOptions::new()
            .filename(dir.path().join("audit.db"))
            .create_if_missing(true);
        let pool = SqlitePoolOptions::new()
            .max_connections(1)
            .connect_with(options)
            .await
            .unwrap();
        sqlx::migrate!("./migrations/sqlite")
            .run(&pool)
            .await
            .unwrap();
        let cached = |pool: SqlitePool| async move {
            pool.acquire().await.unwrap().cached_statements_size()
        };
        let before = cached(pool.clone()).await;

        for size in 1..=20 {
            let events: Vec<AuditEvent> = (0..size)
                .map(|i| {
                    let subject = Subject::new(SubjectKind::Phone, format!("+861380013{i:04}"));
                    AuditEvent::new(
                        Action::SmsSend,
                        AuditDecision::Deny,
                        "rate_limited",
                        &subject,
                    )
                })
                .collect();
            assert_eq!(insert(&pool, &events, 7).await.unwrap(), size);
        }

        let after = cached(pool.clone()).await;
        assert!(
            after <= before + 2,
            "{before} statements prepared before, {after} after"
        );
    }
}
