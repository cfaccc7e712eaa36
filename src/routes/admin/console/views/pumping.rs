//! What the console shows of the SMS pumping guard: the list of blocked
//! number ranges above the event table, and a prefix's or country's counts
//! and block on its page.

use chrono::{DateTime, Utc};

use super::{duration_ms, subject_href, until};
use crate::guard::admin::{ListedBlock, PumpingLevel, PumpingState};
use crate::guard::pumping::thousandths;

/// A number prefix or country the pumping guard blocks, as the events
/// page lists it.
pub struct BlockRow {
    /// `prefix` or `country`.
    pub kind: &'static str,
    /// `+8613800`, `CN`.
    pub id: String,
    /// Its subject page.
    pub href: String,
    /// `2026-11-01 12:00:00.000 UTC (in 11h 59m)`.
    pub until: String,
}

/// The pumping blocks above the event table: up to a page of them, and
/// how many there are in all.
#[derive(Default)]
pub struct BlockList {
    /// The blocks shown, latest-ending first.
    pub rows: Vec<BlockRow>,
    /// Blocks in all (more than `rows` when the list is cut).
    pub total: u64,
    /// Why the list could not be read, when it could not.
    pub message: Option<String>,
}

impl BlockList {
    /// The rows of `blocks` as of `now`.
    pub fn new(blocks: &[ListedBlock], total: u64, now: DateTime<Utc>) -> Self {
        let rows = blocks
            .iter()
            .map(|b| BlockRow {
                kind: b.subject.kind.as_str(),
                id: b.subject.id.clone(),
                href: subject_href(b.subject.kind, &b.subject.id),
                until: until(b.until, now),
            })
            .collect();
        Self {
            rows,
            total,
            message: None,
        }
    }

    /// Blocks not shown.
    pub fn more(&self) -> u64 {
        self.total.saturating_sub(self.rows.len() as u64)
    }
}

/// What the pumping guard counts for a prefix or country, as the subject
/// page shows it.
pub struct PumpingView {
    /// Codes sent in the window.
    pub sends: u32,
    /// Codes verified in the window.
    pub verified: u32,
    /// `sms.pumping.min_sends`.
    pub min_sends: u32,
    /// The window (`1h`).
    pub window: String,
    /// The figures against the threshold.
    pub rule: String,
    /// The block: when it ends and the figures that set it; empty when none.
    pub blocked_until: String,
    /// The block's figures against the threshold.
    pub blocked_rule: String,
    /// The block was decided in shadow mode: not enforced.
    pub blocked_shadow: bool,
    /// A country's normal (`20.4`) and the multiple a surge needs (`5`);
    /// empty for a prefix.
    pub normal: String,
    /// The multiple of the normal a country's sends must reach.
    pub surge: String,
    /// `open`, `challenge` or `block`.
    pub level: &'static str,
    /// A country's challenge: when it ends; empty when none.
    pub challenged_until: String,
    /// The challenge's figures against the threshold.
    pub challenged_rule: String,
    /// The challenge was decided in shadow mode: not enforced.
    pub challenged_shadow: bool,
}

impl PumpingView {
    /// The view of `state` as of `now`.
    pub fn new(state: &PumpingState, now: DateTime<Utc>) -> Self {
        let block = state.block.as_ref();
        let challenge = state.challenge.as_ref();
        let milli = |v: Option<f64>| v.map(|v| thousandths((v * 1000.0).round() as u64));
        Self {
            sends: state.sends,
            verified: state.verified,
            min_sends: state.min_sends,
            window: duration_ms(state.window_ms),
            rule: state.rule.clone(),
            blocked_until: block.map(|b| until(b.until, now)).unwrap_or_default(),
            blocked_rule: block.map(|b| b.rule.clone()).unwrap_or_default(),
            blocked_shadow: block.is_some_and(|b| b.shadow),
            normal: milli(state.normal).unwrap_or_default(),
            surge: milli(state.surge).unwrap_or_default(),
            level: match state.level {
                PumpingLevel::Open => "open",
                PumpingLevel::Challenge => "captcha required",
                PumpingLevel::Block => "blocked",
            },
            challenged_until: challenge.map(|c| until(c.until, now)).unwrap_or_default(),
            challenged_rule: challenge.map(|c| c.rule.clone()).unwrap_or_default(),
            challenged_shadow: challenge.is_some_and(|c| c.shadow),
        }
    }
}
