//! The only place that formats Redis key names.
//!
//! Every key of one subject carries the subject as its Redis Cluster hash tag,
//! `tg:{user:alice}:login_attempt` / `tg:{user:alice}:lock`, so one script may
//! touch all of a subject's keys on a cluster. Braces and `%` inside subject ids
//! are percent-escaped so that an id can never end the hash tag early or make
//! two subjects' keys collide.

use crate::domain::{Action, Subject};

/// Names every key under one prefix, `store.key_prefix`.
#[derive(Debug, Clone)]
pub struct Keys {
    prefix: String,
}

impl Keys {
    /// Keys under `prefix`.
    pub fn new(prefix: impl Into<String>) -> Self {
        Self {
            prefix: prefix.into(),
        }
    }

    /// The prefix every key starts with.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// The window set of `subject` for `action`.
    pub fn subject_window(&self, subject: &Subject, action: Action) -> String {
        self.window(subject.kind.as_str(), &subject.id, action.as_str())
    }

    /// The lock record of `subject`.
    pub fn subject_lock(&self, subject: &Subject) -> String {
        self.lock(subject.kind.as_str(), &subject.id)
    }

    /// The pending code of `subject` (a phone).
    pub fn subject_code(&self, subject: &Subject) -> String {
        self.otp(subject.kind.as_str(), &subject.id)
    }

    /// The conversion counters and block of `subject` (the SMS pumping
    /// guard's, for a prefix or a country).
    pub fn subject_conversion(&self, subject: &Subject) -> String {
        self.subject_key(subject.kind.as_str(), &subject.id, "conversion")
    }

    /// The expiring set of subjects blocked by their conversion, for admins
    /// to list. One key for all of them: it has no hash tag, and no script
    /// touches it together with a subject's keys.
    pub fn conversion_blocks(&self) -> String {
        format!("{}:conversion_blocks", self.prefix)
    }

    /// The sliding-window set of `(kind, id)` for one action.
    pub fn window(&self, kind: &str, id: &str, action: &str) -> String {
        self.subject_key(kind, id, action)
    }

    /// The meter hash (GCRA windows) kept beside a window key: the same
    /// hash tag, so one script may touch both on a cluster.
    pub fn meter_of(window_key: &str) -> String {
        format!("{window_key}:meter")
    }

    /// The meter hash beside `window_key` when one of `windows` is a meter.
    pub fn meter_for(window_key: &str, windows: &[super::WindowSpec]) -> Option<String> {
        windows
            .iter()
            .any(super::WindowSpec::is_meter)
            .then(|| Self::meter_of(window_key))
    }

    /// The lock record of a subject (login locks).
    pub fn lock(&self, kind: &str, id: &str) -> String {
        self.subject_key(kind, id, "lock")
    }

    /// The lock record of the (user, IP) pair.
    pub fn pair_lock(&self, user: &str, ip: &str) -> String {
        self.subject_key("user", user, &format!("lock:ip:{ip}"))
    }

    /// The user's index of its locked pairs' IPs.
    pub fn pair_index(&self, user: &str) -> String {
        self.subject_key("user", user, "login_pairs")
    }

    /// The pending one-time code of a subject (a phone).
    pub fn otp(&self, kind: &str, id: &str) -> String {
        self.subject_key(kind, id, "otp")
    }

    /// Process-wide secrets shared by every instance (the code HMAC key).
    pub fn secret(&self, name: &str) -> String {
        format!("{}:secret:{}", self.prefix, name)
    }

    /// `prefix:{kind:id}:suffix`, built without the formatting machinery
    /// (three of these per request).
    fn subject_key(&self, kind: &str, id: &str, suffix: &str) -> String {
        let id = escape(id);
        let mut key =
            String::with_capacity(self.prefix.len() + kind.len() + id.len() + suffix.len() + 5);
        for part in [&self.prefix, ":{", kind, ":", &id, "}:", suffix] {
            key.push_str(part);
        }
        key
    }
}

fn escape(id: &str) -> std::borrow::Cow<'_, str> {
    if !id.contains(['{', '}', '%']) {
        return id.into();
    }
    let mut out = String::with_capacity(id.len() + 6);
    for c in id.chars() {
        match c {
            '%' => out.push_str("%25"),
            '{' => out.push_str("%7B"),
            '}' => out.push_str("%7D"),
            c => out.push(c),
        }
    }
    out.into()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_of_one_subject_share_its_hash_tag() {
        let keys = Keys::new("tg");
        assert_eq!(
            keys.window("user", "alice", "login_attempt"),
            "tg:{user:alice}:login_attempt"
        );
        assert_eq!(keys.lock("user", "alice"), "tg:{user:alice}:lock");
        assert_eq!(
            keys.pair_lock("alice", "192.0.2.7"),
            "tg:{user:alice}:lock:ip:192.0.2.7"
        );
        assert_eq!(keys.pair_index("alice"), "tg:{user:alice}:login_pairs");
        assert_eq!(
            keys.otp("phone", "+8613800138000"),
            "tg:{phone:+8613800138000}:otp"
        );
        let country = Subject::new(crate::domain::SubjectKind::Country, "CN");
        assert_eq!(
            keys.subject_conversion(&country),
            "tg:{country:CN}:conversion"
        );
    }

    #[test]
    fn braces_in_ids_cannot_end_the_hash_tag() {
        let keys = Keys::new("tg");
        assert_eq!(keys.lock("user", "a}b{%"), "tg:{user:a%7Db%7B%25}:lock");
    }
}
