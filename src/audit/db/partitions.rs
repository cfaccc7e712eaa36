//! PostgreSQL's daily partitions of `audit_events` (UTC days): made ahead of
//! need, made on demand for a row of a day that has none, and dropped whole
//! by retention.
//!
//! A partition is made as a plain table and then attached, which locks the
//! parent only against other schema changes (SHARE UPDATE EXCLUSIVE), not
//! against writers or readers; `CREATE TABLE … PARTITION OF` would take an
//! ACCESS EXCLUSIVE lock and queue every insert behind a running export.
//! It is dropped the same way round: `DETACH PARTITION … CONCURRENTLY`
//! (PostgreSQL 14 or newer), then `DROP TABLE` of a table no query uses.

use std::collections::BTreeSet;
use std::time::Duration;

use chrono::{DateTime, Days, NaiveDate, Utc};
use sqlx::PgPool;

use super::AuditError;

/// Partition creation by several instances at once is serialised on this
/// transaction-level advisory lock ("tollgate" + 1).
pub const CREATE_LOCK: i64 = 0x746f_6c6c_6761_7401;

/// The table that holds `day`.
pub fn name(day: NaiveDate) -> String {
    format!("audit_events_p{}", day.format("%Y%m%d"))
}

fn day_of(name: &str) -> Option<NaiveDate> {
    NaiveDate::parse_from_str(name.strip_prefix("audit_events_p")?, "%Y%m%d").ok()
}

fn bound(day: NaiveDate) -> String {
    format!("{} 00:00:00+00", day.format("%Y-%m-%d"))
}

/// The UTC day of a time.
pub fn day(t: DateTime<Utc>) -> NaiveDate {
    t.date_naive()
}

/// Days from `first` to `last`, both included.
pub fn days(first: NaiveDate, last: NaiveDate) -> impl Iterator<Item = NaiveDate> {
    first.iter_days().take_while(move |d| *d <= last)
}

/// The days that have a partition (attached, or being detached).
pub async fn existing<'e, E>(executor: E) -> Result<BTreeSet<NaiveDate>, AuditError>
where
    E: sqlx::PgExecutor<'e>,
{
    let names: Vec<(String,)> = sqlx::query_as(
        "SELECT c.relname::text FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid \
         WHERE i.inhparent = 'audit_events'::regclass",
    )
    .fetch_all(executor)
    .await?;
    Ok(names.iter().filter_map(|(n,)| day_of(n)).collect())
}

/// Days made in one transaction. Each day's table and indexes hold about
/// nine locks until the commit: a retention of years in one transaction
/// would pass PostgreSQL's lock table (64 a connection by default) and
/// fail with "out of shared memory", for every session of the server.
const DAYS_PER_TRANSACTION: usize = 31;

/// Make the partitions of `wanted` days that do not exist, a month of days
/// a transaction; the days made.
/// With `write_timeout` (the writer's `audit.write_timeout`), PostgreSQL ends the
/// transaction's lock waits and statements past it, as the batch's: a
/// writer that gave up must not leave a server process waiting on the lock
/// behind it (a retention cut holds it while its detach waits on readers).
pub async fn ensure(
    pool: &PgPool,
    wanted: impl IntoIterator<Item = NaiveDate>,
    write_timeout: Option<Duration>,
) -> Result<Vec<NaiveDate>, AuditError> {
    let wanted: BTreeSet<NaiveDate> = wanted.into_iter().collect();
    let missing: Vec<NaiveDate> = wanted.difference(&existing(pool).await?).copied().collect();
    let mut made = Vec::new();
    for days in missing.chunks(DAYS_PER_TRANSACTION) {
        let mut conn = super::closing::ClosedUnlessDone::acquire(pool).await?;
        // Begun before anything else: a refused BEGIN (its SET LOCAL) leaves
        // the connection in an aborted transaction sqlx does not know of, and
        // `?` then drops it closed instead of pooling it.
        let tx = super::postgres::begin(&mut conn, write_timeout).await?;
        let these = make(tx, &days.iter().copied().collect()).await;
        conn.done();
        made.extend(these?);
    }
    Ok(made)
}

/// The days of `wanted` that have no partition yet, made in one
/// transaction under a lock, so that instances making the same day at once
/// make it once.
async fn make(
    mut tx: sqlx::Transaction<'_, sqlx::Postgres>,
    wanted: &BTreeSet<NaiveDate>,
) -> Result<Vec<NaiveDate>, AuditError> {
    sqlx::query("SELECT pg_advisory_xact_lock($1)")
        .bind(CREATE_LOCK)
        .execute(&mut *tx)
        .await?;
    let have = existing(&mut *tx).await?;
    let missing: Vec<NaiveDate> = wanted.difference(&have).copied().collect();
    for day in &missing {
        let table = name(*day);
        // A table of that name may be there, detached by a cut that died
        // before dropping it: its rows are the day's, so it is attached again.
        sqlx::query(&format!(
            "CREATE TABLE IF NOT EXISTS {table} \
             (LIKE audit_events INCLUDING DEFAULTS INCLUDING CONSTRAINTS)"
        ))
        .execute(&mut *tx)
        .await?;
        let next = day.checked_add_days(Days::new(1)).unwrap_or(*day);
        sqlx::query(&format!(
            "ALTER TABLE audit_events ATTACH PARTITION {table} FOR VALUES FROM ('{}') TO ('{}')",
            bound(*day),
            bound(next)
        ))
        .execute(&mut *tx)
        .await?;
    }
    tx.commit().await?;
    Ok(missing)
}

/// A dropped partition: its day and the rows it held, as the database's
/// statistics estimate them (counting would read the whole day).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Dropped {
    /// The day it held.
    pub day: NaiveDate,
    /// Rows, estimated.
    pub rows: u64,
}

/// Drop every partition whose whole day lies before `cutoff`, on a
/// connection that holds the retention lock. A detach an earlier cut left
/// half done (the process died in it) is finished first.
pub async fn drop_before(
    conn: &mut sqlx::PgConnection,
    cutoff: NaiveDate,
) -> Result<Vec<Dropped>, AuditError> {
    let pending: Vec<(String,)> = sqlx::query_as(
        "SELECT c.relname::text FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid \
         WHERE i.inhparent = 'audit_events'::regclass AND i.inhdetachpending",
    )
    .fetch_all(&mut *conn)
    .await?;
    for (table,) in pending {
        // The name rebuilt from its day: only names this module makes.
        if let Some(day) = day_of(&table) {
            let table = name(day);
            sqlx::query(&format!(
                "ALTER TABLE audit_events DETACH PARTITION {table} FINALIZE"
            ))
            .execute(&mut *conn)
            .await?;
            sqlx::query(&format!("DROP TABLE IF EXISTS {table}"))
                .execute(&mut *conn)
                .await?;
        }
    }
    // Tables a cut detached and died before dropping: no longer partitions,
    // but their days' rows, kept past retention unless dropped here.
    let orphans: Vec<(String,)> = sqlx::query_as(
        "SELECT c.relname::text FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace \
         WHERE n.nspname = current_schema() AND c.relkind = 'r' \
         AND c.relname LIKE 'audit\\_events\\_p%' \
         AND NOT EXISTS (SELECT 1 FROM pg_inherits i WHERE i.inhrelid = c.oid)",
    )
    .fetch_all(&mut *conn)
    .await?;
    let mut dropped = Vec::new();
    for (table,) in orphans {
        let Some(day) = day_of(&table).filter(|d| *d < cutoff) else {
            continue;
        };
        sqlx::query(&format!("DROP TABLE IF EXISTS {}", name(day)))
            .execute(&mut *conn)
            .await?;
        dropped.push(Dropped { day, rows: 0 });
    }
    for day in existing(&mut *conn).await? {
        if day >= cutoff {
            break;
        }
        let table = name(day);
        let (estimate,): (f32,) =
            sqlx::query_as("SELECT reltuples FROM pg_class WHERE relname = $1")
                .bind(&table)
                .fetch_one(&mut *conn)
                .await?;
        // Partition creation waits meanwhile: an ATTACH inside a creating
        // transaction and this detach would otherwise wait for each other.
        sqlx::query("SELECT pg_advisory_lock($1)")
            .bind(CREATE_LOCK)
            .execute(&mut *conn)
            .await?;
        let detached = sqlx::query(&format!(
            "ALTER TABLE audit_events DETACH PARTITION {table} CONCURRENTLY"
        ))
        .execute(&mut *conn)
        .await;
        sqlx::query("SELECT pg_advisory_unlock($1)")
            .bind(CREATE_LOCK)
            .execute(&mut *conn)
            .await?;
        detached?;
        sqlx::query(&format!("DROP TABLE {table}"))
            .execute(&mut *conn)
            .await?;
        dropped.push(Dropped {
            day,
            rows: estimate.max(0.0) as u64,
        });
    }
    Ok(dropped)
}

/// Whether an insert failed for want of a partition for one of its rows.
pub fn is_missing_partition(e: &AuditError) -> bool {
    match e {
        // 23514: check_violation, "no partition of relation … found for
        // row" (the message may be translated, the code is not). A CHECK
        // constraint an operator added (audit.md) raises it too, naming
        // itself: no partition would mend that row, and taking it for a
        // missing one cost each refused insert a catalog read and a retry.
        AuditError::Database(sqlx::Error::Database(e)) => {
            e.code().as_deref() == Some("23514") && e.constraint().is_none()
        }
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A database error with a code and, perhaps, a constraint's name.
    #[derive(Debug)]
    struct Refused {
        code: &'static str,
        constraint: Option<&'static str>,
    }

    impl std::fmt::Display for Refused {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            write!(f, "{}", self.code)
        }
    }

    impl std::error::Error for Refused {}

    impl sqlx::error::DatabaseError for Refused {
        fn message(&self) -> &str {
            "refused"
        }
        fn code(&self) -> Option<std::borrow::Cow<'_, str>> {
            Some(self.code.into())
        }
        fn constraint(&self) -> Option<&str> {
            self.constraint
        }
        fn as_error(&self) -> &(dyn std::error::Error + Send + Sync + 'static) {
            self
        }
        fn as_error_mut(&mut self) -> &mut (dyn std::error::Error + Send + Sync + 'static) {
            self
        }
        fn into_error(self: Box<Self>) -> Box<dyn std::error::Error + Send + Sync + 'static> {
            self
        }
        fn kind(&self) -> sqlx::error::ErrorKind {
            sqlx::error::ErrorKind::CheckViolation
        }
    }

    fn refused(code: &'static str, constraint: Option<&'static str>) -> AuditError {
        AuditError::Database(sqlx::Error::Database(Box::new(Refused {
            code,
            constraint,
        })))
    }

    #[test]
    fn only_a_check_violation_naming_no_constraint_is_a_missing_partition() {
        assert!(is_missing_partition(&refused("23514", None)));
        assert!(!is_missing_partition(&refused(
            "23514",
            Some("audit_events_user_short")
        )));
        assert!(!is_missing_partition(&refused("23505", None)));
    }

    #[test]
    fn a_partition_is_named_after_its_day_and_read_back() {
        let day = NaiveDate::from_ymd_opt(2026, 11, 5).unwrap();
        assert_eq!(name(day), "audit_events_p20261105");
        assert_eq!(day_of(&name(day)), Some(day));
        assert_eq!(day_of("audit_events_unpartitioned"), None);
        assert_eq!(bound(day), "2026-11-05 00:00:00+00");
        assert_eq!(days(day, day).count(), 1);
    }
}
