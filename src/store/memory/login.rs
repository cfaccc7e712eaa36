//! The in-process twins of `login_attempt.lua` and `login_state.lua`: one
//! user's failure window and lock record, and those of a (user, IP) pair,
//! read and changed under the subject's lock (all share the user's hash tag).

use super::entry::{Entry, Subject, Value};
use crate::store::{
    pair_member, FailuresBefore, LoginAttemptOutcome, LoginAttemptRequest, LoginPolicy,
    LoginStateOutcome, LoginVerdict, StoreError, PAIR_INDEX_KEEP,
};

/// A live lock's remaining time.
fn remaining(lock: Option<(u64, u32)>, now: u64) -> Option<u64> {
    lock.filter(|(until, _)| *until > now)
        .map(|(until, _)| until - now)
}

/// Add a failure to the window at `key`, keeping its `keep` newest; answer
/// the count in `lock_window_ms` after it.
fn add_failure(
    subject: &mut Subject,
    key: &str,
    member: &str,
    keep: u32,
    ttl_ms: u64,
    lock_window_ms: u64,
    now: u64,
) -> Result<u32, StoreError> {
    subject.change_window(key, now, |window| {
        window.add(now, member);
        window.trim(keep as usize);
        (window.count(now, lock_window_ms), Some(now + ttl_ms))
    })
}

/// Decide one attempt and record it, as `login_attempt.lua` does.
pub(super) fn attempt(
    subject: &mut Subject,
    req: &LoginAttemptRequest<'_>,
    now: u64,
) -> Result<LoginAttemptOutcome, StoreError> {
    let p = req.policy;
    let prev = subject.lock(req.lock_key, now, req.shadow)?;
    let pair_prev = match &req.pair {
        Some(pair) => subject.lock(pair.lock_key, now, req.shadow)?,
        None => None,
    };
    let before = subject.read_window(req.window_key, now, |w| FailuresBefore {
        captcha_window: w.count(now, p.captcha_window_ms),
        lock_window: w.count(now, p.lock_window_ms),
        pair: req
            .pair
            .as_ref()
            .map(|pair| w.count_pair(now, p.lock_window_ms, pair.ip)),
    })?;
    let failures = before.captcha_window;
    // The account's lock refuses; with the pair's locked too, the later end
    // answers (as `/login/check` does).
    let pair_retry = remaining(pair_prev, now);
    let verdict = if let Some(own) = remaining(prev, now) {
        LoginVerdict::Locked {
            retry_after_ms: own.max(pair_retry.unwrap_or(0)),
        }
    } else if let Some(retry_after_ms) = pair_retry {
        LoginVerdict::PairLocked { retry_after_ms }
    } else if (failures >= p.captcha_after || req.captcha_demanded) && !req.captcha_passed {
        LoginVerdict::Challenged
    } else {
        LoginVerdict::Recorded
    };
    let mut outcome = LoginAttemptOutcome {
        verdict,
        failures,
        captcha_crossed: false,
        locked_for_ms: None,
        pair_locked_for_ms: None,
        before: Some(before),
    };
    let record = (verdict == LoginVerdict::Recorded && !req.ip_blocked) || req.shadow;
    if !record {
        return Ok(outcome);
    }
    if req.success {
        if p.reset_on_success {
            subject.entries.remove(req.window_key);
            outcome.failures = 0;
        }
        return Ok(outcome);
    }
    let longest = p.captcha_window_ms.max(p.lock_window_ms);
    let keep = p.captcha_after.max(p.lock_after);
    let id = match &req.pair {
        Some(pair) => pair_member(pair.ip, req.member),
        None => req.member.to_owned(),
    };
    let lock_count = add_failure(
        subject,
        req.window_key,
        &id,
        keep,
        longest,
        p.lock_window_ms,
        now,
    )?;
    if remaining(prev, now).is_none() && lock_count >= p.lock_after {
        outcome.locked_for_ms = Some(lock(subject, req.lock_key, prev, p, req.shadow, now));
    }
    if remaining(pair_prev, now).is_none() {
        outcome.pair_locked_for_ms = lock_pair(subject, req, pair_prev, lock_count, now)?;
    }
    // The window keeps its `keep` newest, and `failures` were the newest.
    let after = (failures + 1).min(keep);
    outcome.captcha_crossed = failures < p.captcha_after && after >= p.captcha_after;
    outcome.failures = after;
    Ok(outcome)
}

/// Lock the request's (user, IP) pair when its failures in the lock window
/// reached `pair_lock_after` (`lock_count`: the user's own failures there),
/// and list the IP in the user's index of locked pairs; answer the lock's
/// length.
fn lock_pair(
    subject: &mut Subject,
    req: &LoginAttemptRequest<'_>,
    pair_prev: Option<(u64, u32)>,
    lock_count: u32,
    now: u64,
) -> Result<Option<u64>, StoreError> {
    let p = req.policy;
    let Some(pair) = &req.pair else {
        return Ok(None);
    };
    // Scanned only once the user's own count could hold enough of them.
    if lock_count < p.pair_lock_after {
        return Ok(None);
    }
    let pair_count = subject.read_window(req.window_key, now, |w| {
        w.count_pair(now, p.lock_window_ms, pair.ip)
    })?;
    if pair_count < p.pair_lock_after {
        return Ok(None);
    }
    let locked_for = lock(subject, pair.lock_key, pair_prev, p, req.shadow, now);
    // The index of locked pairs outlives every lock it lists.
    let index_ttl = p.lock_max_ms + p.escalation_reset_ms;
    subject.change_window(pair.index_key, now, |index| {
        index.add(now, pair.ip);
        index.trim(PAIR_INDEX_KEEP);
        ((), Some(now + index_ttl))
    })?;
    Ok(Some(locked_for))
}

/// Write a lock one level above `prev` (when `prev` ended within the
/// escalation reset), into the shadow's pair of the record when a shadow
/// call writes it, and answer its length.
fn lock(
    subject: &mut Subject,
    lock_key: &str,
    prev: Option<(u64, u32)>,
    p: &LoginPolicy,
    shadow: bool,
    now: u64,
) -> u64 {
    let level = match prev {
        Some((until, level)) if now.saturating_sub(until) <= p.escalation_reset_ms => {
            (level + 1).min(40)
        }
        _ => 0,
    };
    let duration = p
        .lock_ms
        .saturating_mul(1u64 << level.min(63))
        .min(p.lock_max_ms);
    let record = Some((now + duration, level));
    let expires_at = now + duration + p.escalation_reset_ms;
    // The enforced lock and the shadow's share one record (one key in
    // Redis), which lives as long as the longer needs.
    let (until, would_be, kept_until) = match subject.entries.get(lock_key) {
        Some(entry) if !entry.expired(now) => match entry.value {
            Value::Lock { until, shadow } => (until, shadow, entry.expires_at),
            _ => (None, None, None),
        },
        _ => (None, None, None),
    };
    let value = if shadow {
        Value::Lock {
            until,
            shadow: record,
        }
    } else {
        Value::Lock {
            until: record,
            shadow: would_be,
        }
    };
    subject.entries.insert(
        lock_key.to_owned(),
        Entry {
            value,
            expires_at: Some(kept_until.map_or(expires_at, |k| k.max(expires_at))),
        },
    );
    duration
}

/// The lock and the failure counts, as `login_state.lua` reads them.
pub(super) fn state(
    subject: &mut Subject,
    window_key: &str,
    lock_key: &str,
    pair_lock_key: Option<&str>,
    policy: &LoginPolicy,
    shadow: bool,
    now: u64,
) -> Result<LoginStateOutcome, StoreError> {
    let lock = subject.lock(lock_key, now, shadow)?;
    let pair_lock = match pair_lock_key {
        Some(key) => subject.lock(key, now, shadow)?,
        None => None,
    };
    let (failures, lock_window_failures) = subject.read_window(window_key, now, |w| {
        (
            w.count(now, policy.captcha_window_ms),
            w.count(now, policy.lock_window_ms),
        )
    })?;
    Ok(LoginStateOutcome {
        locked_retry_after_ms: remaining(lock, now),
        pair_locked_retry_after_ms: remaining(pair_lock, now),
        failures,
        lock_window_failures,
    })
}
