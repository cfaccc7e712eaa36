//! A counting script's deadline, in Redis's own clock.
//!
//! A call that times out may still reach Redis later: a Redis paused by a
//! fork or a slow command, or a stalled network, runs what it was sent when
//! it wakes. By then the caller has answered 503 `store_unavailable`, so
//! what the script counts (a send, a login failure, the lock that failure
//! starts, a right code used up, a second copy of a code the caller kept
//! locally) would hold with no audit row, no notice, and no answer.
//! `reserve.lua`, `login_attempt.lua`, `otp_check.lua` and `otp_put.lua`
//! therefore take the moment after which nobody waits for them, in the
//! `TIME` they read; a call that finds that moment passed answers `late`
//! and changes nothing.
//!
//! The service's clock and Redis's are two clocks, possibly on two hosts.
//! This maps one onto the other by sampling Redis's `TIME` (at start-up,
//! then every [`RESAMPLE_AFTER`]; while no offset is known, after a `late`
//! answer that came while its caller still waited or a first sample that
//! failed, again once [`RETRY_AFTER`] has passed since the last try, so
//! that a slow Redis is sent at most a `TIME` a second, not one per
//! request; a later sample that fails keeps the offset there was until the
//! next minute's): Redis's time less this process's monotonic clock at the
//! sample's midpoint, trusted only from a sample whose round trip took at
//! most a quarter of the budget. The deadline it
//! gives is three quarters of the budget after the call starts, so a call
//! that does count has a quarter of the budget, less the sample's error,
//! for its answer to come back in time. Until a sample is taken, and after
//! a `late` answer that shows the estimate wrong, calls carry no deadline
//! (`0`) and behave as before: refusing every call on a bad estimate would
//! turn a clock's step into an outage.
//!
//! On Redis Cluster each primary runs the scripts of its own keys by its
//! own clock, and their clocks need not agree. Every sample reads every
//! primary's `TIME` and keeps the offset of the one furthest ahead: a node
//! ahead of the one read would otherwise find every deadline passed and
//! answer `late` to every counting call. A node behind by `d` ms runs a
//! stalled call's deadline `d` ms later than its caller's, the lesser
//! harm (NTP keeps them within milliseconds).

use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How often the offset is sampled again, for clocks that drift or step.
pub(super) const RESAMPLE_AFTER: Duration = Duration::from_secs(60);

/// How soon a sample that failed (no answer, or too slow a one) is tried
/// again.
pub(super) const RETRY_AFTER: Duration = Duration::from_secs(1);

/// The answer of a counting script that found its deadline passed.
pub(super) const LATE: &[u8] = b"late";

/// No offset known: calls carry no deadline.
const UNKNOWN: i64 = i64::MIN;

/// Where Redis's clock is against this process's.
pub(super) struct RedisClock {
    base: Instant,
    /// Redis's `TIME` in ms less `base`'s elapsed ms at the same moment.
    offset_ms: AtomicI64,
    /// `base`'s elapsed ms when the last sample was started.
    tried_at_ms: AtomicI64,
    /// A sample is on its way: one at a time. Cleared by the [`Sample`]
    /// that claimed it, however that ends.
    sampling: AtomicBool,
}

/// A sample of Redis's clock claimed by [`RedisClock::deadline_ms`]: the
/// next one can be claimed once this is dropped, finished or not (a task
/// cut off with its runtime must not stop sampling for good).
pub(super) struct Sample(Arc<RedisClock>);

impl Sample {
    /// The clock the sample is of.
    pub(super) fn clock(&self) -> &RedisClock {
        &self.0
    }

    /// Keep the offset of the reading furthest ahead among `readings` whose
    /// round trip took at most a quarter of `budget`; with none such, the
    /// offset there was stays, and when there is none the sample is tried
    /// again after [`RETRY_AFTER`].
    pub(super) fn finish(self, readings: impl IntoIterator<Item = Reading>, budget: Duration) {
        let offsets: Vec<i64> = readings
            .into_iter()
            .filter_map(|r| offset_from(r.sent_ms, r.redis_ms, r.received_ms, budget))
            .collect();
        let (Some(&behind), Some(&ahead)) = (offsets.iter().min(), offsets.iter().max()) else {
            return;
        };
        // Sampled once a minute: a warning a minute at most.
        if ahead - behind > budget.as_millis() as i64 / 4 {
            tracing::warn!(
                apart_ms = ahead - behind,
                "the Redis Cluster's primaries disagree on the time by more than a quarter of \
                 store.timeout: a call stalled on the ones behind counts that much after its \
                 caller gave up; check their NTP (docs/store.md)"
            );
        }
        self.0.offset_ms.store(ahead, Ordering::Relaxed);
    }
}

/// One node's `TIME` in ms, read between `sent_ms` and `received_ms` of
/// [`RedisClock::local_ms`].
#[derive(Debug, Clone, Copy)]
pub(super) struct Reading {
    pub(super) sent_ms: i64,
    pub(super) redis_ms: i64,
    pub(super) received_ms: i64,
}

impl Drop for Sample {
    fn drop(&mut self) {
        self.0.sampling.store(false, Ordering::Release);
    }
}

impl RedisClock {
    pub(super) fn new() -> Self {
        Self {
            base: Instant::now(),
            offset_ms: AtomicI64::new(UNKNOWN),
            tried_at_ms: AtomicI64::new(UNKNOWN),
            sampling: AtomicBool::new(false),
        }
    }

    /// Milliseconds of this process's monotonic clock.
    pub(super) fn local_ms(&self) -> i64 {
        i64::try_from(self.base.elapsed().as_millis()).unwrap_or(i64::MAX)
    }

    /// The deadline of a call that starts now with `budget`, in Redis's
    /// ms (0 when the offset is not known), and whether the caller is to
    /// take a sample: none yet, or the last one is old, and none is on its
    /// way: then the sample, claimed for the caller to take.
    pub(super) fn deadline_ms(self: &Arc<Self>, budget: Duration) -> (i64, Option<Sample>) {
        let now = self.local_ms();
        let offset = self.offset_ms.load(Ordering::Relaxed);
        let tried = self.tried_at_ms.load(Ordering::Relaxed);
        let claimed = sample_due(now, tried, offset != UNKNOWN)
            && !self.sampling.swap(true, Ordering::Acquire);
        let sample = claimed.then(|| {
            self.tried_at_ms.store(now, Ordering::Relaxed);
            Sample(Arc::clone(self))
        });
        (deadline_from(now, offset, budget), sample)
    }

    /// A script answered `late` while its caller still waited: the offset
    /// may be wrong (a clock stepped). Carry no deadline until the next
    /// sample, due once [`RETRY_AFTER`] has passed since the last.
    pub(super) fn forget(&self) {
        self.offset_ms.store(UNKNOWN, Ordering::Relaxed);
    }

    /// Take Redis's clock to be `ms` further ahead than it is (a negative
    /// `ms`: behind), as a clock that stepped would.
    #[cfg(test)]
    pub(super) fn misjudge_by(&self, ms: i64) {
        self.offset_ms.fetch_add(ms, Ordering::Relaxed);
    }
}

/// Whether a sample is due at `now`: none tried yet, or the last one tried
/// [`RESAMPLE_AFTER`] ago, or [`RETRY_AFTER`] ago when it gave no offset.
fn sample_due(now: i64, tried_at: i64, known: bool) -> bool {
    let wait = if known { RESAMPLE_AFTER } else { RETRY_AFTER };
    tried_at == UNKNOWN || now.saturating_sub(tried_at) >= wait.as_millis() as i64
}

/// Three quarters of `budget` after `local_ms`, in Redis's clock; 0 (no
/// deadline) when `offset_ms` is unknown.
fn deadline_from(local_ms: i64, offset_ms: i64, budget: Duration) -> i64 {
    if offset_ms == UNKNOWN {
        return 0;
    }
    let reach = (budget.as_millis() as i64).saturating_mul(3) / 4;
    local_ms
        .saturating_add(offset_ms)
        .saturating_add(reach.max(1))
        .max(1)
}

/// Redis's clock less this process's, from a `TIME` read between `sent_ms`
/// and `received_ms`: at most half the round trip wrong, so a round trip
/// longer than a quarter of `budget` gives nothing.
fn offset_from(sent_ms: i64, redis_ms: i64, received_ms: i64, budget: Duration) -> Option<i64> {
    let round_trip = received_ms.checked_sub(sent_ms)?;
    if round_trip < 0 || round_trip > budget.as_millis() as i64 / 4 {
        return None;
    }
    Some(redis_ms - (sent_ms + round_trip / 2))
}

/// Redis's `TIME` answer (seconds, microseconds) in ms.
pub(super) fn time_ms(answer: &[String]) -> Option<i64> {
    let [seconds, micros] = answer else {
        return None;
    };
    let seconds: i64 = seconds.parse().ok()?;
    let micros: i64 = micros.parse().ok()?;
    seconds.checked_mul(1000)?.checked_add(micros / 1000)
}

#[cfg(test)]
mod tests {
    use super::*;

    const BUDGET: Duration = Duration::from_millis(100);

    #[test]
    fn no_deadline_until_the_offset_is_known() {
        assert_eq!(deadline_from(5_000, UNKNOWN, BUDGET), 0);
    }

    #[test]
    fn the_deadline_is_three_quarters_of_the_budget_in_redis_time() {
        // Redis's clock reads 1,700,000,000,000 when ours reads 5,000.
        let offset = 1_700_000_000_000 - 5_000;
        assert_eq!(deadline_from(5_000, offset, BUDGET), 1_700_000_000_075);
        assert_eq!(
            deadline_from(5_000, offset, Duration::from_millis(1)),
            1_700_000_000_001,
            "a budget under 4 ms still leaves a millisecond"
        );
    }

    #[test]
    fn the_offset_is_taken_at_the_round_trips_midpoint() {
        assert_eq!(offset_from(1_000, 90_010, 1_020, BUDGET), Some(89_000));
    }

    #[test]
    fn a_slow_or_backward_sample_gives_no_offset() {
        assert_eq!(offset_from(1_000, 90_010, 1_026, BUDGET), None);
        assert_eq!(offset_from(1_000, 90_010, 1_025, BUDGET), Some(88_998));
        assert_eq!(offset_from(1_000, 90_010, 999, BUDGET), None);
    }

    #[test]
    fn time_answers_are_read_as_milliseconds() {
        let answer = |s: &str, us: &str| time_ms(&[s.to_string(), us.to_string()]);
        assert_eq!(answer("1700000000", "123456"), Some(1_700_000_000_123));
        assert_eq!(answer("x", "1"), None);
        assert_eq!(time_ms(&["1".to_string()]), None);
    }

    #[test]
    fn a_clusters_offset_is_its_furthest_trusted_node_ahead() {
        let clock = Arc::new(RedisClock::new());
        let sample = clock.deadline_ms(BUDGET).1.expect("none taken yet");
        let now = clock.local_ms();
        let node = |redis_ms, round_trip| Reading {
            sent_ms: now,
            redis_ms,
            received_ms: now + round_trip,
        };
        sample.finish(
            [
                node(1_700_000_000_000, 0),
                node(1_700_000_000_050, 0),
                // Further ahead, but too slow a reading to trust.
                node(1_700_000_000_900, 26),
                node(1_699_999_999_000, 0),
            ],
            BUDGET,
        );
        let (deadline, _) = clock.deadline_ms(BUDGET);
        let elapsed = clock.local_ms() - now;
        assert_eq!(deadline - elapsed, 1_700_000_000_125, "50 ahead + 75");
    }

    #[test]
    fn one_sample_at_a_time_then_none_until_it_is_old() {
        let clock = Arc::new(RedisClock::new());
        let (deadline, first) = clock.deadline_ms(BUDGET);
        assert_eq!(deadline, 0, "no offset yet");
        let first = first.expect("none taken yet: one is claimed");
        assert!(clock.deadline_ms(BUDGET).1.is_none(), "one on its way");
        let now = clock.local_ms();
        first.finish(
            [Reading {
                sent_ms: now,
                redis_ms: 1_700_000_000_000,
                received_ms: now,
            }],
            BUDGET,
        );
        let (deadline, due) = clock.deadline_ms(BUDGET);
        assert!(due.is_none(), "a fresh sample");
        assert!(deadline >= 1_700_000_000_075, "{deadline}");
        clock.forget();
        let (deadline, due) = clock.deadline_ms(BUDGET);
        assert_eq!(deadline, 0, "forgotten: no deadline");
        assert!(
            due.is_none(),
            "tried just now: not a sample per late answer (a second after the last)"
        );
    }

    #[test]
    fn a_sample_that_ends_unfinished_lets_the_next_be_taken() {
        let clock = Arc::new(RedisClock::new());
        let (_, sample) = clock.deadline_ms(BUDGET);
        drop(sample.expect("claimed"));
        assert!(
            !clock.sampling.load(Ordering::Acquire),
            "a sample cut off with its task frees the claim"
        );
        assert_eq!(clock.offset_ms.load(Ordering::Relaxed), UNKNOWN);
    }

    #[test]
    fn a_sample_is_due_a_minute_after_the_last_or_a_second_after_a_failed_one() {
        assert!(sample_due(5, UNKNOWN, false), "none tried yet");
        assert!(!sample_due(60_999, 1_000, true));
        assert!(sample_due(61_000, 1_000, true));
        assert!(!sample_due(1_999, 1_000, false));
        assert!(sample_due(2_000, 1_000, false));
    }
}
