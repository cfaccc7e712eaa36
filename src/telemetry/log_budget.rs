//! At most one line per interval from one call site, so that a flood of
//! failures an attacker chooses (wrong admin tokens, forged proxy headers)
//! cannot fill the disk with log lines. Each line that is written says how
//! many were held back before it; metrics count every event.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::LazyLock;
use std::time::{Duration, Instant};

static START: LazyLock<Instant> = LazyLock::new(Instant::now);

/// One call site's allowance: a line, then none until `every` has passed.
pub struct LogBudget {
    every_ms: u64,
    /// When the next line may be written, in ms since [`START`].
    next_ms: AtomicU64,
    /// Lines held back since the last one written.
    held_back: AtomicU64,
}

impl LogBudget {
    /// One line per `every`.
    pub const fn new(every: Duration) -> Self {
        Self {
            every_ms: every.as_millis() as u64,
            next_ms: AtomicU64::new(0),
            held_back: AtomicU64::new(0),
        }
    }

    /// Whether a line may be written now: `Some(n)` when it may, `n` being
    /// how many were held back since the last; `None` when it may not (and
    /// it is counted as held back).
    pub fn admit(&self) -> Option<u64> {
        self.admit_at(START.elapsed().as_millis() as u64)
    }

    fn admit_at(&self, now_ms: u64) -> Option<u64> {
        let next = self.next_ms.load(Ordering::Relaxed);
        let mine = now_ms >= next
            && self
                .next_ms
                .compare_exchange(
                    next,
                    now_ms + self.every_ms,
                    Ordering::Relaxed,
                    Ordering::Relaxed,
                )
                .is_ok();
        if mine {
            Some(self.held_back.swap(0, Ordering::Relaxed))
        } else {
            self.held_back.fetch_add(1, Ordering::Relaxed);
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_line_per_interval_and_the_next_counts_the_ones_held_back() {
        let budget = LogBudget::new(Duration::from_secs(10));
        assert_eq!(budget.admit_at(5), Some(0));
        assert_eq!(budget.admit_at(6), None);
        assert_eq!(budget.admit_at(10_004), None);
        assert_eq!(budget.admit_at(10_005), Some(2));
        assert_eq!(budget.admit_at(10_006), None);
        assert_eq!(budget.admit_at(90_000), Some(1));
    }
}
