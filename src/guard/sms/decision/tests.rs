//! The send decision as a table: each case's facts, what it answers and
//! the rows it writes, enforced and in shadow mode.

use super::*;
use crate::audit::AuditDecision;
use crate::guard::pumping::tests::PREFIX;
use crate::guard::reserve::{ConversionSubject, Refusal, SubjectHit};
use crate::guard::Policy;
use crate::lists::EntryKind;
use crate::settings::Settings;
use crate::store::{ConversionOutcome, ConversionVerdict, DroppedCode, HitVerdict};

fn policy() -> Policy {
    Policy::from_settings(&Settings::load(None).unwrap()).unwrap()
}

fn phone() -> Subject {
    Subject::new(SubjectKind::Phone, "+8613800138000")
}

/// What the store said of a send, in the terms the cases need.
#[derive(Clone, Copy, Default)]
struct Said {
    /// The phone's windows before this send (default rules: 1/60s, 5/1h,
    /// 10/24h, then the captcha tier 3/1h).
    counts: [u32; 4],
    /// The phone's verdict.
    verdict: Option<HitVerdict>,
    /// The prefix's and the country's conversions.
    prefix: Option<ConversionVerdict>,
    country: Option<ConversionVerdict>,
}

/// The country challenged, for another second.
const CHALLENGED: Option<ConversionVerdict> = Some(ConversionVerdict::Challenged {
    retry_after_ms: 1_000,
});

fn reservation(policy: &Policy, said: Said) -> Reservation<'_> {
    let verdict = said.verdict.unwrap_or(HitVerdict::Allowed);
    let allowed = verdict == HitVerdict::Allowed;
    let rules = &policy.sms.phone;
    let refusal = match verdict {
        HitVerdict::Allowed => None,
        HitVerdict::Denied {
            window,
            retry_after_ms,
        } => Some((window, RefusalKind::RateLimited { retry_after_ms })),
        HitVerdict::Gated { window } => Some((window, RefusalKind::CaptchaRequired)),
    };
    let conversion = |kind, id: &str, verdict: Option<ConversionVerdict>| {
        let subject = Subject::new(kind, id);
        let outcome = ConversionOutcome {
            verdict: verdict?,
            events: 30,
            successes: 1,
            counted_in: None,
            normal_milli: 0,
        };
        let key = String::from("conversion");
        Some((
            ConversionSubject {
                subject,
                key,
                policy: &PREFIX,
            },
            outcome,
        ))
    };
    let (conversions, conversion_outcomes) = [
        conversion(SubjectKind::Prefix, "+86138001", said.prefix),
        conversion(SubjectKind::Country, "CN", said.country),
    ]
    .into_iter()
    .flatten()
    .unzip();
    Reservation {
        hits: vec![SubjectHit {
            subject: phone(),
            key: "window".into(),
            rules,
        }],
        outcomes: vec![HitOutcome {
            verdict,
            added: allowed,
            counts: said.counts.to_vec(),
            next_retry_after_ms: 60_000,
            observed_waits: Vec::new(),
        }],
        member: "m".into(),
        conversions,
        conversion_outcomes,
        recorded: allowed,
        by_fallback: false,
        gate_open: false,
        refusal: refusal.map(|(window, kind)| Refusal {
            subject: phone(),
            rule: rules.rule_at(window).unwrap(),
            observed: said.counts[window],
            kind,
        }),
    }
}

/// A decision's answer (the refusal's error code, or `ok`) and its rows
/// (decision, reason, shadow), enforced and then in shadow mode.
/// A row as the cases write it: (decision, reason, shadow).
type Row = (String, String, bool);
/// An answer and its rows.
type Outcome = (String, Vec<Row>);

fn outcome<A: Answer>(decided: Decision<A>) -> Outcome {
    let settled = decided.settle();
    let answer = match &settled.answer {
        Ok(_) => "ok".to_string(),
        Err(refusal) => format!("{refusal:?}"),
    };
    let rows = settled.rows.iter();
    let rows = rows.map(|r| (r.decision.as_str().to_string(), r.reason.clone(), r.shadow));
    (answer, rows.collect())
}

fn both<A: Answer>(decide: impl Fn() -> Decision<A>) -> [Outcome; 2] {
    [outcome(decide()), outcome(decide().shadowed())]
}

fn listing(listed: Listed) -> Listing {
    let row = matches!(listed, Listed::Blocked(_)).then(|| {
        AuditEvent::new(
            Action::SmsSend,
            AuditDecision::Deny,
            Reason::Blocklisted,
            &phone(),
        )
    });
    Listing {
        listed,
        row,
        subject_allowed_exactly: false,
    }
}

fn row(decision: &str, reason: &str, shadow: bool) -> Row {
    (decision.into(), reason.into(), shadow)
}

#[test]
fn the_lists_and_the_region_refuse_first_and_shadow_writes_them_all() {
    let denied = Region::Denied(Some("CN".into()));
    let blocked = Listed::Blocked(EntryKind::Phone);
    let allowed = Listed::Allowed(EntryKind::Ip);
    // The case, its facts, the answer, the rows enforced, the rows in shadow.
    type Case<'a> = (
        &'a str,
        Listed,
        Region,
        &'a str,
        &'a [&'a str],
        &'a [&'a str],
    );
    let cases: [Case; 4] = [
        (
            "blocklisted",
            blocked,
            Region::Allowed,
            "Blocklisted(Phone)",
            &["blocklisted"],
            &["blocklisted"],
        ),
        (
            "region",
            Listed::No,
            denied.clone(),
            "RegionBlocked { region: Some(\"CN\") }",
            &["region_blocked"],
            &["region_blocked"],
        ),
        (
            "blocklisted, in a blocked region: the list answers",
            blocked,
            denied.clone(),
            "Blocklisted(Phone)",
            &["blocklisted"],
            &["blocklisted", "region_blocked"],
        ),
        (
            "allow-listed, in a blocked region: the region still refuses",
            allowed,
            denied,
            "RegionBlocked { region: Some(\"CN\") }",
            &["region_blocked"],
            &["region_blocked"],
        ),
    ];
    let rows = |reasons: &[&str], shadow| reasons.iter().map(|r| row("deny", r, shadow)).collect();
    for (case, listed, region, answer, enforced_rows, shadow_rows) in cases {
        let [enforced, shadowed] = both(|| screen(listing(listed), true, region.clone(), &phone()));
        assert_eq!(
            enforced,
            (answer.to_string(), rows(enforced_rows, false)),
            "{case}"
        );
        let expected = ("ok".to_string(), rows(shadow_rows, true));
        assert_eq!(shadowed, expected, "{case}, shadow");
    }
}

#[test]
fn an_allow_entry_exempts_and_no_entry_counts() {
    let exempt = screen(
        listing(Listed::Allowed(EntryKind::Ip)),
        true,
        Region::Allowed,
        &phone(),
    );
    assert_eq!(exempt.settle().answer.unwrap(), Pass::AddressExempt);
    let rig = Listing {
        subject_allowed_exactly: true,
        ..listing(Listed::Allowed(EntryKind::Ip))
    };
    let rig = screen(rig, true, Region::Allowed, &phone());
    assert_eq!(
        rig.settle().answer.unwrap(),
        Pass::Exempt,
        "address and phone"
    );
    let phone_listed = |names_client, exactly| {
        let listing = Listing {
            subject_allowed_exactly: exactly,
            ..listing(Listed::Allowed(EntryKind::Phone))
        };
        let screened = screen(listing, names_client, Region::Allowed, &phone());
        screened.settle().answer.unwrap()
    };
    assert_eq!(phone_listed(true, true), Pass::AskerCounted);
    assert_eq!(phone_listed(true, false), Pass::RangeAllowed, "a prefix's");
    assert_eq!(
        phone_listed(false, true),
        Pass::Counted,
        "no asker to count"
    );
    assert_eq!(
        phone_listed(false, false),
        Pass::Counted,
        "no asker to count"
    );
    let counted = screen(listing(Listed::No), true, Region::Allowed, &phone());
    assert_eq!(counted.shadowed().settle().answer.unwrap(), Pass::Counted);
}

#[test]
fn a_reservation_answers_in_order_and_shadow_refuses_nothing() {
    let policy = policy();
    let rate_limited = HitVerdict::Denied {
        window: 1,
        retry_after_ms: 9_000,
    };
    let cases = [
        (
            "pumping block trips",
            Said {
                prefix: Some(ConversionVerdict::Tripped),
                ..Said::default()
            },
            "PumpingSuspected",
            vec![row("lock", "pumping_suspected", false)],
        ),
        (
            "window refusal",
            Said {
                counts: [0, 5, 5, 0],
                verdict: Some(rate_limited),
                ..Said::default()
            },
            "RateLimited { rule: \"phone 5/1h\", retry_after_ms: 9000 }",
            vec![row("deny", "rate_limited", false)],
        ),
        (
            "captcha tier, with the country challenged",
            Said {
                counts: [0, 2, 2, 3],
                verdict: Some(HitVerdict::Gated { window: 3 }),
                country: CHALLENGED,
                ..Said::default()
            },
            "CaptchaRequired",
            vec![
                row("challenge", "captcha_required", false),
                row("challenge", "pumping_suspected", false),
            ],
        ),
        (
            "the country's challenge alone",
            Said {
                country: CHALLENGED,
                ..Said::default()
            },
            "CaptchaRequired",
            vec![row("challenge", "pumping_suspected", false)],
        ),
        (
            "a window refuses while the country's challenge starts",
            Said {
                counts: [1, 1, 1, 1],
                verdict: Some(HitVerdict::Denied {
                    window: 0,
                    retry_after_ms: 30_000,
                }),
                country: Some(ConversionVerdict::ChallengeTripped),
                ..Said::default()
            },
            "RateLimited { rule: \"phone 1/1m\", retry_after_ms: 30000 }",
            vec![
                row("challenge", "pumping_suspected", false),
                row("deny", "rate_limited", false),
            ],
        ),
    ];
    for (case, said, answer, rows) in cases {
        let [enforced, shadowed] = both(|| reserved(&reservation(&policy, said), false));
        assert_eq!(enforced, (answer.to_string(), rows.clone()), "{case}");
        let shadow_rows: Vec<_> = rows.into_iter().map(|(d, r, _)| (d, r, true)).collect();
        assert_eq!(shadowed, ("ok".to_string(), shadow_rows), "{case}, shadow");
        let blocks = reserved(&reservation(&policy, said), false).new_blocks;
        let tripped = said.prefix == Some(ConversionVerdict::Tripped);
        assert_eq!(blocks.len(), usize::from(tripped), "{case}: blocks listed");
        let shadow_blocks = reserved(&reservation(&policy, said), false)
            .shadowed()
            .new_blocks;
        assert!(shadow_blocks.is_empty(), "{case}: shadow lists no block");
    }
}

/// A challenge the send started, audited before its captcha token went to
/// the provider (`challenge_audited`), is not written again with the refusal.
#[test]
fn a_challenge_audited_before_the_token_check_is_not_written_again() {
    let policy = policy();
    let started = Said {
        country: Some(ConversionVerdict::ChallengeTripped),
        ..Said::default()
    };
    let [fresh, _] = both(|| reserved(&reservation(&policy, started), false));
    let [audited, _] = both(|| reserved(&reservation(&policy, started), true));
    assert_eq!(
        fresh,
        (
            "CaptchaRequired".to_string(),
            vec![row("challenge", "pumping_suspected", false)]
        )
    );
    assert_eq!(audited, ("CaptchaRequired".to_string(), vec![]));
}

#[test]
fn a_send_that_goes_ahead_tells_its_wait_quota_and_captcha() {
    let policy = policy();
    let said = Said {
        counts: [0, 3, 4, 2],
        ..Said::default()
    };
    let decided = reserved(&reservation(&policy, said), false);
    let grant = decided.settle().answer.unwrap();
    assert_eq!(
        grant,
        Grant {
            resend_after_ms: 60_000,
            // The captcha tier (3/1h) is reached by this send, the third.
            captcha_required: true,
            // 1/60s, empty before this send: none left after it (5/1h
            // has one left).
            quota: Some(Quota {
                limit: 1,
                window_secs: 60,
                remaining: 0,
            }),
        }
    );
    let shadowed = reserved(&reservation(&policy, said), false).shadowed();
    assert_eq!(shadowed.settle().answer.unwrap(), Grant::default());
}

/// The metric's label follows what the send gave back, not only its
/// failure: a declined send the budgets kept (past them, or naming no
/// client, which `within_failure_budget` keeps at once) is `over_budget`.
#[test]
fn a_failed_delivery_is_counted_by_what_it_gave_back() {
    let declined = DeliveryError::Declined("twilio answered 400, error code 21408".into());
    let said = give_back(&declined, true);
    assert_eq!(
        delivery_outcome(&declined, said, said),
        SmsDelivery::Declined
    );
    for address_counted in [true, false] {
        let kept = said.past_the_budget(address_counted);
        assert_eq!(
            delivery_outcome(&declined, said, kept),
            SmsDelivery::OverBudget,
            "{kept:?}"
        );
    }
    let dropped = DeliveryError::Dropped("connection reset by peer".into());
    let said = give_back(&dropped, true);
    assert_eq!(said, GiveBack::Whole);
    assert_eq!(delivery_outcome(&dropped, said, said), SmsDelivery::Dropped);
    let kept = said.past_the_budget(true);
    assert_eq!(
        delivery_outcome(&dropped, said, kept),
        SmsDelivery::OverBudget
    );
    let cases = [
        (
            DeliveryError::Refused("21211".into()),
            true,
            SmsDelivery::RefusedNumber,
        ),
        (
            DeliveryError::Rejected("503".into()),
            true,
            SmsDelivery::Failed,
        ),
        (
            DeliveryError::Unreachable("refused".into()),
            false,
            SmsDelivery::Failed,
        ),
        (DeliveryError::TimedOut, false, SmsDelivery::TimedOut),
    ];
    for (error, address_counted, label) in cases {
        // No budget is asked of these: what they say is what they give.
        let said = give_back(&error, address_counted);
        assert_eq!(delivery_outcome(&error, said, said), label, "{error:?}");
    }
}

/// A send naming no client has no budget of failures: a declined one
/// keeps what a delivered one would, a dropped connection only the
/// phone's windows (every send meets it alike in an outage).
#[test]
fn a_send_naming_no_client_keeps_by_its_failure() {
    let declined = DeliveryError::Declined("webhook answered 400".into());
    assert_eq!(
        without_a_budget(&declined, GiveBack::Whole, false),
        GiveBack::CodeAndPumpingCount
    );
    let dropped = DeliveryError::Dropped("connection reset by peer".into());
    let kept = without_a_budget(&dropped, GiveBack::Whole, false);
    assert_eq!(kept, GiveBack::AllButThePhone);
    for kind in [
        SubjectKind::Prefix,
        SubjectKind::Global,
        SubjectKind::Country,
        SubjectKind::Ip,
        SubjectKind::Network,
    ] {
        assert!(!kept.keeps_windows_of(kind), "{kind:?}");
    }
    assert!(kept.keeps_windows_of(SubjectKind::Phone));
    assert!(!kept.keeps_the_code());
}

#[test]
fn a_failed_delivery_gives_back_what_its_failure_says() {
    let refused = DeliveryError::Refused("twilio answered 400, error code 21211".into());
    assert_eq!(give_back(&refused, true), GiveBack::AllButTheAddress);
    // An allow-listed address's send counts in no address window: every
    // other window keeps it, or naming that address would cost nothing.
    assert_eq!(give_back(&refused, false), GiveBack::CodeAndPumpingCount);
    let rejected = DeliveryError::Rejected("webhook answered 503".into());
    assert_eq!(give_back(&rejected, true), GiveBack::Whole);
    let declined = DeliveryError::Declined("webhook answered 400".into());
    assert_eq!(give_back(&declined, false), GiveBack::Whole);
    let unreachable = DeliveryError::Unreachable("connection refused".into());
    assert_eq!(give_back(&unreachable, true), GiveBack::Whole);
    let timed_out = DeliveryError::TimedOut;
    assert_eq!(give_back(&timed_out, false), GiveBack::PumpingCount);
    assert_eq!(
        GiveBack::Whole.past_the_budget(true),
        GiveBack::AllButTheAddress
    );
    assert_eq!(
        GiveBack::Whole.past_the_budget(false),
        GiveBack::CodeAndPumpingCount
    );
}

#[test]
fn each_failure_is_counted_as_its_own_delivery_outcome() {
    let outcomes = [
        (
            DeliveryError::Rejected("webhook answered 503".into()),
            "failed",
        ),
        (
            DeliveryError::Declined("webhook answered 400".into()),
            "declined",
        ),
        (
            DeliveryError::Refused("webhook answered 422".into()),
            "refused_number",
        ),
        (DeliveryError::TimedOut, "timed_out"),
    ];
    for (error, label) in outcomes {
        assert_eq!(super::outcome(&error).as_str(), label, "{error:?}");
    }
}

#[test]
fn a_refused_number_keeps_only_the_address_windows_and_a_timeout_keeps_all() {
    let kinds = [
        SubjectKind::Phone,
        SubjectKind::Ip,
        SubjectKind::Network,
        SubjectKind::Prefix,
        SubjectKind::Global,
    ];
    let kept = |give_back: GiveBack| -> Vec<SubjectKind> {
        kinds
            .into_iter()
            .filter(|&kind| give_back.keeps_windows_of(kind))
            .collect()
    };
    assert_eq!(kept(GiveBack::Whole), []);
    assert_eq!(
        kept(GiveBack::AllButTheAddress),
        [SubjectKind::Ip, SubjectKind::Network]
    );
    assert_eq!(kept(GiveBack::PumpingCount), kinds);
    assert!(GiveBack::PumpingCount.keeps_the_code());
    assert!(!GiveBack::AllButTheAddress.keeps_the_code());
    assert!(!GiveBack::Whole.keeps_the_code());
}

/// Only a code its drop found untried is not guessed at: a wrong try, a
/// code gone (used) and a drop that failed all are; and a send guessed at
/// keeps the phone's windows alone of those its failure gives back.
#[test]
fn a_failed_sends_phone_windows_keep_it_unless_its_code_was_found_untried() {
    assert_eq!(guessed_at(Some(DroppedCode::Untried)), Guessed::No);
    for dropped in [Some(DroppedCode::Tried), Some(DroppedCode::Absent), None] {
        assert_eq!(guessed_at(dropped), Guessed::Maybe, "{dropped:?}");
    }
    for kind in [SubjectKind::Phone, SubjectKind::Prefix, SubjectKind::Ip] {
        assert!(!keeps_windows_of(GiveBack::Whole, Guessed::No, kind));
        let phone = kind == SubjectKind::Phone;
        assert_eq!(
            keeps_windows_of(GiveBack::Whole, Guessed::Maybe, kind),
            phone
        );
    }
    let address = keeps_windows_of(GiveBack::AllButTheAddress, Guessed::Maybe, SubjectKind::Ip);
    assert!(address, "what the failure keeps stays kept");
}
