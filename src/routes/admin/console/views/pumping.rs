//! What the console shows of the SMS pumping guard: the list of blocked
//! number ranges above the event table, and a prefix's or country's counts
//! and block on its page.

use chrono::{DateTime, Utc};

use super::{duration_ms, subject_href, until};
use crate::guard::admin::{ListedBlock, PumpingState};

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
}

impl PumpingView {
    /// The view of `state` as of `now`.
    pub fn new(state: &PumpingState, now: DateTime<Utc>) -> Self {
        let block = state.block.as_ref();
        Self {
            sends: state.sends,
            verified: state.verified,
            min_sends: state.min_sends,
            window: duration_ms(state.window_ms),
            rule: state.rule.clone(),
            blocked_until: block.map(|b| until(b.until, now)).unwrap_or_default(),
            blocked_rule: block.map(|b| b.rule.clone()).unwrap_or_default(),
            blocked_shadow: block.is_some_and(|b| b.shadow),
        }
    }
}
