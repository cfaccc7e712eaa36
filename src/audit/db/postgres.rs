//! PostgreSQL: native UUID and TIMESTAMPTZ columns; a batch is one statement.

use std::collections::HashSet;
use std::str::FromStr;
use std::time::Duration;

use chrono::{DateTime, SubsecRound, Utc};
use sqlx::postgres::{PgConnectOptions, PgConnection, PgPool, PgPoolOptions};
use sqlx::{Connection as _, FromRow, Postgres, QueryBuilder, Row as _, Transaction};
use uuid::Uuid;

use super::closing::ClosedUnlessDone;
use super::{
    event_from_columns, partitions, push_conditions, repository, rollups, AuditError, EventColumns,
    RetentionCut, COLUMNS,
};
use crate::audit::query::{Cursor, EventFilter};
use crate::audit::{rollup, AuditEvent};

/// A lazily connecting pool of at most 5 connections, with PostgreSQL's
/// JIT compiler off: a query over the ~100 daily partitions is estimated
/// costly enough to be compiled, which took seconds (measured: 4.5 s for a
/// query that ran in 26 ms) for the short queries the trail asks.
pub fn pool(url: &str) -> Result<PgPool, AuditError> {
    let options = PgConnectOptions::from_str(url)?.options([("jit", "off")]);
    Ok(PgPoolOptions::new()
        .max_connections(5)
        .acquire_timeout(Duration::from_secs(3))
        .connect_lazy_with(options))
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

/// The rows and their rollups in one transaction; a row of a day without a
/// partition has it made, then the batch is tried again.
pub async fn insert(
    pool: &PgPool,
    events: &[AuditEvent],
    prefix_digits: u32,
    bound: Option<Duration>,
) -> Result<u64, AuditError> {
    match insert_once(pool, events, prefix_digits, bound).await {
        Err(e) if partitions::is_missing_partition(&e) => {
            let days = events.iter().map(|e| partitions::day(e.occurred_at));
            partitions::ensure(pool, days, bound).await?;
            insert_once(pool, events, prefix_digits, bound).await
        }
        done => done,
    }
}

/// The rows as a plain `INSERT`: a batch of new events, the usual case,
/// then costs PostgreSQL no speculative insertion (`ON CONFLICT`'s probe
/// of the key and its confirming WAL record, per row) and returns nothing.
/// A row already there (a journal's replay after a crash, a retry after a
/// commit whose answer was lost, an event twice in one batch) fails it
/// with unique_violation; then the batch goes again, skipping those.
async fn insert_once(
    pool: &PgPool,
    events: &[AuditEvent],
    prefix_digits: u32,
    bound: Option<Duration>,
) -> Result<u64, AuditError> {
    let batch = Batch {
        events,
        prefix_digits,
        bound,
    };
    match insert_rows(pool, &batch, Present::Absent).await {
        Err(e) if is_present_already(&e) => insert_rows(pool, &batch, Present::Skipped).await,
        done => done,
    }
}

/// A page of events, on a connection closed if the reader goes away (the
/// admin's request was dropped) or `BEGIN` fails. With a bound, PostgreSQL
/// ends its lock waits and its statement there: a filter no index serves
/// reads every partition.
pub async fn page_within(
    pool: &PgPool,
    filter: &EventFilter,
    cursor: Option<&Cursor>,
    limit: usize,
    bound: Option<Duration>,
) -> Result<Vec<AuditEvent>, AuditError> {
    let mut conn = ClosedUnlessDone::acquire(pool).await?;
    let tx = begin(&mut conn, bound).await?;
    let read = page_in(tx, filter, cursor, limit).await;
    conn.done();
    read
}

async fn page_in(
    mut tx: Transaction<'_, Postgres>,
    filter: &EventFilter,
    cursor: Option<&Cursor>,
    limit: usize,
) -> Result<Vec<AuditEvent>, AuditError> {
    let events = read_page(&mut tx, filter, cursor, limit).await?;
    tx.commit().await?;
    Ok(events)
}

/// One batch's rows and how to write them.
struct Batch<'a> {
    events: &'a [AuditEvent],
    prefix_digits: u32,
    /// Past it, PostgreSQL ends the transaction's lock waits and statements.
    bound: Option<Duration>,
}

/// On a connection that is closed, not pooled again, if the caller cuts
/// the insert off (`closing`), or if its `BEGIN` failed: one whose `SET
/// LOCAL` PostgreSQL refused is left in an aborted transaction that sqlx
/// does not roll back, and would fail every statement after it.
async fn insert_rows(
    pool: &PgPool,
    batch: &Batch<'_>,
    present: Present,
) -> Result<u64, AuditError> {
    let mut conn = ClosedUnlessDone::acquire(pool).await?;
    let tx = begin(&mut conn, batch.bound).await?;
    let written = insert_rows_in(tx, batch, present).await;
    conn.done();
    written
}

/// The batch's transaction. With a bound, PostgreSQL ends its lock waits
/// and statements past it, set in `BEGIN`'s own round trip (milliseconds
/// are both settings' unit).
pub(super) async fn begin(
    conn: &mut PgConnection,
    bound: Option<Duration>,
) -> Result<Transaction<'_, Postgres>, sqlx::Error> {
    match bound {
        Some(bound) => {
            let ms = bound.as_millis().max(1);
            conn.begin_with(format!(
                "BEGIN; SET LOCAL lock_timeout = {ms}; SET LOCAL statement_timeout = {ms}"
            ))
            .await
        }
        None => conn.begin().await,
    }
}

/// What a batch's statement does with a row whose key is already there.
#[derive(Clone, Copy)]
enum Present {
    /// There is none: a present row fails the statement.
    Absent,
    /// It is skipped, and `RETURNING` tells which rows were new.
    Skipped,
}

/// 23505: unique_violation. The rows statement is the only one of the
/// batch's transaction that can raise it (the rollups merge on conflict).
fn is_present_already(e: &AuditError) -> bool {
    match e {
        AuditError::Database(sqlx::Error::Database(e)) => e.is_unique_violation(),
        _ => false,
    }
}

/// One statement for the rows (each column as one array bind), then the
/// rollups of the rows that were new, in `tx`.
async fn insert_rows_in(
    mut tx: Transaction<'_, Postgres>,
    batch: &Batch<'_>,
    present: Present,
) -> Result<u64, AuditError> {
    let Batch {
        events,
        prefix_digits,
        ..
    } = *batch;
    fn column<'a, T>(events: &'a [AuditEvent], f: impl Fn(&'a AuditEvent) -> T) -> Vec<T> {
        events.iter().map(f).collect()
    }
    let on_conflict = match present {
        Present::Absent => "",
        Present::Skipped => " ON CONFLICT (occurred_at, id) DO NOTHING RETURNING id",
    };
    let sql = format!(
        "INSERT INTO audit_events ({COLUMNS}, lock_until_ms) SELECT * FROM UNNEST(\
         $1::uuid[], $2::timestamptz[], $3::text[], $4::text[], $5::text[], $6::text[], \
         $7::text[], $8::text[], $9::text[], $10::bigint[], $11::bigint[], $12::bigint[], \
         $13::bigint[], $14::text[], $15::text[], $16::bool[], $17::text[], $18::bigint[])\
         {on_conflict}"
    );
    let query = sqlx::query(&sql)
        .bind(column(events, |e| e.id))
        // Milliseconds, as the journal keeps them: a replay's row must be
        // the same key, (occurred_at, id), as the first insert's.
        .bind(column(events, |e| e.occurred_at.trunc_subsecs(3)))
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
        .bind(column(events, AuditEvent::lock_until_ms));
    let (inserted, deltas) = match present {
        Present::Absent => {
            let inserted = query.execute(&mut *tx).await?.rows_affected();
            (inserted, rollup::deltas(events.iter(), prefix_digits))
        }
        Present::Skipped => {
            let rows = query.fetch_all(&mut *tx).await?;
            let inserted = rows.len() as u64;
            let mut new = HashSet::with_capacity(rows.len());
            for row in rows {
                new.insert(row.try_get::<Uuid, _>(0)?);
            }
            // `remove`: an event twice in one batch went in once, and counts once.
            let new_events = events.iter().filter(|e| new.remove(&e.id));
            (inserted, rollup::deltas(new_events, prefix_digits))
        }
    };
    // Writers (other instances, concurrent inserters) merging into the same
    // summaries must not take their rows in different orders: the benchmark's
    // four inserters deadlocked when a batch's keys went in count order. Keys
    // now go in key order, but a prune updates a whole summary in whatever
    // order it finds its rows: rollup writers go one at a time, from here to
    // the commit.
    sqlx::query("SELECT pg_advisory_xact_lock($1)")
        .bind(ROLLUP_LOCK)
        .execute(&mut *tx)
        .await?;
    rollups::postgres::write(&mut tx, &deltas).await?;
    tx.commit().await?;
    Ok(inserted)
}

/// Rollups are merged by one transaction at a time ("tollgate" + 3).
const ROLLUP_LOCK: i64 = 0x746f_6c6c_6761_7403;

/// Retention is cut by one instance at a time: the one holding this
/// session-level advisory lock ("tollgate" + 2).
const RETENTION_LOCK: i64 = 0x746f_6c6c_6761_7402;

/// The server's clock (`now()`): every instance's retention cut reads it.
pub async fn clock(pool: &PgPool) -> Result<DateTime<Utc>, AuditError> {
    let (now,): (DateTime<Utc>,) = sqlx::query_as("SELECT now()").fetch_one(pool).await?;
    Ok(now)
}

/// Drop the partitions of days wholly before `cutoff`, then their rollups.
pub async fn cut_before(pool: &PgPool, cutoff: DateTime<Utc>) -> Result<RetentionCut, AuditError> {
    let mut conn = pool.acquire().await?;
    // Closed after use, so that the lock cannot outlive this call on a
    // pooled connection whatever fails below.
    conn.close_on_drop();
    let (locked,): (bool,) = sqlx::query_as("SELECT pg_try_advisory_lock($1)")
        .bind(RETENTION_LOCK)
        .fetch_one(&mut *conn)
        .await?;
    if !locked {
        return Ok(RetentionCut {
            skipped: true,
            ..RetentionCut::default()
        });
    }
    let day = partitions::day(cutoff);
    let dropped = partitions::drop_before(&mut conn, day).await?;
    let before = day.and_time(chrono::NaiveTime::MIN).and_utc();
    cut_rollups(pool, before.timestamp_millis()).await?;
    sqlx::query("SELECT pg_advisory_unlock($1)")
        .bind(RETENTION_LOCK)
        .execute(&mut *conn)
        .await?;
    Ok(RetentionCut {
        skipped: false,
        before: Some(before),
        rows: dropped.iter().map(|d| d.rows).sum(),
        partitions: dropped.iter().map(|d| partitions::name(d.day)).collect(),
    })
}
