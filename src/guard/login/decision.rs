//! What a login comes to, from what the store saw, before any effect: the
//! rules of DESIGN.md §3 as pure functions. The guard applies the result
//! (audit rows, the lock notice, the answer); shadow mode is one
//! transformation of it.

use std::time::Duration;

use super::{Denial, IpWindows, LoginState};
use crate::audit::{AuditDecision, AuditEvent};
use crate::delivery::email::LockedScope;
use crate::domain::{Action, Reason, Subject};
use crate::guard::{IpLoginRules, Policy};
use crate::store::{LoginOutcome, LoginStateOutcome, LoginVerdict, PeekOutcome};

/// An attempt's decision.
pub(super) struct AttemptDecision {
    /// What refuses the attempt, in the order DESIGN.md checks (the IP's
    /// block, then the user's lock or captcha tier), each with its audit row.
    /// The first one answers.
    pub refusals: Vec<(LoginState, AuditEvent)>,
    /// The rows of the thresholds that recording this attempt crossed.
    pub crossed: Vec<AuditEvent>,
    /// This attempt locked the user (the account, or only from this
    /// address) for this long: tell the owner.
    pub notify_lock: Option<(Duration, LockedScope)>,
    /// The answer when nothing refuses.
    pub allowed: LoginState,
}

impl AttemptDecision {
    /// Shadow mode: every row is written, marked shadowed; nothing is
    /// refused or mailed.
    pub fn shadowed(self) -> Self {
        let failures = self.allowed.failures;
        let rows = self.refusals.into_iter().map(|(_, row)| row);
        Self {
            refusals: Vec::new(),
            crossed: rows
                .chain(self.crossed)
                .map(|row| row.shadow(true))
                .collect(),
            notify_lock: None,
            allowed: LoginState::allow(failures),
        }
    }
}

/// The parts of an attempt the decision reads, besides the store's outcome.
pub(super) struct Attempt<'a> {
    /// The user the attempt is for.
    pub user: &'a Subject,
    /// The client IP's windows, when the IP is known.
    pub ip: Option<&'a IpWindows>,
    /// The client's IPv6 network, when its window was counted.
    pub network: Option<&'a Subject>,
    /// Whether the password was right.
    pub success: bool,
}

fn row(decision: AuditDecision, reason: Reason, subject: &Subject) -> AuditEvent {
    AuditEvent::new(Action::LoginAttempt, decision, reason, subject)
}

/// What the store's outcome says before this attempt's own effects: the
/// counts the refusals and the answer are built from.
struct Seen {
    /// The user's failures in the captcha window.
    failures: u32,
    /// The IP's failures before this attempt (0 without an IP).
    ip_count: u32,
    /// The IP's failures reached its captcha tier.
    ip_demands_captcha: bool,
    /// The network's failures before this attempt (0 without a network).
    network_count: u32,
    /// The network's failures reached its captcha tier.
    network_demands_captcha: bool,
    /// The user's, the IP's or the network's captcha tier is reached.
    captcha_required: bool,
}

impl Seen {
    fn of(policy: &Policy, outcome: &LoginOutcome) -> Self {
        let failures = outcome.user.failures;
        let ip_demands_captcha = outcome
            .ip
            .is_some_and(|seen| seen.count >= policy.login.ip.captcha.limit);
        let network_demands_captcha = outcome
            .network
            .is_some_and(|count| network_tier_full(policy, count));
        Seen {
            failures,
            ip_count: outcome.ip.map_or(0, |seen| seen.count),
            ip_demands_captcha,
            network_count: outcome.network.unwrap_or(0),
            network_demands_captcha,
            captcha_required: failures >= policy.login.user_captcha.limit
                || ip_demands_captcha
                || network_demands_captcha,
        }
    }
}

/// Whether `count` failures fill the network's captcha tier.
fn network_tier_full(policy: &Policy, count: u32) -> bool {
    policy
        .login
        .network
        .gate
        .is_some_and(|tier| count >= tier.limit)
}

/// `POST /login/attempt`.
/// In shadow mode (`policy.login.shadow`) the decision comes back `shadowed`.
pub(super) fn attempt(
    policy: &Policy,
    outcome: &LoginOutcome,
    attempt: Attempt<'_>,
) -> AttemptDecision {
    let seen = Seen::of(policy, outcome);
    let refusals = ip_blocked(policy, outcome, &attempt, &seen)
        .into_iter()
        .chain(user_refused(policy, outcome, &attempt, &seen))
        .collect();
    let recorded = outcome.recorded(policy.login.shadow);
    let (mut crossed, ip_failures_after) =
        crossed(policy, outcome, &attempt, recorded, seen.ip_count);
    let network_after = seen.network_count + u32::from(recorded && !attempt.success);
    crossed.extend(network_crossed(
        policy,
        &attempt,
        seen.network_count,
        network_after,
    ));
    // The longer of the locks this attempt started: the account's, the pair's.
    let locked_for_ms = outcome
        .user
        .locked_for_ms
        .max(outcome.user.pair_locked_for_ms);
    // A pair lock leaves the owner's other addresses open: the notice says so.
    let scope = match outcome.user.locked_for_ms {
        Some(_) => LockedScope::Account,
        None => LockedScope::Address,
    };
    let decided = AttemptDecision {
        refusals,
        crossed,
        notify_lock: locked_for_ms.map(|ms| (Duration::from_millis(ms), scope)),
        allowed: LoginState {
            captcha_required: seen.failures >= policy.login.user_captcha.limit
                || (attempt.ip.is_some() && ip_failures_after >= policy.login.ip.captcha.limit)
                || (outcome.network.is_some() && network_tier_full(policy, network_after)),
            locked: locked_for_ms.is_some(),
            retry_after_secs: locked_for_ms.map(crate::guard::ceil_secs),
            ..LoginState::allow(seen.failures)
        },
    };
    if policy.login.shadow {
        decided.shadowed()
    } else {
        decided
    }
}

/// The IP's block, when the IP is known and blocked: the first refusal.
fn ip_blocked(
    policy: &Policy,
    outcome: &LoginOutcome,
    attempt: &Attempt<'_>,
    seen: &Seen,
) -> Option<(LoginState, AuditEvent)> {
    let ip = attempt.ip?;
    let retry = outcome.ip.and_then(|s| s.blocked_retry_after_ms)?;
    let lock_retry = match outcome.user.verdict {
        LoginVerdict::Locked { retry_after_ms } | LoginVerdict::PairLocked { retry_after_ms } => {
            Some(retry_after_ms)
        }
        _ => None,
    };
    // A retry passes only once both have ended (`/login/check` says the same).
    let answer = LoginState::deny(Denial {
        reason: Reason::IpBlocked,
        locked: lock_retry.is_some(),
        retry_after_ms: retry.max(lock_retry.unwrap_or(0)),
        failures: seen.failures,
        captcha_required: seen.captcha_required,
    });
    let audit = row(AuditDecision::Deny, Reason::IpBlocked, &ip.subject)
        .rule(&policy.login.ip.block, seen.ip_count)
        .retry_after_ms(retry);
    Some((answer, audit))
}

/// The user's lock (the account's or the pair's) or captcha tier, if the
/// store's verdict refuses.
fn user_refused(
    policy: &Policy,
    outcome: &LoginOutcome,
    attempt: &Attempt<'_>,
    seen: &Seen,
) -> Option<(LoginState, AuditEvent)> {
    match outcome.user.verdict {
        LoginVerdict::Locked { retry_after_ms } | LoginVerdict::PairLocked { retry_after_ms } => {
            let answer = LoginState::deny(Denial {
                reason: Reason::UserLocked,
                locked: true,
                retry_after_ms,
                failures: seen.failures,
                captcha_required: seen.captcha_required,
            });
            let rule = match outcome.user.verdict {
                LoginVerdict::PairLocked { .. } => policy.login.pair_lock,
                _ => None,
            };
            let rule = rule.unwrap_or(policy.login.user_lock);
            let audit = row(AuditDecision::Deny, Reason::UserLocked, attempt.user)
                .rule(&rule, rule.limit)
                .retry_after_ms(retry_after_ms);
            Some((answer, audit))
        }
        LoginVerdict::Challenged => {
            // The user's own tier first; otherwise the IP's, then the
            // network's, whichever demanded it.
            let user_tier = seen.failures >= policy.login.user_captcha.limit;
            let subject_row =
                |subject| row(AuditDecision::Challenge, Reason::CaptchaRequired, subject);
            let network_tier = policy.login.network.gate.zip(attempt.network);
            let audit = match (attempt.ip, network_tier) {
                (Some(ip), _) if !user_tier && seen.ip_demands_captcha => {
                    subject_row(&ip.subject).rule(&policy.login.ip.captcha, seen.ip_count)
                }
                (_, Some((tier, network))) if !user_tier && seen.network_demands_captcha => {
                    subject_row(network).rule(&tier, seen.network_count)
                }
                _ => subject_row(attempt.user).rule(&policy.login.user_captcha, seen.failures),
            };
            Some((LoginState::challenge(seen.failures), audit))
        }
        LoginVerdict::Recorded => None,
    }
}

/// The rows of the thresholds this attempt crossed by being recorded (the
/// user's captcha tier and lock; the IP's captcha tier and block), and the
/// IP's failures after it (`ip_count`: before it).
fn crossed(
    policy: &Policy,
    outcome: &LoginOutcome,
    attempt: &Attempt<'_>,
    recorded: bool,
    ip_count: u32,
) -> (Vec<AuditEvent>, u32) {
    let user = &outcome.user;
    let mut rows = Vec::new();
    if user.captcha_crossed {
        rows.push(
            row(
                AuditDecision::Challenge,
                Reason::CaptchaRequired,
                attempt.user,
            )
            .rule(&policy.login.user_captcha, user.failures),
        );
    }
    let pair_rule = policy.login.pair_lock.unwrap_or(policy.login.user_lock);
    for (rule, locked_for) in [
        (&pair_rule, user.pair_locked_for_ms),
        (&policy.login.user_lock, user.locked_for_ms),
    ] {
        if let Some(lock_ms) = locked_for {
            rows.push(
                row(AuditDecision::Lock, Reason::TooManyFailures, attempt.user)
                    .rule(rule, rule.limit)
                    .retry_after_ms(lock_ms),
            );
        }
    }
    let (Some(ip), true, false) = (attempt.ip, recorded, attempt.success) else {
        return (rows, ip_count);
    };
    let after = ip_count + 1;
    if after == policy.login.ip.captcha.limit {
        rows.push(
            row(
                AuditDecision::Challenge,
                Reason::CaptchaRequired,
                &ip.subject,
            )
            .rule(&policy.login.ip.captcha, after),
        );
    }
    if after == policy.login.ip.block.limit {
        rows.push(
            row(AuditDecision::Lock, Reason::IpBlocked, &ip.subject)
                .rule(&policy.login.ip.block, after)
                .retry_after_ms(policy.login.ip.block.window_ms()),
        );
    }
    (rows, after)
}

/// What `/login/check` read.
pub(super) struct Checked<'a> {
    /// The user's failures and locks.
    pub user: &'a LoginStateOutcome,
    /// The IP's windows, when the IP is known.
    pub ip: Option<&'a PeekOutcome>,
    /// The network's failures, when it has a window.
    pub network: Option<u32>,
}

/// The row of the network's captcha tier when this attempt's failure filled
/// it (`before` failures, `after` with this one if it was recorded).
fn network_crossed(
    policy: &Policy,
    attempt: &Attempt<'_>,
    before: u32,
    after: u32,
) -> Option<AuditEvent> {
    let (network, tier) = attempt.network.zip(policy.login.network.gate)?;
    (before < tier.limit && after >= tier.limit)
        .then(|| row(AuditDecision::Challenge, Reason::CaptchaRequired, network).rule(&tier, after))
}

/// `POST /login/check`: what an attempt would meet now.
pub(super) fn check(policy: &Policy, seen: Checked<'_>) -> LoginState {
    let Checked { user, ip, network } = seen;
    let failures = user.failures;
    if policy.login.shadow {
        return LoginState::allow(failures);
    }
    let ip_captcha =
        ip.is_some_and(|p| IpLoginRules::captcha_count(p) >= policy.login.ip.captcha.limit);
    let network_captcha = network.is_some_and(|count| network_tier_full(policy, count));
    let captcha_required =
        failures >= policy.login.user_captcha.limit || ip_captcha || network_captcha;
    // Both locks may hold: the answer waits for the later end.
    let lock_retry = user
        .locked_retry_after_ms
        .max(user.pair_locked_retry_after_ms);
    let block_retry = ip
        .filter(|p| IpLoginRules::block_count(p) >= policy.login.ip.block.limit)
        .map(IpLoginRules::block_retry_after_ms);
    // The lock answers first here (an attempt names the IP's block first,
    // as it always has); with both, a retry passes only once both ended.
    let reason = match (lock_retry, block_retry) {
        (Some(_), _) => Reason::UserLocked,
        (None, Some(_)) => Reason::IpBlocked,
        (None, None) if captcha_required => return LoginState::challenge(failures),
        (None, None) => return LoginState::allow(failures),
    };
    LoginState::deny(Denial {
        reason,
        locked: lock_retry.is_some(),
        retry_after_ms: lock_retry.max(block_retry).unwrap_or(0),
        failures,
        captcha_required,
    })
}

#[cfg(test)]
mod tests;
