//! What admins see of the SMS pumping guard: a prefix's or country's
//! counts, normal and escalation, and the list of blocks.

use chrono::{DateTime, Utc};
use serde::Serialize;

use super::{in_ms, SubjectAdmin};
use crate::domain::Subject;
use crate::guard::pumping;
use crate::store::{ConversionPolicy, Escalation, StoreError};

/// What the SMS pumping guard counts for a prefix or a country
/// (`sms.pumping`).
#[derive(Debug, Clone, PartialEq, Serialize, utoipa::ToSchema)]
#[schema(example = json!({"sends": 7, "verified": 2, "min_sends": 20, "window_ms": 3600000,
    "rule": "prefix conversion 2/7 (28.6%) < 20% per 1h", "level": "open"}))]
pub struct PumpingState {
    /// Codes sent in the window, counted in slices of a twelfth of it (the
    /// oldest slice may be partly out of the window).
    pub sends: u32,
    /// Codes verified in the window, counted the same way.
    pub verified: u32,
    /// Sends in the window below which nothing is blocked.
    pub min_sends: u32,
    /// The window's length in milliseconds.
    pub window_ms: u64,
    /// These figures against the threshold, as audit rows word them.
    pub rule: String,
    /// A country's normal: its average sends per window over
    /// `sms.pumping.country_history`, learnt from slices whose codes were
    /// verified enough. Absent for a prefix.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false, example = 20.4)]
    pub normal: Option<f64>,
    /// For a country: how many times its normal its sends must reach
    /// (`sms.pumping.country_surge`). Absent for a prefix.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false, example = 5.0)]
    pub surge: Option<f64>,
    /// How far the guard has gone: `open`, `challenge` (a country's sends
    /// need a passed captcha) or `block`; a shadow escalation leaves it
    /// `open`.
    pub level: PumpingLevel,
    /// A country's challenge, while one lasts; absent when there is none.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    pub challenge: Option<PumpingBlock>,
    /// The block, while one lasts; absent when there is none.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    pub block: Option<PumpingBlock>,
}

/// How far the pumping guard has gone with a prefix or country.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum PumpingLevel {
    /// Sends go through.
    Open,
    /// Sends need a passed captcha (a country).
    Challenge,
    /// Sends are refused.
    Block,
}

/// A prefix or country blocked (or a country challenged) by the SMS
/// pumping guard.
#[derive(Debug, Clone, PartialEq, Serialize, utoipa::ToSchema)]
pub struct PumpingBlock {
    /// When the block (or challenge) ends.
    pub until: DateTime<Utc>,
    /// The codes sent that set it (a country's block: those sent since its
    /// challenge began, each past a captcha).
    pub sends: u32,
    /// How many of them were verified.
    pub verified: u32,
    /// Those figures against the threshold (`prefix conversion 3/20 (15%) < 20% per 1h`).
    pub rule: String,
    /// Decided in shadow mode: audited, never enforced.
    pub shadow: bool,
}

/// A block in the console's list: the subject and when its block ends.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListedBlock {
    /// The prefix or country.
    pub subject: Subject,
    /// When the block ends.
    pub until: DateTime<Utc>,
}

impl SubjectAdmin {
    /// A prefix's or country's conversion, normal and escalation, as the
    /// store has them.
    pub(super) async fn pumping_state(
        &self,
        subject: &Subject,
        policy: &ConversionPolicy,
    ) -> Result<PumpingState, StoreError> {
        let key = self.ctx.keys.subject_conversion(subject);
        let live = self.ctx.store.conversion_state(&key, policy).await?;
        let describe = |sent, verified, normal_milli, after_captcha| {
            let figures = pumping::Figures {
                sent,
                verified,
                normal_milli,
                after_captcha,
            };
            pumping::describe(subject.kind, figures, policy)
        };
        let surge = policy.surge;
        let escalation = live.block.map(|b| {
            let after_captcha = surge.is_some() && b.level == Escalation::Block;
            let view = PumpingBlock {
                until: in_ms(b.retry_after_ms),
                sends: b.events,
                verified: b.successes,
                rule: describe(b.events, b.successes, b.normal_milli, after_captcha),
                shadow: b.shadow,
            };
            (b.level, view)
        });
        let level = match &escalation {
            Some((_, view)) if view.shadow => PumpingLevel::Open,
            Some((Escalation::Challenge, _)) => PumpingLevel::Challenge,
            Some((Escalation::Block, _)) => PumpingLevel::Block,
            None => PumpingLevel::Open,
        };
        let (challenge, block) = match escalation {
            Some((Escalation::Challenge, view)) => (Some(view), None),
            Some((Escalation::Block, view)) => (None, Some(view)),
            None => (None, None),
        };
        Ok(PumpingState {
            sends: live.events,
            verified: live.successes,
            min_sends: policy.min_events,
            window_ms: policy.window_ms,
            rule: describe(live.events, live.successes, live.normal_milli, false),
            normal: surge.map(|_| live.normal_milli as f64 / 1000.0),
            surge: surge.map(|s| f64::from(s.factor_milli) / 1000.0),
            level,
            challenge,
            block,
        })
    }

    /// The prefixes and countries the pumping guard has blocked (not in
    /// shadow mode), latest-ending first, at most `limit`; and how many
    /// there are.
    pub async fn pumping_blocks(
        &self,
        limit: usize,
    ) -> Result<(Vec<ListedBlock>, u64), StoreError> {
        let index = self.ctx.keys.conversion_blocks();
        let listed = self.ctx.store.expiring_members(&index, limit).await?;
        let blocks = listed
            .members
            .iter()
            .filter_map(|(member, retry_ms)| {
                Some(ListedBlock {
                    subject: pumping::listed_subject(member)?,
                    until: in_ms(*retry_ms),
                })
            })
            .collect();
        Ok((blocks, listed.total))
    }
}
