//! The overview's questions (`audit::stats`) in SQL, answered by the
//! database: only the answers cross the wire. Counts and top lists come from
//! the rollups (`audit_counts`, `audit_top`, `audit_top_error`), whose times
//! are milliseconds since 1970 in both databases; the open locks from the
//! lock rows' `lock_until_ms`, through an index of lock rows' ends. The
//! queries are written once for both.

use std::time::Duration;

use chrono::{DateTime, TimeZone, Utc};
use sqlx::QueryBuilder;

use super::{corrupt, AuditDb, AuditError};
use crate::audit::rollup::{self, TopList};
use crate::audit::stats::{BucketCount, Limits, OpenLock, Overview, Ranked, Span, TopErrors};
use crate::audit::AuditDecision;
use crate::domain::{Action, Subject, SubjectKind};

/// `(bucket, action, decision, count)`.
type BucketColumns = (i64, String, String, i64);

fn bucket_from_columns(
    (bucket, action, decision, count): BucketColumns,
) -> Result<BucketCount, AuditError> {
    Ok(BucketCount {
        bucket: u32::try_from(bucket).map_err(|_| corrupt("bucket", &bucket.to_string()))?,
        action: Action::parse(&action).ok_or_else(|| corrupt("action", &action))?,
        decision: AuditDecision::parse(&decision).ok_or_else(|| corrupt("decision", &decision))?,
        count: count.max(0) as u64,
    })
}

/// A subject summary's key is `kind:id`.
fn subject_from_key(ranked: Ranked<String>) -> Result<Ranked<Subject>, AuditError> {
    let (kind, id) = ranked
        .key
        .split_once(':')
        .ok_or_else(|| corrupt("top subject", &ranked.key))?;
    let kind = SubjectKind::parse(kind).ok_or_else(|| corrupt("subject_kind", kind))?;
    Ok(Ranked {
        key: Subject::new(kind, id),
        count: ranked.count,
    })
}

fn ranked_from_columns((key, count): (String, i64)) -> Ranked<String> {
    Ranked {
        key,
        count: count.max(0) as u64,
    }
}

fn lock_from_columns((kind, id, until_ms): (String, String, i64)) -> Result<OpenLock, AuditError> {
    let kind = SubjectKind::parse(&kind).ok_or_else(|| corrupt("subject_kind", &kind))?;
    let until = Utc
        .timestamp_millis_opt(until_ms)
        .single()
        .ok_or_else(|| corrupt("lock end", &until_ms.to_string()))?;
    Ok(OpenLock {
        subject: Subject::new(kind, id),
        until,
    })
}

/// Rows newest end first → the first `limit` subjects, each with its
/// latest end (its first row); ties by subject as the list shows them.
fn latest_per_subject(
    rows: Vec<(String, String, i64)>,
    limit: usize,
) -> Result<Vec<OpenLock>, AuditError> {
    let mut seen = std::collections::HashSet::new();
    let mut locks = Vec::new();
    for row in rows {
        if locks.len() == limit {
            break;
        }
        if seen.insert((row.0.clone(), row.1.clone())) {
            locks.push(lock_from_columns(row)?);
        }
    }
    locks.sort_by(|a, b| {
        b.until
            .cmp(&a.until)
            .then_with(|| a.subject.kind.as_str().cmp(b.subject.kind.as_str()))
            .then_with(|| a.subject.id.cmp(&b.subject.id))
    });
    Ok(locks)
}

/// Buckets in order; within one, actions and then decisions by name (the
/// databases' collations differ, so the order is not left to them).
fn sorted(mut buckets: Vec<BucketCount>) -> Vec<BucketCount> {
    buckets.sort_by_key(|b| (b.bucket, b.action.as_str(), b.decision.as_str()));
    buckets
}

/// The most lock rows the overview reads: a client with many addresses
/// can give one user thousands of pair locks, each a row on the user, and
/// every view would read them all. Past it the list shows the subjects
/// those rows name and says it is cut.
const MOST_LOCK_ROWS: usize = 4096;

/// The queries, instantiated per database.
/// `$key_order` orders tied keys of a top list by their bytes, as SQLite's
/// `BINARY` does: PostgreSQL's default collation is the cluster's, often a
/// language's, and the two would then show different keys at the cut.
macro_rules! stats_queries {
    ($db:ty, $conn:ty, $key_order:literal) => {
        /// ` WHERE` a summary tiles the span (`rollup::tiles`).
        fn summaries_within<'a>(qb: &mut QueryBuilder<'a, $db>, span: &Span) {
            qb.push(" WHERE (");
            let tiles = rollup::tiles(span.start.timestamp_millis(), span.end().timestamp_millis());
            if tiles.is_empty() {
                qb.push("1 = 0");
            }
            for (i, (width_ms, first, end)) in tiles.into_iter().enumerate() {
                if i > 0 {
                    qb.push(" OR ");
                }
                qb.push("(width_ms = ")
                    .push_bind(width_ms)
                    .push(" AND start_ms >= ")
                    .push_bind(first)
                    .push(" AND start_ms < ")
                    .push_bind(end)
                    .push(")");
            }
            qb.push(")");
        }

        async fn buckets(conn: &mut $conn, span: &Span) -> Result<Vec<BucketCount>, AuditError> {
            let mut qb = QueryBuilder::<$db>::new("SELECT (bucket_ms - ");
            qb.push_bind(span.start.timestamp_millis())
                .push(") / ")
                .push_bind(span.bucket_ms)
                .push(
                    " AS bucket, action, decision, CAST(SUM(n) AS BIGINT) AS n \
                     FROM audit_counts WHERE bucket_ms >= ",
                )
                .push_bind(span.start.timestamp_millis())
                .push(" AND bucket_ms < ")
                .push_bind(span.end().timestamp_millis())
                .push(" AND shadow = ")
                .push_bind(false)
                .push(" AND decision IN (");
            let mut decisions = qb.separated(", ");
            for decision in AuditDecision::REFUSALS {
                decisions.push_bind(decision.as_str());
            }
            qb.push(") GROUP BY 1, action, decision");
            let rows: Vec<BucketColumns> = qb.build_query_as().fetch_all(&mut *conn).await?;
            let buckets: Result<Vec<_>, _> = rows.into_iter().map(bucket_from_columns).collect();
            Ok(sorted(buckets?))
        }

        /// The `limit` keys of `list` with the largest summed counts.
        async fn top(
            conn: &mut $conn,
            span: &Span,
            list: TopList,
            limit: usize,
        ) -> Result<Vec<Ranked<String>>, AuditError> {
            let mut qb = QueryBuilder::<$db>::new(
                "SELECT key, CAST(SUM(n) AS BIGINT) AS total FROM audit_top",
            );
            summaries_within(&mut qb, span);
            qb.push(" AND list = ")
                .push_bind(list.as_str())
                .push(concat!(" GROUP BY key ORDER BY total DESC, ", $key_order, " LIMIT "))
                .push_bind(limit as i64);
            let rows: Vec<(String, i64)> = qb.build_query_as().fetch_all(&mut *conn).await?;
            Ok(rows.into_iter().map(ranked_from_columns).collect())
        }

        async fn errors(conn: &mut $conn, span: &Span) -> Result<TopErrors, AuditError> {
            let mut qb = QueryBuilder::<$db>::new(
                "SELECT list, CAST(SUM(dropped) AS BIGINT) FROM audit_top_error",
            );
            summaries_within(&mut qb, span);
            qb.push(" GROUP BY list");
            let rows: Vec<(String, i64)> = qb.build_query_as().fetch_all(&mut *conn).await?;
            let mut errors = TopErrors::default();
            for (list, dropped) in rows {
                let dropped = dropped.max(0) as u64;
                match list.as_str() {
                    "subject" => errors.subjects = dropped,
                    "ip" => errors.ips = dropped,
                    "prefix" => errors.prefixes = dropped,
                    other => return Err(corrupt("top list", other)),
                }
            }
            Ok(errors)
        }

        /// Lock rows still running at `now` with no unblock of their
        /// subject at or after them, latest end per subject, at most
        /// `limit` subjects. Read newest end first through the index of lock
        /// rows' ends (`audit_events_open_locks`), a few rows per subject
        /// asked, so that the cost follows `limit`, not how many locks run
        /// (a flood locks hundreds of thousands); asked again with more
        /// rows when subjects with several lock rows fill the first read.
        /// The admin sign-in throttle's locks are left out: the store's
        /// state does not report that throttle, so none of them would be
        /// confirmed, and anyone who can reach the admin routes could push
        /// the users' locks off the list with them.
        async fn open_locks(
            conn: &mut $conn,
            now: DateTime<Utc>,
            limit: usize,
        ) -> Result<(Vec<OpenLock>, bool), AuditError> {
            let lock = AuditDecision::Lock.as_str();
            let unblock = AuditDecision::Unblock.as_str();
            let admin = Action::Admin.as_str();
            let mut rows_asked = limit.saturating_mul(4).max(16);
            loop {
                let mut qb = QueryBuilder::<$db>::new(format!(
                    "SELECT l.subject_kind, l.subject, l.lock_until_ms \
                     FROM audit_events l WHERE l.decision = '{lock}' AND l.action <> '{admin}' \
                     AND l.lock_until_ms > "
                ));
                qb.push_bind(now.timestamp_millis())
                    .push(format!(
                        " AND NOT EXISTS (SELECT 1 FROM audit_events u WHERE u.decision = '{unblock}' \
                         AND u.subject_kind = l.subject_kind AND u.subject = l.subject \
                         AND u.occurred_at >= l.occurred_at) AND l.shadow = "
                    ))
                    .push_bind(false)
                    .push(" ORDER BY l.lock_until_ms DESC, l.subject_kind, l.subject LIMIT ")
                    .push_bind(rows_asked as i64);
                let rows: Vec<(String, String, i64)> = qb.build_query_as().fetch_all(&mut *conn).await?;
                let exhausted = rows.len() < rows_asked;
                let locks = latest_per_subject(rows, limit)?;
                if locks.len() >= limit || exhausted {
                    return Ok((locks, false));
                }
                if rows_asked >= MOST_LOCK_ROWS {
                    return Ok((locks, true));
                }
                rows_asked = rows_asked.saturating_mul(4).min(MOST_LOCK_ROWS);
            }
        }

        /// The overview's questions, one after another on one connection:
        /// an admin's overview holds one of the pool's connections, not
        /// six (the writer and the sessions share the pool).
        pub async fn overview(
            conn: &mut $conn,
            span: &Span,
            now: DateTime<Utc>,
            limits: Limits,
        ) -> Result<Overview, AuditError> {
            let buckets = buckets(&mut *conn, span).await?;
            let subjects = top(&mut *conn, span, TopList::Subject, limits.top).await?;
            let ips = top(&mut *conn, span, TopList::Ip, limits.top).await?;
            let prefixes = top(&mut *conn, span, TopList::Prefix, limits.top).await?;
            let (locks, locks_cut) = if limits.locks == 0 {
                (Vec::new(), false)
            } else {
                open_locks(&mut *conn, now, limits.locks).await?
            };
            let errors = errors(&mut *conn, span).await?;
            let subjects: Result<Vec<_>, _> = subjects.into_iter().map(subject_from_key).collect();
            Ok(Overview {
                buckets,
                subjects: subjects?,
                ips,
                prefixes,
                locks,
                locks_cut,
                errors,
            })
        }
    };
}

pub mod postgres {
    use super::*;
    use sqlx::{PgConnection, Postgres};

    stats_queries!(Postgres, PgConnection, "key COLLATE \"C\"");
}

pub mod sqlite {
    use super::*;
    use sqlx::{Sqlite, SqliteConnection};

    stats_queries!(Sqlite, SqliteConnection, "key");
}

impl AuditDb {
    /// The overview of `span` ([`Overview`]), and the locks still running at
    /// `now`. On PostgreSQL each statement is ended at `bound`
    /// (`audit.read_timeout`), as an admin's page of events is, and the
    /// whole at twice it; on SQLite the whole at `bound`.
    pub async fn overview(
        &self,
        span: &Span,
        now: DateTime<Utc>,
        limits: Limits,
        bound: Duration,
    ) -> Result<Overview, AuditError> {
        match self {
            Self::Postgres(pool) => {
                // As a page of events: closed, not pooled again, if the
                // admin goes away mid-read or `BEGIN` fails.
                let mut conn = super::closing::ClosedUnlessDone::acquire(pool).await?;
                let mut tx = super::postgres::begin(&mut conn, Some(bound)).await?;
                let read = async move {
                    let overview = postgres::overview(&mut tx, span, now, limits).await?;
                    tx.commit().await?;
                    Ok(overview)
                };
                // The bound holds for each statement; the overview's several
                // are given it once more in all, past which the connection
                // is closed, not pooled.
                let whole = bound.saturating_mul(2);
                let Ok(read) = tokio::time::timeout(whole, read).await else {
                    return Err(AuditError::TimedOut(whole));
                };
                conn.done();
                read
            }
            Self::Sqlite(pool) => {
                // One deadline for the connection: the bound holds from
                // the first statement for all of them.
                let mut conn = super::sqlite::bounded(pool, Some(bound)).await?;
                sqlite::overview(&mut conn, span, now, limits).await
            }
        }
    }
}
