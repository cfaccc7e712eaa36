//! The SMS pumping guard (issue 10, point 1). Toll fraud sends codes to
//! number ranges an attacker is paid for, and never verifies them; ordinary
//! users verify most of theirs. So codes sent and codes verified are counted
//! per number prefix (`sms.prefix_digits`) and per country (the number's
//! region), and a prefix or country with at least `min_sends` sends in the
//! window whose share of verified codes is below `min_conversion` is blocked
//! for `block_duration`.
//!
//! The check and the count ride on the send's one reservation
//! (`guard::reserve`): a block refuses before any window is touched, and a
//! send counts only once it is recorded (a failed delivery takes it back).
//! The block is decided once, by the store: the send that trips it is
//! audited as `lock`, later ones as `deny`, both with the figures.

use futures::future::join_all;

use super::reserve::{ConversionSubject, Reservation};
use super::{GuardContext, Policy};
use crate::audit::{AuditDecision, AuditEvent};
use crate::domain::rule::format_window;
use crate::domain::{Action, PhoneNumber, Reason, Subject, SubjectKind};
use crate::settings::percent;
use crate::store::{ConversionPolicy, ConversionVerdict, Keys};

/// How many listed blocks the console shows.
pub const LISTED_BLOCKS: usize = 50;

/// The subjects a code to `phone` counts for: its prefix, and its country
/// when the number has one. None when the guard is off.
pub(super) fn subjects<'p>(
    policy: &'p Policy,
    keys: &Keys,
    phone: &PhoneNumber,
) -> Vec<ConversionSubject<'p>> {
    let Some(pumping) = &policy.pumping else {
        return Vec::new();
    };
    let prefix = Subject::new(
        SubjectKind::Prefix,
        phone.prefix(policy.sms.prefix_digits as usize),
    );
    let country = phone
        .region()
        .map(|region| Subject::new(SubjectKind::Country, region));
    std::iter::once(prefix)
        .chain(country)
        .map(|subject| ConversionSubject {
            key: keys.subject_conversion(&subject),
            subject,
            policy: pumping,
        })
        .collect()
}

/// Whether the guard counts `kind` (a prefix or a country).
pub fn counts(kind: SubjectKind) -> bool {
    matches!(kind, SubjectKind::Prefix | SubjectKind::Country)
}

/// How the audit trail and the console describe a conversion:
/// `prefix conversion 3/20 (15%) < 20% per 1h`, the verified codes over the
/// codes sent, their share, the threshold and the window.
pub fn describe(kind: SubjectKind, sent: u32, verified: u32, policy: &ConversionPolicy) -> String {
    let share = if sent == 0 {
        String::from("–")
    } else {
        percent(f64::from(verified) / f64::from(sent))
    };
    format!(
        "{kind} conversion {verified}/{sent} ({share}) < {} per {}",
        percent(f64::from(policy.min_ratio_ppm) / 1_000_000.0),
        format_window(policy.window_ms)
    )
}

/// A subject this send found blocked, and how.
pub(super) struct Finding<'r> {
    /// The prefix or country.
    pub subject: &'r Subject,
    /// `lock` when this send blocked it, `deny` when it already was.
    pub decision: AuditDecision,
    /// How long the block lasts from now.
    pub lasts_ms: u64,
    /// The audit row, with the figures that blocked it.
    pub row: AuditEvent,
}

/// What the reservation's conversions found: one finding per blocked
/// subject, empty when none is.
pub(super) fn findings<'r>(reservation: &'r Reservation<'_>) -> Vec<Finding<'r>> {
    reservation
        .conversions
        .iter()
        .zip(&reservation.conversion_outcomes)
        .filter_map(|(c, outcome)| {
            let (decision, retry_after_ms) = match outcome.verdict {
                ConversionVerdict::Open => return None,
                ConversionVerdict::Tripped => (AuditDecision::Lock, c.policy.block_ms),
                ConversionVerdict::Blocked { retry_after_ms } => {
                    (AuditDecision::Deny, retry_after_ms)
                }
            };
            let (sent, verified) = (outcome.events, outcome.successes);
            let row = AuditEvent::new(
                Action::SmsSend,
                decision,
                Reason::PumpingSuspected,
                &c.subject,
            )
            .described(
                describe(c.subject.kind, sent, verified, c.policy),
                sent,
                c.policy.min_events,
                c.policy.window_ms,
            )
            .retry_after_ms(retry_after_ms);
            Some(Finding {
                subject: &c.subject,
                decision,
                lasts_ms: retry_after_ms,
                row,
            })
        })
        .collect()
}

/// The member naming `subject` in the list of blocks (`prefix:+8613800`).
pub fn listed_member(subject: &Subject) -> String {
    format!("{}:{}", subject.kind, subject.id)
}

/// The subject a member of the list of blocks names.
pub fn listed_subject(member: &str) -> Option<Subject> {
    let (kind, id) = member.split_once(':')?;
    Some(Subject::new(SubjectKind::parse(kind)?, id))
}

/// Put a subject this send blocked in the list admins see. A failure only
/// leaves it off the list: the block itself is in place.
pub(super) async fn list_block(ctx: &GuardContext, subject: &Subject, block_ms: u64) {
    let index = ctx.keys.conversion_blocks();
    let listed = ctx
        .store
        .expiring_add(&index, &listed_member(subject), block_ms)
        .await;
    if let Err(e) = listed {
        tracing::warn!(request_id = %crate::telemetry::request_id(), error = %e, "could not list a pumping block");
    }
}

/// Count a verified code for its prefix and country. Best effort: the code
/// is used up whatever happens here, so a failure is logged, not answered
/// (a lost success makes a conversion look a little worse, never better).
pub(super) async fn count_verified(ctx: &GuardContext, policy: &Policy, phone: &PhoneNumber) {
    let subjects = subjects(policy, &ctx.keys, phone);
    let counts = subjects
        .iter()
        .map(|c| ctx.store.conversion_success(&c.key, c.policy));
    for result in join_all(counts).await {
        if let Err(e) = result {
            tracing::warn!(request_id = %crate::telemetry::request_id(), error = %e, "could not count a verified code");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_conversion_reads_with_its_three_figures() {
        let policy = ConversionPolicy {
            min_events: 20,
            min_ratio_ppm: 200_000,
            window_ms: 3_600_000,
            block_ms: 43_200_000,
        };
        assert_eq!(
            describe(SubjectKind::Prefix, 20, 3, &policy),
            "prefix conversion 3/20 (15%) < 20% per 1h"
        );
        assert_eq!(
            describe(SubjectKind::Country, 3, 1, &policy),
            "country conversion 1/3 (33.3%) < 20% per 1h"
        );
    }

    #[test]
    fn listed_members_name_their_subject() {
        let subject = Subject::new(SubjectKind::Prefix, "+8613800");
        assert_eq!(listed_member(&subject), "prefix:+8613800");
        assert_eq!(listed_subject("prefix:+8613800"), Some(subject));
        assert_eq!(listed_subject("planet:earth"), None);
    }
}
