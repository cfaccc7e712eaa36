//! The variables each text is rendered with, and a sample of each that every
//! template is rendered with when it loads. The samples are built from the
//! same types the senders use, and fill every loop and take both sides of
//! every optional value and flag, so a template that names a variable the sender does not
//! give fails at load.

use serde::Serialize;

use super::EmailKind;
use crate::delivery::email::{Digest, LockNoticeVars, LockSeen, RuleOverThreshold};

/// The variables of `sms/<locale>.txt`.
#[derive(Debug, Serialize)]
pub(super) struct SmsVars<'a> {
    code: &'a str,
    ttl_minutes: u64,
    ttl_secs: u64,
}

impl<'a> SmsVars<'a> {
    pub(super) fn code(&self) -> &str {
        self.code
    }

    pub(super) fn ttl_minutes(&self) -> u64 {
        self.ttl_minutes
    }

    pub(super) fn ttl_secs(&self) -> u64 {
        self.ttl_secs
    }

    pub(super) fn new(code: &'a str, ttl_secs: u64) -> Self {
        Self {
            code,
            ttl_minutes: ttl_secs.div_ceil(60),
            ttl_secs,
        }
    }
}

pub(super) fn sms() -> SmsVars<'static> {
    SmsVars::new("123456", 300)
}

/// One sample per branch a template may take on the variables.
pub(super) fn email(kind: EmailKind) -> Vec<serde_json::Value> {
    let notice = |ip, address_only| {
        serde_json::to_value(LockNoticeVars {
            user: "alice",
            locked_minutes: 15,
            locked_until: "2026-01-01T00:15:00Z".to_string(),
            ip,
            address_only,
        })
    };
    let samples = match kind {
        EmailKind::LockNotice => vec![
            notice("203.0.113.7", false),
            notice("", false),
            notice("203.0.113.7", true),
            notice("", true),
        ],
        EmailKind::AlertDigest => vec![serde_json::to_value(digest())],
    };
    samples.into_iter().map(Result::unwrap_or_default).collect()
}

fn digest() -> Digest {
    let lock = |kind: &str, subject: &str, rule: Option<&str>, shadow| LockSeen {
        kind: kind.to_string(),
        subject: subject.to_string(),
        reason: "too_many_failures".to_string(),
        rule: rule.map(str::to_string),
        minutes: 15,
        at: "2026-01-01T00:10:00Z".to_string(),
        shadow,
    };
    Digest {
        since: "2026-01-01T00:00:00Z".to_string(),
        until: "2026-01-01T01:00:00Z".to_string(),
        locks: vec![
            lock("user", "alice", Some("user 10/1h"), false),
            lock("ip", "203.0.113.9", None, true),
        ],
        more_locks: 2,
        rules: vec![RuleOverThreshold {
            action: "sms_send".to_string(),
            rule: "phone 5/1h".to_string(),
            denials: 120,
            threshold: 100,
            window: "5m".to_string(),
        }],
    }
}
