//! The values of window and code operations: what a window is, what is
//! offered to it, and what it answers.

use super::{ConversionHit, ConversionOutcome};
use crate::domain::Algorithm;

/// What a window does once its count has reached its limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WindowMode {
    /// The event is refused (a rate limit).
    Enforce,
    /// The event is refused unless the request opened the gate (a captcha tier).
    Gate,
    /// The event is never refused: the window is counted so that its
    /// would-be refusals can be audited (a rule in shadow).
    Observe,
}

/// A rule's window as the store counts it: enforced (a full window
/// refuses) or a gate (a full window asks for a captcha).
pub trait RuleWindow {
    /// The window as a limit that refuses once full (or, for a rule in
    /// shadow, that is only observed).
    fn enforce(&self) -> WindowSpec;
    /// The window as a captcha tier.
    fn gate(&self) -> WindowSpec;
}

impl RuleWindow for crate::domain::Rule {
    fn enforce(&self) -> WindowSpec {
        WindowSpec {
            mode: if self.shadow {
                WindowMode::Observe
            } else {
                WindowMode::Enforce
            },
            algorithm: self.algorithm,
            ..WindowSpec::enforce(self.limit, self.window_ms())
        }
    }

    fn gate(&self) -> WindowSpec {
        WindowSpec::gate(self.limit, self.window_ms())
    }
}

/// One window of a subject's key, as the store counts it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WindowSpec {
    /// Events the window admits.
    pub limit: u32,
    /// Length of the window, in milliseconds.
    pub window_ms: u64,
    /// What the window does once full.
    pub mode: WindowMode,
    /// A log of events, or a meter (GCRA) kept beside it (`Keys::meter_of`).
    pub algorithm: Algorithm,
}

impl WindowSpec {
    /// A window that refuses once full.
    pub fn enforce(limit: u32, window_ms: u64) -> Self {
        Self {
            limit,
            window_ms,
            mode: WindowMode::Enforce,
            algorithm: Algorithm::SlidingLog,
        }
    }

    /// A meter (GCRA) that refuses once full.
    pub fn meter(limit: u32, window_ms: u64) -> Self {
        Self {
            algorithm: Algorithm::Gcra,
            ..Self::enforce(limit, window_ms)
        }
    }

    /// Whether the window is a meter (GCRA) rather than a log.
    pub fn is_meter(&self) -> bool {
        self.algorithm == Algorithm::Gcra
    }

    /// The window's field in its subject's meter hash (`<limit>/<length>`):
    /// a changed limit starts a new meter.
    pub fn meter_field(&self) -> String {
        format!("{}/{}", self.limit, self.window_ms)
    }

    /// A window that asks for a captcha once full.
    pub fn gate(limit: u32, window_ms: u64) -> Self {
        Self {
            limit,
            window_ms,
            mode: WindowMode::Gate,
            algorithm: Algorithm::SlidingLog,
        }
    }
}

/// One event offered to one subject's windows.
#[derive(Debug, Clone)]
pub struct HitRequest<'a> {
    /// The subject's window key, from `Keys::window`.
    pub key: &'a str,
    /// The windows to count on that key.
    pub windows: &'a [WindowSpec],
    /// Unique id of this event; `WindowStore::undo` removes it again.
    pub member: &'a str,
    /// The request passed a captcha: `Gate` windows do not refuse it.
    pub gate_open: bool,
    /// Shadow mode: record the event even when a window refuses it.
    pub force: bool,
}

/// What one subject's windows say about an event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HitVerdict {
    /// No `Enforce` window is full, and no `Gate` window is full while the gate
    /// is closed (an `Observe` window never refuses).
    Allowed,
    /// An `Enforce` window is full.
    Denied {
        /// Index in the request's windows of the refusing window whose wait is
        /// longest.
        window: usize,
        /// That window's wait: how long until it admits the event.
        retry_after_ms: u64,
    },
    /// No `Enforce` window refused, but a `Gate` window is full and the gate was
    /// closed.
    Gated {
        /// Index in the request's windows of the first such window.
        window: usize,
    },
}

impl HitVerdict {
    /// `Denied` by the enforce window with the longest wait, else `Gated` by
    /// the first full gate window (unless the gate is open), else `Allowed`.
    /// `wait(i)` is window `i`'s wait now; a window without a count (a
    /// store's short answer) counts as empty.
    pub fn of(
        specs: &[WindowSpec],
        counts: &[u32],
        gate_open: bool,
        wait: impl Fn(usize) -> u64,
    ) -> Self {
        let mut verdict = Self::Allowed;
        let mut longest_wait = 0;
        for (i, spec) in specs.iter().enumerate() {
            let count = counts.get(i).copied().unwrap_or(0);
            if spec.mode == WindowMode::Enforce && count >= spec.limit {
                let wait = wait(i);
                let first = !matches!(verdict, Self::Denied { .. });
                if first || wait > longest_wait {
                    longest_wait = wait;
                    verdict = Self::Denied {
                        window: i,
                        retry_after_ms: wait,
                    };
                }
            }
        }
        if verdict == Self::Allowed && !gate_open {
            if let Some(i) = specs
                .iter()
                .zip(counts)
                .position(|(w, c)| w.mode == WindowMode::Gate && *c >= w.limit)
            {
                verdict = Self::Gated { window: i };
            }
        }
        verdict
    }
}

/// The answer of `WindowStore::hit`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HitOutcome {
    /// What the windows decided.
    pub verdict: HitVerdict,
    /// Whether the event was recorded (allowed, or forced).
    pub added: bool,
    /// Each window's count before this event, in request order.
    pub counts: Vec<u32>,
    /// After this call: how long until every `Enforce` window would admit one
    /// more event (0 = at once).
    pub next_retry_after_ms: u64,
    /// Per window, in request order: for an `Observe` window that was full,
    /// how long until it would have admitted this event (the retry a rule in
    /// shadow would have answered); 0 for every other window. Empty when no
    /// window is `Observe` (no allocation on the common path).
    pub observed_waits: Vec<u64>,
}

impl HitOutcome {
    /// Allowed, nothing counted: the answer of a store failing open.
    pub fn open(windows: usize) -> Self {
        Self {
            verdict: HitVerdict::Allowed,
            added: false,
            counts: vec![0; windows],
            next_retry_after_ms: 0,
            observed_waits: Vec::new(),
        }
    }

    /// What a hit on `specs` would have answered, told from a peek at
    /// them: nothing added.
    pub fn peeked(specs: &[WindowSpec], peek: PeekOutcome, gate_open: bool) -> Self {
        let wait = |i: usize| peek.retry_after_ms.get(i).copied().unwrap_or(0);
        let count = |i: usize| peek.counts.get(i).copied().unwrap_or(0);
        let verdict = HitVerdict::of(specs, &peek.counts, gate_open, wait);
        let next_retry_after_ms = specs
            .iter()
            .enumerate()
            .filter(|(_, w)| w.mode == WindowMode::Enforce)
            .map(|(i, _)| wait(i))
            .max()
            .unwrap_or(0);
        let observed_waits = if specs.iter().any(|w| w.mode == WindowMode::Observe) {
            specs
                .iter()
                .enumerate()
                .map(|(i, w)| match w.mode {
                    WindowMode::Observe if count(i) >= w.limit => wait(i),
                    _ => 0,
                })
                .collect()
        } else {
            Vec::new()
        };
        Self {
            verdict,
            added: false,
            counts: peek.counts,
            next_retry_after_ms,
            observed_waits,
        }
    }
}

/// The answer of `WindowStore::peek`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeekOutcome {
    /// Each window's current count, in request order.
    pub counts: Vec<u32>,
    /// Per window: how long until its count drops below its limit (0 when it
    /// is already below).
    pub retry_after_ms: Vec<u64>,
}

/// One subject's share of a `ReserveRequest`.
#[derive(Debug, Clone, Copy)]
pub struct SubjectWindows<'a> {
    /// The subject's window key, from `Keys::window`.
    pub key: &'a str,
    /// That subject's windows.
    pub windows: &'a [WindowSpec],
    /// The caller's own subject (its address, its network), whose windows
    /// only its own requests fill. A store that hits subject by subject
    /// offers the event to these first, and to the others only once they
    /// admitted it (`steps::reserve`).
    pub callers_own: bool,
}

/// A one-time code to store together with a reservation.
#[derive(Debug, Clone, Copy)]
pub struct CodeToStore<'a> {
    /// `Keys::otp` of the phone.
    pub key: &'a str,
    /// HMAC of the code; the code itself is never stored.
    pub mac: &'a str,
    /// Wrong tries allowed the asker, and as many to everyone else; the
    /// asker's last one burns the code.
    pub attempts: u32,
    /// Lifetime of the code.
    pub ttl_ms: u64,
    /// The address that asked for it, as its IP subject's id (`""`
    /// without one): its wrong tries are counted apart from everyone
    /// else's, who cannot burn its code.
    pub asker: &'a str,
}

/// One try of a code, by `WindowStore::otp_check`.
#[derive(Debug, Clone, Copy)]
pub struct CodeTry<'a> {
    /// `Keys::otp` of the phone.
    pub key: &'a str,
    /// HMAC of the code offered.
    pub mac: &'a str,
    /// The trying address, as its IP subject's id (`""` without one).
    pub client: &'a str,
    /// Wrong tries a stand-in allows: a code's.
    pub attempts: u32,
    /// A stand-in's lifetime: a code's.
    pub ttl_ms: u64,
}

/// One event offered to every subject of a request, all or nothing.
#[derive(Debug, Clone)]
pub struct ReserveRequest<'a> {
    /// Every subject the event counts against.
    pub subjects: &'a [SubjectWindows<'a>],
    /// The conversions checked before the windows and counted with them.
    pub conversions: &'a [ConversionHit<'a>],
    /// Unique id of this event in every subject; `WindowStore::undo` removes it.
    pub member: &'a str,
    /// The request passed a captcha: `Gate` windows do not refuse it.
    pub gate_open: bool,
    /// Shadow mode: record the event (and store the code) even when refused.
    pub force: bool,
    /// Stored when the event is recorded, replacing the phone's previous code.
    pub code: Option<CodeToStore<'a>>,
}

/// The answer of `WindowStore::reserve`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReserveOutcome {
    /// Per subject, in request order. Every `added` equals `recorded`.
    pub outcomes: Vec<HitOutcome>,
    /// Per conversion, in request order; each `counted_in` is set exactly
    /// when `recorded`.
    pub conversions: Vec<ConversionOutcome>,
    /// The event was recorded in every subject and the code stored: every
    /// subject allowed it, or `force`. Otherwise nothing was written.
    pub recorded: bool,
    /// It was recorded by the in-process store `store.on_error = "local"`
    /// falls back to, not by the configured one: its roll-back goes there.
    pub by_fallback: bool,
}

/// A recorded reservation to give back (its delivery failed), to the store
/// that recorded it: `member` from every subject's windows, and one send
/// from each conversion's slice.
#[derive(Debug, Clone)]
pub struct RollBack<'a> {
    /// The subjects the event was recorded in.
    pub subjects: Vec<SubjectWindows<'a>>,
    /// The event's id in every subject.
    pub member: &'a str,
    /// Each conversion's key and the slice that counted the event.
    pub conversions: Vec<(&'a str, u64)>,
    /// As [`ReserveOutcome::by_fallback`] answered.
    pub by_fallback: bool,
}

/// The answer of `WindowStore::otp_check`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OtpOutcome {
    /// The code was right.
    Valid {
        /// The tries the code had left before this one.
        attempts_left: u32,
        /// Whether the code's send was counted by the pumping guard (false:
        /// an allow-listed phone or address's), and so its verify is.
        counted: bool,
    },
    /// Wrong code, or no code (a stand-in took the try).
    Wrong {
        /// The tries left after this one; 0 means this try burnt the code.
        attempts_left: u32,
    },
    /// The code (or stand-in) was already burnt by wrong tries.
    Burnt {
        /// The retry a verify answers: a code's ttl, as long as it may stay
        /// burnt. Not its expiry, which would tell whether a code was
        /// pending and when it was sent.
        retry_after_ms: u64,
    },
}

/// What `WindowStore::otp_drop` found of a failed send's code.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DroppedCode {
    /// Found with every try it was stored with (its own and everyone
    /// else's).
    Untried,
    /// Found with fewer: a wrong try took one.
    Tried,
    /// Not there: a right try used it, or used the code of a racing send
    /// that kept it; or a store that never held it (the other store of a
    /// `ResilientStore`).
    Absent,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn observe(limit: u32, window_ms: u64) -> WindowSpec {
        WindowSpec {
            mode: WindowMode::Observe,
            ..WindowSpec::enforce(limit, window_ms)
        }
    }

    /// A peek tells what a hit would have answered: the longest wait of the
    /// full enforced windows, else the first full gate unless open, and the
    /// waits a rule in shadow would have answered.
    #[test]
    fn a_peek_answers_as_the_hit_would_have() {
        let specs = [
            WindowSpec::gate(3, 3_600_000),
            WindowSpec::enforce(1, 60_000),
            WindowSpec::enforce(10, 3_600_000),
            observe(2, 60_000),
        ];
        let peek_of = |counts: Vec<u32>, retry_after_ms: Vec<u64>| PeekOutcome {
            counts,
            retry_after_ms,
        };
        let peek = |counts: [u32; 4], waits: [u64; 4]| peek_of(counts.to_vec(), waits.to_vec());

        let both_full = HitOutcome::peeked(&specs, peek([3, 1, 10, 2], [9, 40, 700, 30]), false);
        assert_eq!(
            both_full.verdict,
            HitVerdict::Denied {
                window: 2,
                retry_after_ms: 700
            },
            "a rate limit beats a captcha tier, the longest wait wins"
        );
        assert_eq!(both_full.next_retry_after_ms, 700);
        assert_eq!(both_full.observed_waits, [0, 0, 0, 30]);
        assert!(!both_full.added);

        let gated = HitOutcome::peeked(&specs, peek([3, 0, 4, 0], [9, 0, 0, 0]), false);
        assert_eq!(gated.verdict, HitVerdict::Gated { window: 0 });
        assert_eq!(gated.observed_waits, [0, 0, 0, 0]);
        let opened = HitOutcome::peeked(&specs, peek([3, 0, 4, 0], [9, 0, 0, 0]), true);
        assert_eq!(opened.verdict, HitVerdict::Allowed);
        assert_eq!(opened.counts, [3, 0, 4, 0]);

        // A store's short answer: the windows it left out count as empty,
        // and every window still has its wait.
        let short = HitOutcome::peeked(&specs, peek_of(vec![3], vec![9]), false);
        assert_eq!(short.verdict, HitVerdict::Gated { window: 0 });
        assert_eq!(short.observed_waits, [0, 0, 0, 0]);
    }
}
