//! What the console's overview and `/admin/api/stats` ask of the trail:
//! refusals counted per time bucket, by action and decision; the subjects,
//! client IPs and phone prefixes refused most; and the locks that have not
//! run out. Counts and top lists are read from the rollups written with the
//! rows (`rollup`), so they cost the same whatever the trail holds; the
//! counts are exact, the top lists exact unless their `TopErrors` say by how
//! much they may fall short. This module names the questions and the
//! answers; `db::stats` asks them in each database's SQL.
//!
//! A refusal is a row whose decision is `deny`, `challenge` or `lock` and
//! that was not recorded in shadow mode (shadow rows let the request
//! through). Counts are rows: one request refused on two subjects counts
//! once for each.

use chrono::{DateTime, TimeZone, Utc};

use super::AuditDecision;
use crate::domain::{Action, Subject};

/// A stretch of time cut into equal buckets: `[start, start + buckets ×
/// bucket_ms)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Span {
    /// Where the first bucket begins (inclusive).
    pub start: DateTime<Utc>,
    /// Each bucket's length.
    pub bucket_ms: i64,
    /// How many buckets.
    pub buckets: u32,
}

impl Span {
    /// `buckets` buckets of `bucket_ms`, aligned to multiples of `bucket_ms`
    /// since 1970 (whole hours for an hour, say), the last one holding
    /// `now`: a chart's columns then start at round times, and the last one
    /// fills as the current bucket does.
    pub fn ending_at(now: DateTime<Utc>, bucket_ms: i64, buckets: u32) -> Self {
        let bucket_ms = bucket_ms.max(1);
        let current = super::rollup::floor_to(now.timestamp_millis(), bucket_ms);
        let start_ms = current - bucket_ms * (i64::from(buckets) - 1);
        Self {
            start: Utc
                .timestamp_millis_opt(start_ms)
                .single()
                .unwrap_or(DateTime::<Utc>::MIN_UTC),
            bucket_ms,
            buckets,
        }
    }

    /// Where bucket `index` begins.
    pub fn bucket_start(&self, index: u32) -> DateTime<Utc> {
        self.start + chrono::Duration::milliseconds(self.bucket_ms * i64::from(index))
    }

    /// Where the last bucket ends (exclusive).
    pub fn end(&self) -> DateTime<Utc> {
        self.bucket_start(self.buckets)
    }
}

/// Refusals of one action and decision in one bucket.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BucketCount {
    /// The bucket's index in its [`Span`], from 0.
    pub bucket: u32,
    /// What was asked.
    pub action: Action,
    /// What was decided.
    pub decision: AuditDecision,
    /// How many rows.
    pub count: u64,
}

/// One entry of a top list and how many refusals it had.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ranked<T> {
    /// The subject, address or prefix.
    pub key: T,
    /// Its refusals in the span.
    pub count: u64,
}

/// A subject with a `lock` row whose lock has not run out by the time asked
/// about, and no `unblock` row since.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OpenLock {
    /// The locked user, blocked IP, or blocked prefix or country.
    pub subject: Subject,
    /// When its latest lock runs out: the row's time plus its
    /// `retry_after_ms` (for an IP, how long the block can last at most).
    pub until: DateTime<Utc>,
}

/// How many entries each list of the overview holds at most.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Top subjects, IPs and prefixes, each.
    pub top: usize,
    /// Open locks (0: the locks are not asked for).
    pub locks: usize,
}

/// Everything the overview shows from the trail for one span.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Overview {
    /// Refusals per bucket, action and decision; buckets without any are
    /// left out. Ordered by bucket, then action, then decision.
    pub buckets: Vec<BucketCount>,
    /// Subjects other than IPs and prefixes (those have their own lists),
    /// most refused first.
    pub subjects: Vec<Ranked<Subject>>,
    /// Client addresses of refused requests, most refused first.
    pub ips: Vec<Ranked<String>>,
    /// Phone prefixes (`sms.prefix_digits`, as prefix subjects have them) of
    /// refused phones and prefixes, most refused first.
    pub prefixes: Vec<Ranked<String>>,
    /// Locks not run out at the span's query time, latest-ending first.
    pub locks: Vec<OpenLock>,
    /// Whether more lock rows run than were read (one subject's thousands
    /// of pair locks, say): `locks` may then be fewer than asked for, and
    /// others run besides.
    pub locks_cut: bool,
    /// How far the top lists' counts may fall short.
    pub errors: TopErrors,
}

/// The top lists' error bounds over a span: every count shown is at most
/// the true one, and at least the true one minus its list's bound. Zero:
/// the list is exact. Each bound is at most the span's refusals /
/// (`rollup::TOP_CAPACITY` + 1).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct TopErrors {
    /// Of `subjects`.
    pub subjects: u64,
    /// Of `ips`.
    pub ips: u64,
    /// Of `prefixes`.
    pub prefixes: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(rfc3339: &str) -> DateTime<Utc> {
        DateTime::parse_from_rfc3339(rfc3339)
            .unwrap()
            .with_timezone(&Utc)
    }

    #[test]
    fn a_span_ends_with_the_bucket_that_holds_now_and_starts_on_a_round_time() {
        let hour = 3_600_000;
        let span = Span::ending_at(at("2026-11-22T10:23:45.678Z"), hour, 24);
        assert_eq!(span.start, at("2026-11-21T11:00:00Z"));
        assert_eq!(span.end(), at("2026-11-22T11:00:00Z"));
        assert_eq!(span.bucket_start(23), at("2026-11-22T10:00:00Z"));

        // On a boundary, now opens the last bucket.
        let span = Span::ending_at(at("2026-11-22T10:00:00Z"), 5 * 60_000, 12);
        assert_eq!(span.start, at("2026-11-22T09:05:00Z"));
        assert_eq!(span.end(), at("2026-11-22T10:05:00Z"));
    }
}
