//! The overview's counts (`audit::stats`) in SQL, counted by the database:
//! only the counts cross the wire. The two databases keep times differently
//! (TIMESTAMPTZ there, fixed-width UTC text here), so each names the
//! expression that turns `occurred_at` into milliseconds since 1970; the
//! queries around it are written once.

use chrono::{DateTime, TimeZone, Utc};
use sqlx::QueryBuilder;

use super::{corrupt, AuditDb, AuditError};
use crate::audit::stats::{BucketCount, Limits, OpenLock, Overview, Ranked, Span, REFUSALS};
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

fn subject_from_columns(
    (kind, id, count): (String, String, i64),
) -> Result<Ranked<Subject>, AuditError> {
    let kind = SubjectKind::parse(&kind).ok_or_else(|| corrupt("subject_kind", &kind))?;
    Ok(Ranked {
        key: Subject::new(kind, id),
        count: count.max(0) as u64,
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

/// Buckets in order; within one, actions and then decisions by name (the
/// databases' collations differ, so the order is not left to them).
fn sorted(mut buckets: Vec<BucketCount>) -> Vec<BucketCount> {
    buckets.sort_by_key(|b| (b.bucket, b.action.as_str(), b.decision.as_str()));
    buckets
}

/// `bind_time` and `EPOCH_MS` come from the database's module: its time bind
/// type and the SQL that reads `occurred_at` as milliseconds since 1970.
macro_rules! stats_queries {
    ($db:ty, $pool:ty) => {
        /// ` WHERE` the row is a refusal (not shadow) within `[from, until)`.
        fn refusals_within<'a>(
            qb: &mut QueryBuilder<'a, $db>,
            from: DateTime<Utc>,
            until: DateTime<Utc>,
        ) {
            qb.push(" WHERE occurred_at >= ")
                .push_bind(bind_time(from))
                .push(" AND occurred_at < ")
                .push_bind(bind_time(until))
                .push(" AND shadow = ")
                .push_bind(false)
                .push(" AND decision IN (");
            let mut decisions = qb.separated(", ");
            for decision in REFUSALS {
                decisions.push_bind(decision.as_str());
            }
            qb.push(")");
        }

        async fn buckets(pool: &$pool, span: &Span) -> Result<Vec<BucketCount>, AuditError> {
            let mut qb = QueryBuilder::<$db>::new("SELECT (");
            qb.push(EPOCH_MS)
                .push(" - ")
                .push_bind(span.start.timestamp_millis())
                .push(") / ")
                .push_bind(span.bucket_ms)
                .push(" AS bucket, action, decision, COUNT(*) AS n FROM audit_events");
            refusals_within(&mut qb, span.start, span.end());
            qb.push(" GROUP BY 1, action, decision");
            let rows: Vec<BucketColumns> = qb.build_query_as().fetch_all(pool).await?;
            let buckets: Result<Vec<_>, _> = rows.into_iter().map(bucket_from_columns).collect();
            Ok(sorted(buckets?))
        }

        async fn top_subjects(
            pool: &$pool,
            span: &Span,
            limit: usize,
        ) -> Result<Vec<Ranked<Subject>>, AuditError> {
            let mut qb = QueryBuilder::<$db>::new(
                "SELECT subject_kind, subject, COUNT(*) AS n FROM audit_events",
            );
            refusals_within(&mut qb, span.start, span.end());
            qb.push(" AND subject_kind NOT IN (")
                .push_bind(SubjectKind::Ip.as_str())
                .push(", ")
                .push_bind(SubjectKind::Prefix.as_str())
                .push(") GROUP BY subject_kind, subject ORDER BY n DESC, subject_kind, subject LIMIT ")
                .push_bind(limit as i64);
            let rows: Vec<(String, String, i64)> = qb.build_query_as().fetch_all(pool).await?;
            rows.into_iter().map(subject_from_columns).collect()
        }

        async fn top_ips(
            pool: &$pool,
            span: &Span,
            limit: usize,
        ) -> Result<Vec<Ranked<String>>, AuditError> {
            let mut qb = QueryBuilder::<$db>::new("SELECT ip, COUNT(*) AS n FROM audit_events");
            refusals_within(&mut qb, span.start, span.end());
            qb.push(" AND ip IS NOT NULL GROUP BY ip ORDER BY n DESC, ip LIMIT ")
                .push_bind(limit as i64);
            let rows: Vec<(String, i64)> = qb.build_query_as().fetch_all(pool).await?;
            Ok(rows.into_iter().map(ranked_from_columns).collect())
        }

        /// A phone counts for its first `prefix_digits` digits (and the
        /// plus), as `PhoneNumber::prefix` cuts it; a prefix subject as it is.
        async fn top_prefixes(
            pool: &$pool,
            span: &Span,
            prefix_digits: u32,
            limit: usize,
        ) -> Result<Vec<Ranked<String>>, AuditError> {
            let length = i32::try_from(prefix_digits.saturating_add(1)).unwrap_or(i32::MAX);
            let mut qb = QueryBuilder::<$db>::new("SELECT CASE WHEN subject_kind = ");
            qb.push_bind(SubjectKind::Phone.as_str())
                .push(" THEN substr(subject, 1, ")
                .push_bind(length)
                .push(") ELSE subject END AS prefix, COUNT(*) AS n FROM audit_events");
            refusals_within(&mut qb, span.start, span.end());
            qb.push(" AND subject_kind IN (")
                .push_bind(SubjectKind::Phone.as_str())
                .push(", ")
                .push_bind(SubjectKind::Prefix.as_str())
                .push(") GROUP BY 1 ORDER BY n DESC, prefix LIMIT ")
                .push_bind(limit as i64);
            let rows: Vec<(String, i64)> = qb.build_query_as().fetch_all(pool).await?;
            Ok(rows.into_iter().map(ranked_from_columns).collect())
        }

        /// Lock rows still running at `now` with no unblock of their
        /// subject at or after them, latest end per subject. The decisions
        /// are written into the SQL so that the partial index on lock rows
        /// (`audit_events_locks`) applies.
        async fn open_locks(
            pool: &$pool,
            now: DateTime<Utc>,
            limit: usize,
        ) -> Result<Vec<OpenLock>, AuditError> {
            let lock = AuditDecision::Lock.as_str();
            let unblock = AuditDecision::Unblock.as_str();
            let mut qb = QueryBuilder::<$db>::new(format!(
                "SELECT l.subject_kind, l.subject, MAX({EPOCH_MS} + l.retry_after_ms) AS until_ms \
                 FROM audit_events l WHERE l.decision = '{lock}' AND l.retry_after_ms IS NOT NULL \
                 AND NOT EXISTS (SELECT 1 FROM audit_events u WHERE u.decision = '{unblock}' \
                 AND u.subject_kind = l.subject_kind AND u.subject = l.subject \
                 AND u.occurred_at >= l.occurred_at) AND l.shadow = "
            ));
            qb.push_bind(false)
                .push(format!(" AND {EPOCH_MS} + l.retry_after_ms > "))
                .push_bind(now.timestamp_millis())
                .push(" GROUP BY l.subject_kind, l.subject ORDER BY until_ms DESC, l.subject_kind, l.subject LIMIT ")
                .push_bind(limit as i64);
            let rows: Vec<(String, String, i64)> = qb.build_query_as().fetch_all(pool).await?;
            rows.into_iter().map(lock_from_columns).collect()
        }

        /// The overview's five questions, asked at once.
        pub async fn overview(
            pool: &$pool,
            span: &Span,
            now: DateTime<Utc>,
            prefix_digits: u32,
            limits: Limits,
        ) -> Result<Overview, AuditError> {
            let (buckets, subjects, ips, prefixes, locks) = futures::try_join!(
                buckets(pool, span),
                top_subjects(pool, span, limits.top),
                top_ips(pool, span, limits.top),
                top_prefixes(pool, span, prefix_digits, limits.top),
                open_locks(pool, now, limits.locks),
            )?;
            Ok(Overview {
                buckets,
                subjects,
                ips,
                prefixes,
                locks,
            })
        }
    };
}

pub mod postgres {
    use super::*;
    use sqlx::{PgPool, Postgres};

    /// Whole milliseconds (the column keeps microseconds; the trail writes
    /// milliseconds).
    const EPOCH_MS: &str = "CAST(FLOOR(EXTRACT(EPOCH FROM occurred_at) * 1000) AS BIGINT)";

    fn bind_time(t: DateTime<Utc>) -> DateTime<Utc> {
        t
    }

    stats_queries!(Postgres, PgPool);
}

pub mod sqlite {
    use super::*;
    use sqlx::{Sqlite, SqlitePool};

    /// `2026-11-22T10:01:40.112Z`: whole seconds from `strftime`, then the
    /// three digits after the point (characters 21 to 23), exactly.
    const EPOCH_MS: &str = "(CAST(strftime('%s', occurred_at) AS INTEGER) * 1000 \
                            + CAST(substr(occurred_at, 21, 3) AS INTEGER))";

    fn bind_time(t: DateTime<Utc>) -> String {
        super::super::sqlite::bind_time(t)
    }

    stats_queries!(Sqlite, SqlitePool);
}

impl AuditDb {
    /// The overview of `span` ([`Overview`]), and the locks still running at
    /// `now`; `prefix_digits` cuts phones into prefixes.
    pub async fn overview(
        &self,
        span: &Span,
        now: DateTime<Utc>,
        prefix_digits: u32,
        limits: Limits,
    ) -> Result<Overview, AuditError> {
        match self {
            Self::Postgres(pool) => {
                postgres::overview(pool, span, now, prefix_digits, limits).await
            }
            Self::Sqlite(pool) => sqlite::overview(pool, span, now, prefix_digits, limits).await,
        }
    }
}
