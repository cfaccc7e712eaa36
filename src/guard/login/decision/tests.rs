use super::*;
use crate::domain::SubjectKind;
use crate::settings::Settings;
use crate::store::{IpFailures, LoginAttemptOutcome};

fn default_policy() -> Policy {
    Policy::from_settings(&Settings::load(None).unwrap()).unwrap()
}

fn ip_windows(policy: &Policy) -> IpWindows {
    IpWindows {
        subject: Subject::new(SubjectKind::Ip, "203.0.113.7"),
        key: "k".into(),
        windows: policy.login.ip.windows(),
    }
}

/// A locked user failing from a blocked IP: the IP's block answers first,
/// and in shadow mode both refusals are written, shadowed, and the
/// attempt is allowed.
#[test]
fn refusals_come_in_order_and_shadow_writes_them_all() {
    let policy = default_policy();
    let user = Subject::new(SubjectKind::User, "alice");
    let ip = ip_windows(&policy);
    let outcome = LoginOutcome {
        user: LoginAttemptOutcome {
            verdict: LoginVerdict::Locked {
                retry_after_ms: 60_000,
            },
            failures: 12,
            captcha_crossed: false,
            locked_for_ms: None,
            pair_locked_for_ms: None,
            before: None,
        },
        ip: Some(IpFailures {
            count: 40,
            blocked_retry_after_ms: Some(5_000),
        }),
        network: None,
    };
    let facts = || Attempt {
        user: &user,
        ip: Some(&ip),
        network: None,
        success: false,
    };
    let decided = attempt(&policy, &outcome, facts());
    let reasons: Vec<_> = decided.refusals.iter().map(|(a, _)| a.reason).collect();
    assert_eq!(reasons, [Some(Reason::IpBlocked), Some(Reason::UserLocked)]);
    assert_eq!(
        decided.refusals[0].0.retry_after_secs,
        Some(60),
        "a retry passes once the lock has ended too"
    );
    assert!(decided.refusals[0].0.locked);
    assert_eq!(
        decided.refusals[0].1.retry_after_ms,
        Some(5_000),
        "the IP's row"
    );

    let mut shadow = default_policy();
    shadow.login.shadow = true;
    let shadowed = attempt(&shadow, &outcome, facts());
    assert!(shadowed.refusals.is_empty());
    assert_eq!(shadowed.allowed, LoginState::allow(12));
    let rows: Vec<_> = shadowed
        .crossed
        .iter()
        .map(|r| (r.reason.as_str(), r.shadow))
        .collect();
    assert_eq!(rows, [("ip_blocked", true), ("user_locked", true)]);
}

/// `/login/check` on a locked user from a blocked IP: the lock named
/// first, as ever, and the later of the two ends, whichever it is, as an
/// attempt gives it.
#[test]
fn check_gives_the_later_end_of_a_lock_and_a_block() {
    let policy = default_policy();
    let check_with = |lock_ms: u64, block_ms: u64| {
        check(
            &policy,
            Checked {
                user: &LoginStateOutcome {
                    locked_retry_after_ms: Some(lock_ms),
                    pair_locked_retry_after_ms: None,
                    failures: 12,
                    lock_window_failures: 12,
                },
                ip: Some(&PeekOutcome {
                    counts: vec![100, 100],
                    retry_after_ms: vec![block_ms, block_ms],
                }),
                network: None,
            },
        )
    };
    for (lock_ms, block_ms) in [(60_000, 5_000), (5_000, 60_000)] {
        let checked = check_with(lock_ms, block_ms);
        assert_eq!(
            (checked.reason, checked.locked, checked.retry_after_secs),
            (Some(Reason::UserLocked), true, Some(60)),
            "lock {lock_ms} ms, block {block_ms} ms"
        );
    }
}

/// The failure that locks: a lock row, the notice's duration, and the
/// answer says locked without refusing.
#[test]
fn the_locking_failure_is_audited_and_told() {
    let policy = default_policy();
    let user = Subject::new(SubjectKind::User, "alice");
    let outcome = LoginOutcome {
        user: LoginAttemptOutcome {
            verdict: LoginVerdict::Recorded,
            failures: 10,
            captcha_crossed: false,
            locked_for_ms: Some(900_000),
            pair_locked_for_ms: None,
            before: None,
        },
        ip: None,
        network: None,
    };
    let decided = attempt(
        &policy,
        &outcome,
        Attempt {
            user: &user,
            ip: None,
            network: None,
            success: false,
        },
    );
    assert!(decided.refusals.is_empty());
    let rows: Vec<_> = decided.crossed.iter().map(|r| r.reason.as_str()).collect();
    assert_eq!(rows, ["too_many_failures"]);
    assert_eq!(
        decided.notify_lock,
        Some((Duration::from_secs(900), LockedScope::Account))
    );
    assert!(decided.allowed.locked);
    assert_eq!(decided.allowed.retry_after_secs, Some(900));
}

/// A network past its tier challenges a user and an IP below theirs: the
/// row names the network; the failure that fills the tier is audited once
/// and the answer asks for a captcha from then on.
#[test]
fn a_full_network_tier_challenges_and_its_crossing_is_audited() {
    let policy = default_policy();
    let tier = policy.login.network.gate.expect("on by default");
    let user = Subject::new(SubjectKind::User, "alice");
    let network = Subject::new(SubjectKind::Network, "2001:db8:1::/48");
    let ip = ip_windows(&policy);
    let facts = || Attempt {
        user: &user,
        ip: Some(&ip),
        network: Some(&network),
        success: false,
    };
    let outcome = |verdict, network_count| LoginOutcome {
        user: LoginAttemptOutcome {
            verdict,
            failures: 1,
            captcha_crossed: false,
            locked_for_ms: None,
            pair_locked_for_ms: None,
            before: None,
        },
        ip: Some(IpFailures {
            count: 1,
            blocked_retry_after_ms: None,
        }),
        network: Some(network_count),
    };

    let refused = attempt(
        &policy,
        &outcome(LoginVerdict::Challenged, tier.limit),
        facts(),
    );
    let (answer, row) = &refused.refusals[0];
    assert_eq!(answer.reason, Some(Reason::CaptchaRequired));
    assert_eq!(
        (row.subject_kind, row.subject.as_str()),
        (SubjectKind::Network, "2001:db8:1::/48")
    );
    assert_eq!(row.rule.as_deref(), Some("network 100/1h"));

    let filling = attempt(
        &policy,
        &outcome(LoginVerdict::Recorded, tier.limit - 1),
        facts(),
    );
    assert!(filling.refusals.is_empty());
    assert!(filling.allowed.captcha_required);
    let rows: Vec<_> = filling
        .crossed
        .iter()
        .map(|r| (r.subject_kind, r.reason.as_str()))
        .collect();
    assert_eq!(rows, [(SubjectKind::Network, "captcha_required")]);

    let below = attempt(
        &policy,
        &outcome(LoginVerdict::Recorded, tier.limit - 2),
        facts(),
    );
    assert!(below.crossed.is_empty());
    assert!(!below.allowed.captcha_required);
}
