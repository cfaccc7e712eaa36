//! The in-process twins of `login_attempt.lua` and `login_state.lua`: one
//! user's failure window and lock record, read and changed under the
//! subject's lock (both keys share the subject's hash tag).

use super::entry::{Entry, Subject, Value};
use crate::store::{
    LoginAttemptOutcome, LoginAttemptRequest, LoginPolicy, LoginStateOutcome, LoginVerdict,
    StoreError,
};

/// Decide one attempt and record it, as `login_attempt.lua` does.
pub(super) fn attempt(
    subject: &mut Subject,
    req: &LoginAttemptRequest<'_>,
    now: u64,
) -> Result<LoginAttemptOutcome, StoreError> {
    let p = req.policy;
    let prev = subject.lock(req.lock_key, now)?;
    let failures =
        subject.read_window(req.window_key, now, |w| w.count(now, p.captcha_window_ms))?;
    let (verdict, may_lock) = match prev {
        Some((until, _)) if until > now => (
            LoginVerdict::Locked {
                retry_after_ms: until - now,
            },
            false,
        ),
        _ if (failures >= p.captcha_after || req.captcha_demanded) && !req.captcha_passed => {
            (LoginVerdict::Challenged, true)
        }
        _ => (LoginVerdict::Recorded, true),
    };
    let mut outcome = LoginAttemptOutcome {
        verdict,
        failures,
        captcha_crossed: false,
        locked_for_ms: None,
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
    let keep = p.captcha_after.max(p.lock_after) as usize;
    let (after, lock_count) = subject.change_window(req.window_key, now, |window| {
        window.add(now, req.member);
        window.trim(keep);
        let counts = (
            window.count(now, p.captcha_window_ms),
            window.count(now, p.lock_window_ms),
        );
        (counts, Some(now + longest))
    })?;
    if may_lock && lock_count >= p.lock_after {
        outcome.locked_for_ms = Some(lock(subject, req.lock_key, prev, p, now));
    }
    outcome.captcha_crossed = failures < p.captcha_after && after >= p.captcha_after;
    outcome.failures = after;
    Ok(outcome)
}

/// Write a lock one level above `prev` (when `prev` ended within the
/// escalation reset), and answer its length.
fn lock(
    subject: &mut Subject,
    lock_key: &str,
    prev: Option<(u64, u32)>,
    p: &LoginPolicy,
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
    subject.entries.insert(
        lock_key.to_owned(),
        Entry {
            value: Value::Lock {
                until: now + duration,
                level,
            },
            expires_at: Some(now + duration + p.escalation_reset_ms),
        },
    );
    duration
}

/// The lock and the failure counts, as `login_state.lua` reads them.
pub(super) fn state(
    subject: &mut Subject,
    window_key: &str,
    lock_key: &str,
    policy: &LoginPolicy,
    now: u64,
) -> Result<LoginStateOutcome, StoreError> {
    let lock = subject.lock(lock_key, now)?;
    let (failures, lock_window_failures) = subject.read_window(window_key, now, |w| {
        (
            w.count(now, policy.captcha_window_ms),
            w.count(now, policy.lock_window_ms),
        )
    })?;
    Ok(LoginStateOutcome {
        locked_retry_after_ms: lock
            .filter(|(until, _)| *until > now)
            .map(|(until, _)| until - now),
        failures,
        lock_window_failures,
    })
}
