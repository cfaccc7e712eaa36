//! The SMS pumping guard (issue 10, point 1; issue 18, point 2). Toll fraud
//! sends codes to number ranges an attacker is paid for, and never verifies
//! them; ordinary users verify most of theirs. So codes sent and codes
//! verified are counted per number prefix (`sms.prefix_digits`) and per
//! country (the number's region). A prefix with at least `min_sends` sends
//! in the window whose share of verified codes is below `min_conversion` is
//! blocked for `block_duration`. A country is not a number range: anyone
//! can send to it, so it is judged against its own normal (its average
//! sends per window, learnt from verified traffic), needs
//! `country_min_sends` and `country_surge` times its normal before a
//! captcha is asked, and is blocked only when the sends that passed the
//! captcha surge unverified again (docs/pumping.md has the numbers).
//!
//! The check and the count ride on the send's one reservation
//! (`guard::reserve`): a block refuses before any window is touched, and a
//! send counts only once it is recorded (a failed delivery takes it back).
//! Each escalation is decided once, by the store: the send that trips a
//! block is audited as `lock`, later ones as `deny`; the send that starts a
//! country's challenge as `challenge`, and later ones refused for want of a
//! captcha as `challenge` too; all with the figures.

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
    let Some(pumping) = &policy.sms.pumping else {
        return Vec::new();
    };
    let prefix = Subject::new(
        SubjectKind::Prefix,
        phone.prefix(policy.sms.settings.prefix_digits as usize),
    );
    let country = phone
        .region()
        .map(|region| Subject::new(SubjectKind::Country, region));
    std::iter::once((prefix, &pumping.prefix))
        .chain(country.map(|c| (c, &pumping.country)))
        .map(|(subject, policy)| ConversionSubject {
            key: keys.subject_conversion(&subject),
            subject,
            policy,
        })
        .collect()
}

/// Whether the guard counts `kind` (a prefix or a country).
pub fn counts(kind: SubjectKind) -> bool {
    matches!(kind, SubjectKind::Prefix | SubjectKind::Country)
}

/// A multiple or a normal as audit rows and the console write them: at
/// most one decimal, none when whole (`5`, `2.5`, `20.4`).
pub fn thousandths(value: u64) -> String {
    let tenths = (value + 50) / 100;
    match tenths % 10 {
        0 => format!("{}", tenths / 10),
        d => format!("{}.{d}", tenths / 10),
    }
}

/// The figures a conversion is judged on.
#[derive(Debug, Clone, Copy)]
pub struct Figures {
    /// Codes sent.
    pub sent: u32,
    /// Codes verified.
    pub verified: u32,
    /// The normal, in thousandths of a send per window (countries only).
    pub normal_milli: u64,
    /// Counted since a captcha was asked: the sends of a block after one.
    pub after_captcha: bool,
}

/// How the audit trail and the console describe a conversion:
/// `prefix conversion 3/20 (15%) < 20% per 1h`, the verified codes over the
/// codes sent, their share, the threshold and the window; for a country
/// with the normal and the multiple a surge needs
/// (`country conversion 3/600 (0.5%) < 20% per 1h, 600 sends ≥ 5× normal 20`),
/// and `after captcha` when the sends were counted under a challenge.
pub fn describe(kind: SubjectKind, figures: Figures, policy: &ConversionPolicy) -> String {
    let Figures {
        sent,
        verified,
        normal_milli,
        after_captcha,
    } = figures;
    let share = if sent == 0 {
        String::from("–")
    } else {
        percent(f64::from(verified) / f64::from(sent))
    };
    let mut text = format!(
        "{kind} conversion {verified}/{sent} ({share}) < {} per {}",
        percent(f64::from(policy.min_ratio_ppm) / 1_000_000.0),
        format_window(policy.window_ms)
    );
    if after_captcha {
        text.push_str(" after captcha");
    }
    if let Some(surge) = policy.surge {
        text.push_str(&format!(
            ", {sent} sends ≥ {}× normal {}",
            thousandths(u64::from(surge.factor_milli)),
            thousandths(normal_milli)
        ));
    }
    text
}

/// What the pumping guard found of one subject for this send.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Found {
    /// This send blocked it (`lock`).
    Blocks,
    /// It was blocked (`deny`).
    Blocked,
    /// This send started its challenge (`challenge`, audited whether or
    /// not the send passed a captcha).
    Challenges,
    /// It was challenged, and this send passed no captcha (`challenge`).
    Challenged,
}

/// A subject this send found blocked or challenged, and how.
pub(super) struct Finding<'r> {
    /// The prefix or country.
    pub subject: &'r Subject,
    /// What was found.
    pub found: Found,
    /// How long the block or challenge lasts from now.
    pub lasts_ms: u64,
    /// The audit row, with the figures that set it.
    pub row: AuditEvent,
}

/// What the reservation's conversions found: one finding per subject
/// blocked, or challenged (a challenge it got past with a captcha is
/// found only on the send that started it).
pub(super) fn findings<'r>(reservation: &'r Reservation<'_>) -> Vec<Finding<'r>> {
    reservation
        .conversions
        .iter()
        .zip(&reservation.conversion_outcomes)
        .filter_map(|(c, outcome)| {
            let block_ms = c.policy.block_ms;
            let (found, decision, lasts_ms) = match outcome.verdict {
                ConversionVerdict::Open => return None,
                ConversionVerdict::Tripped => (Found::Blocks, AuditDecision::Lock, block_ms),
                ConversionVerdict::Blocked { retry_after_ms } => {
                    (Found::Blocked, AuditDecision::Deny, retry_after_ms)
                }
                ConversionVerdict::ChallengeTripped => {
                    (Found::Challenges, AuditDecision::Challenge, block_ms)
                }
                ConversionVerdict::Challenged { .. } if reservation.gate_open => return None,
                ConversionVerdict::Challenged { retry_after_ms } => {
                    (Found::Challenged, AuditDecision::Challenge, retry_after_ms)
                }
            };
            let blocked = matches!(found, Found::Blocks | Found::Blocked);
            let figures = Figures {
                sent: outcome.events,
                verified: outcome.successes,
                normal_milli: outcome.normal_milli,
                after_captcha: blocked && c.policy.surge.is_some(),
            };
            let row = AuditEvent::new(
                Action::SmsSend,
                decision,
                Reason::PumpingSuspected,
                &c.subject,
            )
            .described(
                describe(c.subject.kind, figures, c.policy),
                outcome.events,
                c.policy.min_events,
                c.policy.window_ms,
            )
            .retry_after_ms(lasts_ms);
            Some(Finding {
                subject: &c.subject,
                found,
                lasts_ms,
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
pub(super) mod tests {
    use super::*;
    use crate::store::Surge;

    /// A prefix's policy as the default settings have it.
    pub(crate) const PREFIX: ConversionPolicy = ConversionPolicy {
        min_events: 20,
        min_ratio_ppm: 200_000,
        window_ms: 3_600_000,
        block_ms: 43_200_000,
        surge: None,
    };

    fn figures(sent: u32, verified: u32, normal_milli: u64) -> Figures {
        Figures {
            sent,
            verified,
            normal_milli,
            after_captcha: false,
        }
    }

    #[test]
    fn a_conversion_reads_with_its_three_figures() {
        assert_eq!(
            describe(SubjectKind::Prefix, figures(20, 3, 0), &PREFIX),
            "prefix conversion 3/20 (15%) < 20% per 1h"
        );
        assert_eq!(
            describe(SubjectKind::Country, figures(3, 1, 0), &PREFIX),
            "country conversion 1/3 (33.3%) < 20% per 1h"
        );
    }

    #[test]
    fn a_country_reads_with_its_normal_and_the_surge_it_needs() {
        let country = ConversionPolicy {
            min_events: 500,
            surge: Some(Surge {
                factor_milli: 5_000,
                history_ms: 7 * 86_400_000,
                block: true,
            }),
            ..PREFIX
        };
        assert_eq!(
            describe(SubjectKind::Country, figures(600, 3, 20_449), &country),
            "country conversion 3/600 (0.5%) < 20% per 1h, 600 sends ≥ 5× normal 20.4"
        );
        let after = Figures {
            after_captcha: true,
            ..figures(520, 0, 0)
        };
        assert_eq!(
            describe(SubjectKind::Country, after, &country),
            "country conversion 0/520 (0%) < 20% per 1h after captcha, 520 sends ≥ 5× normal 0"
        );
    }

    #[test]
    fn thousandths_keep_one_decimal_at_most() {
        assert_eq!(thousandths(5_000), "5");
        assert_eq!(thousandths(2_500), "2.5");
        assert_eq!(thousandths(20_449), "20.4");
        assert_eq!(thousandths(20_450), "20.5");
        assert_eq!(thousandths(999_960), "1000");
        assert_eq!(thousandths(0), "0");
    }

    #[test]
    fn listed_members_name_their_subject() {
        let subject = Subject::new(SubjectKind::Prefix, "+8613800");
        assert_eq!(listed_member(&subject), "prefix:+8613800");
        assert_eq!(listed_subject("prefix:+8613800"), Some(subject));
        assert_eq!(listed_subject("planet:earth"), None);
    }
}
