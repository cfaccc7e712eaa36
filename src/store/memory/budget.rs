//! The in-process store's memory limit (`store.memory_limit`): what its
//! subjects are counted to cost, and the eviction of the least recently
//! touched ones once the count passes the limit. Locked subjects (and the
//! other pinned ones, see `Subject::pinned`) are never evicted, and are
//! counted on top of the limit: the others keep the limit's room however
//! many an attacker locks (each lock costs them `login.lock_after`
//! failures), so locking enough names cannot make the store forget every
//! other subject's failures as soon as they are recorded.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use dashmap::DashMap;
use parking_lot::Mutex;

use super::entry::Subject;

/// How far below the limit one eviction round brings the store: a round
/// walks every subject, so each one frees a tenth of the limit at once
/// rather than one subject per call.
const AFTER_EVICTION: f64 = 0.9;

/// The limit, the bytes counted against it, and the evictions so far.
pub(super) struct Budget {
    limit: usize,
    used: AtomicUsize,
    /// The count past which a call starts a round: the limit, on top of
    /// the pinned bytes the last round found. Without it, a store held past
    /// its limit by pinned subjects would walk every subject on every call.
    next_round: AtomicUsize,
    evictions: AtomicU64,
    /// One eviction round at a time; a call that finds one under way goes on.
    evicting: Mutex<()>,
}

impl Budget {
    pub(super) fn new(limit: usize) -> Self {
        Self {
            limit,
            used: AtomicUsize::new(0),
            next_round: AtomicUsize::new(limit),
            evictions: AtomicU64::new(0),
            evicting: Mutex::new(()),
        }
    }

    pub(super) fn limit(&self) -> usize {
        self.limit
    }

    pub(super) fn used(&self) -> usize {
        self.used.load(Ordering::Relaxed)
    }

    pub(super) fn evictions(&self) -> u64 {
        self.evictions.load(Ordering::Relaxed)
    }

    /// Whether a call should start an eviction round.
    pub(super) fn over(&self) -> bool {
        self.used() > self.next_round.load(Ordering::Relaxed)
    }

    /// Count a subject at `new` bytes instead of `old`. A subject's bytes
    /// are always added before they are taken off, so the sum never wraps.
    pub(super) fn recount(&self, old: usize, new: usize) {
        if new > old {
            self.used.fetch_add(new - old, Ordering::Relaxed);
        } else if new < old {
            self.used.fetch_sub(old - new, Ordering::Relaxed);
        }
    }

    /// Re-count `subject` (`shard` is its name).
    pub(super) fn recount_subject(&self, subject: &mut Subject, shard: &str) {
        let bytes = subject.footprint(shard.len());
        self.recount(subject.bytes, bytes);
        subject.bytes = bytes;
    }

    /// Evict the least recently touched unpinned subjects until the count is
    /// a tenth below the limit on top of the pinned ones (or nothing
    /// evictable is left). Call with no guard into `subjects` held.
    pub(super) fn evict(&self, subjects: &DashMap<String, Subject>, now: u64) {
        let Some(_round) = self.evicting.try_lock() else {
            return;
        };
        // A round may have ended between this call's check and the lock.
        if !self.over() {
            return;
        }
        let (idle, pinned) = survey(subjects, now);
        let keep = pinned.saturating_add((self.limit as f64 * AFTER_EVICTION) as usize);
        self.next_round
            .store(pinned.saturating_add(self.limit), Ordering::Relaxed);
        let need = self.used().saturating_sub(keep);
        if need == 0 {
            return;
        }
        let Some(cutoff) = cutoff(idle, need) else {
            return;
        };
        // Everything touched before the cutoff goes; at the cutoff itself,
        // only as much as is still needed.
        let (mut freed, mut evicted) = (0, 0u64);
        subjects.retain(|_, s| {
            let goes =
                (s.touched < cutoff || (s.touched == cutoff && freed < need)) && !s.pinned(now);
            if goes {
                freed += s.bytes;
                evicted += 1;
            }
            !goes
        });
        self.used.fetch_sub(freed, Ordering::Relaxed);
        self.evictions.fetch_add(evicted, Ordering::Relaxed);
        crate::metrics::store_evictions(evicted);
        tracing::debug!(
            evicted,
            freed,
            pinned,
            "in-process store over its memory limit"
        );
    }
}

/// `(touched, bytes)` of every unpinned subject, and the bytes of the
/// pinned ones.
fn survey(subjects: &DashMap<String, Subject>, now: u64) -> (Vec<(u64, usize)>, usize) {
    let mut pinned = 0;
    let mut idle = Vec::with_capacity(subjects.len());
    for s in subjects.iter() {
        if s.pinned(now) {
            pinned += s.bytes;
        } else {
            idle.push((s.touched, s.bytes));
        }
    }
    (idle, pinned)
}

/// The touch time up to which the oldest of `idle` hold `need` bytes (all
/// of them when they hold less); `None` when there are none.
fn cutoff(mut idle: Vec<(u64, usize)>, need: usize) -> Option<u64> {
    idle.sort_unstable_by_key(|(touched, _)| *touched);
    let mut sum = 0;
    let mut cutoff = None;
    for (touched, bytes) in idle {
        sum += bytes;
        cutoff = Some(touched);
        if sum >= need {
            break;
        }
    }
    cutoff
}
