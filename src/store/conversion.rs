//! The values of conversion counters: per subject, the events offered (codes
//! sent) and their successes (codes verified) over a window, and the block a
//! subject earns when too few of its events succeed. The store knows nothing
//! of SMS; the SMS pumping guard (`guard::pumping`) is their one user.
//!
//! The counts are bucketed, not logged: a subject keeps one pair of counters
//! per slice of [`ConversionPolicy::slice_ms`] (a twelfth of the window) and
//! a count sums the slices of the last window. That is O(1) per event
//! whatever the traffic (a log would keep every send of a number range under
//! attack), and the error is at most one slice at the window's far end, on
//! both counts alike: the ratio a decision reads is over eleven to twelve
//! twelfths of the window instead of exactly all of it, which moves a block
//! by at most a slice and never by a whole window. The threshold itself is
//! compared in integers (successes × 10⁶ against the ratio in parts per
//! million × events), so a conversion exactly at it is never "below" it.

/// Slices per window: the counts' resolution.
const SLICES: u64 = 12;

/// When a subject's conversion blocks it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConversionPolicy {
    /// Events in the window below which a subject is never blocked.
    pub min_events: u32,
    /// Successes per million events below which a subject with at least
    /// `min_events` events is blocked (at exactly this ratio it is not).
    pub min_ratio_ppm: u32,
    /// How far back events and successes are counted, in ms.
    pub window_ms: u64,
    /// How long a block lasts, in ms.
    pub block_ms: u64,
}

impl ConversionPolicy {
    /// The length of one counting slice: a twelfth of the window (1 ms at
    /// least).
    pub fn slice_ms(&self) -> u64 {
        (self.window_ms / SLICES).max(1)
    }

    /// How many slices, the current one included, a count sums.
    pub fn slices(&self) -> u64 {
        self.window_ms.div_ceil(self.slice_ms()).max(1)
    }

    /// Whether `successes` out of `events` block a subject.
    pub fn trips(&self, events: u32, successes: u32) -> bool {
        events >= self.min_events
            && u64::from(successes) * 1_000_000 < u64::from(self.min_ratio_ppm) * u64::from(events)
    }
}

/// One subject's conversion counters and block, offered one event
/// (`WindowStore::conversion_hit`).
#[derive(Debug, Clone, Copy)]
pub struct ConversionHit<'a> {
    /// The subject's counters key, `Keys::subject_conversion`.
    pub key: &'a str,
    /// When the subject is blocked.
    pub policy: &'a ConversionPolicy,
}

/// What a subject's conversion says about an event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConversionVerdict {
    /// Not blocked: the event may go (and was counted if it was recorded).
    Open,
    /// The subject was already blocked; `retry_after_ms` is when the block
    /// ends.
    Blocked { retry_after_ms: u64 },
    /// This event found the conversion below the threshold and blocked the
    /// subject for the policy's `block_ms`: the decision, made once.
    Tripped,
}

/// The answer of `WindowStore::conversion_hit`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConversionOutcome {
    /// What the conversion decided.
    pub verdict: ConversionVerdict,
    /// Events in the window: before this event when `Open`, the figures that
    /// blocked the subject when `Blocked` or `Tripped`.
    pub events: u32,
    /// Successes, counted the same way as `events`.
    pub successes: u32,
    /// The slice the event was counted in, to take it back by
    /// (`WindowStore::conversion_undo`); `None` when it was not counted.
    pub counted_in: Option<u64>,
}

impl ConversionOutcome {
    /// Open, nothing counted: the answer of a store failing open.
    pub fn open() -> Self {
        Self {
            verdict: ConversionVerdict::Open,
            events: 0,
            successes: 0,
            counted_in: None,
        }
    }

    /// Whether the subject is blocked (already, or by this event).
    pub fn refuses(&self) -> bool {
        self.verdict != ConversionVerdict::Open
    }
}

/// A block as the store keeps it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConversionBlock {
    /// How long until the block ends.
    pub retry_after_ms: u64,
    /// The events that blocked the subject.
    pub events: u32,
    /// The successes among them.
    pub successes: u32,
    /// Set by an event offered with `force` (shadow mode): seen by forced
    /// events only, never enforced.
    pub shadow: bool,
}

/// The answer of `WindowStore::conversion_state`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ConversionState {
    /// Events in the window now.
    pub events: u32,
    /// Successes in the window now.
    pub successes: u32,
    /// The subject's live block, if any.
    pub block: Option<ConversionBlock>,
}

/// The answer of `WindowStore::expiring_members`: the live members of an
/// expiring set, latest-ending first.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ExpiringMembers {
    /// Up to the asked number of members, each with the ms until it expires.
    pub members: Vec<(String, u64)>,
    /// How many members are live in all.
    pub total: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(window_ms: u64) -> ConversionPolicy {
        ConversionPolicy {
            min_events: 20,
            min_ratio_ppm: 200_000,
            window_ms,
            block_ms: 1_000,
        }
    }

    #[test]
    fn a_window_is_counted_in_twelve_slices() {
        let p = policy(3_600_000);
        assert_eq!((p.slice_ms(), p.slices()), (300_000, 12));
        let tiny = policy(5);
        assert_eq!((tiny.slice_ms(), tiny.slices()), (1, 5));
        let odd = policy(1_000);
        assert_eq!((odd.slice_ms(), odd.slices()), (83, 13));
    }

    #[test]
    fn exactly_at_the_threshold_does_not_trip() {
        let p = policy(60_000);
        assert!(!p.trips(20, 4), "4/20 is 20%: at the threshold");
        assert!(p.trips(20, 3), "3/20 is below");
        assert!(!p.trips(19, 0), "fewer than min_events");
        assert!(!p.trips(40, 8));
        assert!(p.trips(40, 7));
    }
}
