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

/// Buckets of a surge policy's history: its normal averages the sends of
/// the last seven complete ones (the current one is still filling).
pub const HISTORY_BUCKETS: u64 = 7;

/// When a subject's conversion blocks it (a prefix), or first asks for a
/// captcha (a country: with [`Surge`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConversionPolicy {
    /// Events in the window below which a subject is never blocked (nor,
    /// with a surge, challenged).
    pub min_events: u32,
    /// Successes per million events below which a subject with at least
    /// `min_events` events is blocked (at exactly this ratio it is not).
    pub min_ratio_ppm: u32,
    /// How far back events and successes are counted, in ms.
    pub window_ms: u64,
    /// How long a block (or a challenge) lasts, in ms.
    pub block_ms: u64,
    /// `None`: the subject is blocked at once when its conversion trips
    /// (a prefix). `Some`: its events must also reach a multiple of its
    /// normal, and it is challenged before it is blocked (a country).
    pub surge: Option<Surge>,
}

/// A subject judged against its own normal: the events it gets in a
/// window on average, learnt from the last [`HISTORY_BUCKETS`] buckets of
/// its history. Only slices whose conversion met the policy's threshold
/// teach it, so that pumping never raises the bar it is judged by.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Surge {
    /// The multiple of its normal the window's events must reach, in
    /// thousandths (5000: five times).
    pub factor_milli: u32,
    /// How far back the normal looks, in ms: seven buckets of a seventh.
    pub history_ms: u64,
    /// Whether a challenged subject whose events since the challenge (all
    /// of them passed a captcha) surge again is blocked; `false`: a captcha
    /// is the most it gets.
    pub block: bool,
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

    /// The length of one bucket of the history; `None` without a surge.
    pub fn bucket_ms(&self) -> Option<u64> {
        self.surge.map(|s| (s.history_ms / HISTORY_BUCKETS).max(1))
    }

    /// How long a subject's key lives after an event is counted: the
    /// window, and with a surge the history on top (one bucket more than
    /// the normal reads, so that no bucket it reads has expired).
    pub fn keep_ms(&self) -> u64 {
        let history = self.bucket_ms().map_or(0, |b| (HISTORY_BUCKETS + 1) * b);
        self.slices() * self.slice_ms() + history
    }

    /// How long a subject's key lives after this policy trips: the block,
    /// and with a surge at least [`Self::keep_ms`] (its history stays).
    pub fn trip_keep_ms(&self) -> u64 {
        match self.surge {
            None => self.block_ms,
            Some(_) => self.block_ms.max(self.keep_ms()),
        }
    }

    /// Whether `successes` out of `events` are below the threshold (at it
    /// is not below it).
    pub fn below(&self, events: u32, successes: u32) -> bool {
        u64::from(successes) * 1_000_000 < u64::from(self.min_ratio_ppm) * u64::from(events)
    }

    /// Whether `successes` out of `events` block a subject.
    pub fn trips(&self, events: u32, successes: u32) -> bool {
        events >= self.min_events && self.below(events, successes)
    }

    /// With a surge: whether `events` and `successes` trip the policy and
    /// the events reach the factor times `normal`. A normal of 0 (no
    /// history) leaves `min_events` alone to judge.
    pub fn surges(&self, events: u32, successes: u32, normal: f64) -> bool {
        let Some(surge) = self.surge else {
            return false;
        };
        self.trips(events, successes)
            && f64::from(events) * 1000.0 >= f64::from(surge.factor_milli) * normal
    }

    /// Whether a slice's events teach the normal: it had some, and its
    /// successes met the threshold.
    pub fn teaches(&self, events: u32, successes: u32) -> bool {
        events > 0 && !self.below(events, successes)
    }

    /// The normal, in events per window (the span a count sums, `slices()
    /// × slice_ms()`: the window, to a slice), from `taught` events in the
    /// history's complete buckets. Computed in this order on both
    /// backends, so that Lua and Rust agree to the last bit.
    pub fn normal(&self, taught: u64) -> f64 {
        let span = self.slices() * self.slice_ms();
        match self.bucket_ms() {
            Some(bucket) => taught as f64 * span as f64 / (HISTORY_BUCKETS * bucket) as f64,
            None => 0.0,
        }
    }
}

/// A normal in thousandths of an event, rounded half up, as the stores
/// answer it.
pub fn normal_milli(normal: f64) -> u64 {
    (normal * 1000.0 + 0.5).floor() as u64
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
    /// The subject was already blocked.
    Blocked {
        /// How long until the block ends.
        retry_after_ms: u64,
    },
    /// This event found the conversion below the threshold and blocked the
    /// subject for the policy's `block_ms`: the decision, made once.
    Tripped,
    /// The subject was already challenged (a surge policy): the event may
    /// go only with a passed captcha.
    Challenged {
        /// How long until the challenge ends.
        retry_after_ms: u64,
    },
    /// This event found the subject surging with its conversion below the
    /// threshold and challenged it for `block_ms`: the decision, made once.
    ChallengeTripped,
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
    /// With a surge: the normal (see [`normal_milli`]) now when `Open`, the
    /// one the subject was challenged or blocked on otherwise; 0 without.
    pub normal_milli: u64,
}

impl ConversionOutcome {
    /// Open, nothing counted: the answer of a store failing open.
    pub fn open() -> Self {
        Self {
            verdict: ConversionVerdict::Open,
            events: 0,
            successes: 0,
            counted_in: None,
            normal_milli: 0,
        }
    }

    /// Whether the subject is blocked (already, or by this event).
    pub fn blocks(&self) -> bool {
        matches!(
            self.verdict,
            ConversionVerdict::Blocked { .. } | ConversionVerdict::Tripped
        )
    }

    /// Whether the subject asks for a captcha (already, or since this
    /// event).
    pub fn challenges(&self) -> bool {
        matches!(
            self.verdict,
            ConversionVerdict::Challenged { .. } | ConversionVerdict::ChallengeTripped
        )
    }

    /// Whether the event is refused: blocked, or challenged and no captcha
    /// was passed.
    pub fn refuses(&self, gate_open: bool) -> bool {
        self.blocks() || (self.challenges() && !gate_open)
    }
}

/// How far a subject's escalation has gone.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Escalation {
    /// Events need a passed captcha (a surge policy's first step).
    Challenge,
    /// Every event is refused.
    Block,
}

/// A block (or a challenge) as the store keeps it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConversionBlock {
    /// A challenge or a block.
    pub level: Escalation,
    /// How long until the block ends.
    pub retry_after_ms: u64,
    /// The events that blocked the subject.
    pub events: u32,
    /// The successes among them.
    pub successes: u32,
    /// Set by an event offered with `force` (shadow mode): seen by forced
    /// events only, never enforced.
    pub shadow: bool,
    /// The normal it was set on ([`normal_milli`]; 0 without a surge).
    pub normal_milli: u64,
}

/// The answer of `WindowStore::conversion_state`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ConversionState {
    /// Events in the window now.
    pub events: u32,
    /// Successes in the window now.
    pub successes: u32,
    /// The normal now ([`normal_milli`]; 0 without a surge).
    pub normal_milli: u64,
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
            surge: None,
        }
    }

    fn country(window_ms: u64) -> ConversionPolicy {
        ConversionPolicy {
            surge: Some(Surge {
                factor_milli: 5_000,
                history_ms: 7 * 86_400_000,
                block: true,
            }),
            ..policy(window_ms)
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

    #[test]
    fn a_surge_needs_the_floor_the_conversion_and_the_multiple_of_the_normal() {
        let p = country(3_600_000);
        // A week of history, an hour's window: 1,680 taught sends are 10 an hour.
        assert_eq!(p.normal(1_680), 10.0);
        assert_eq!(normal_milli(p.normal(1_681)), 10_006);
        assert!(p.surges(50, 0, 10.0), "five times ten, none verified");
        assert!(!p.surges(49, 0, 10.0), "under five times the normal");
        assert!(!p.surges(50, 10, 10.0), "20% verified is not below 20%");
        assert!(
            !p.surges(19, 0, 0.0),
            "under min_events, whatever the normal"
        );
        assert!(p.surges(20, 0, 0.0), "no history: the floor alone");
        assert!(
            !policy(3_600_000).surges(50, 0, 0.0),
            "a prefix never surges"
        );
    }

    #[test]
    fn a_slice_teaches_only_when_its_codes_were_verified_enough() {
        let p = country(3_600_000);
        assert!(p.teaches(10, 2));
        assert!(!p.teaches(10, 1));
        assert!(!p.teaches(0, 0));
    }

    #[test]
    fn a_country_keeps_its_history_a_prefix_its_window() {
        let p = country(3_600_000);
        assert_eq!(p.bucket_ms(), Some(86_400_000));
        assert_eq!(p.keep_ms(), 3_600_000 + 8 * 86_400_000);
        assert_eq!(p.trip_keep_ms(), 3_600_000 + 8 * 86_400_000);
        let prefix = policy(3_600_000);
        assert_eq!((prefix.bucket_ms(), prefix.keep_ms()), (None, 3_600_000));
        assert_eq!(prefix.trip_keep_ms(), 1_000);
    }
}
