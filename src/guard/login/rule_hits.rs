//! One hit per `/login/attempt` on each login rule, from the counts the
//! store's login call answered (no read of its own). `/login/check` reads
//! and counts nothing, so it hits no rule.

use crate::guard::Policy;
use crate::store::{LoginOutcome, LoginVerdict};

/// Count the attempt against every rule it was decided by: the user's captcha
/// tier and lock, the (user, IP) pair's lock, the IP's captcha tier and block
/// when the IP is known, and its network's captcha tier. A store failing open
/// read nothing, so nothing is counted. A lock is over its limit when it
/// refused the attempt (the account's lock is looked at before the pair's); the
/// other rules when their window held `limit` failures.
pub(super) fn count(policy: &Policy, outcome: &LoginOutcome) {
    let Some(before) = outcome.user.before else {
        return;
    };
    let counters = &policy.login.counters;
    let shadow = policy.login.shadow;
    let verdict = outcome.user.verdict;
    counters.user_captcha.hit(before.captcha_window, shadow);
    let locked = matches!(verdict, LoginVerdict::Locked { .. });
    counters
        .user_lock
        .hit_with(before.lock_window, locked, shadow);
    if let (Some(pair_lock), Some(pair_count)) = (&counters.pair_lock, before.pair) {
        let pair_locked = matches!(verdict, LoginVerdict::PairLocked { .. });
        pair_lock.hit_with(pair_count, pair_locked, shadow);
    }
    if let Some(ip) = outcome.ip {
        counters.ip_captcha.hit(ip.count, shadow);
        let blocked = ip.blocked_retry_after_ms.is_some();
        counters.ip_block.hit_with(ip.count, blocked, shadow);
    }
    if let Some(count) = outcome.network {
        policy.login.network.count(&[count], shadow);
    }
}
