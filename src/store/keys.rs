//! The only place that formats Redis key names.
//!
//! Every key of one subject carries the subject as its Redis Cluster hash tag,
//! `tg:{user:alice}:login_attempt` / `tg:{user:alice}:lock`, so one script may
//! touch all of a subject's keys on a cluster. Braces and `%` inside subject ids
//! are percent-escaped so that an id can never end the hash tag early or make
//! two subjects' keys collide.
//!
//! With `store.hash_subject_ids` the id (and a pair lock's IP) is replaced by
//! a keyed hash, `tg:{phone:3f2a…}:otp`, so that key names no longer show
//! phone numbers, names or addresses. The hash is a function of the kind and
//! the id only, so a subject's keys still share one hash tag, and admin
//! look-ups, which name keys here too, find them.

use hmac::{Hmac, KeyInit, Mac};
use sha2::Sha256;

use crate::domain::{Action, Subject};

/// Names every key under one prefix, `store.key_prefix`.
#[derive(Debug, Clone)]
pub struct Keys {
    prefix: String,
    ids: Option<IdHash>,
}

/// The keyed hash of subject ids (`store.hash_subject_ids`): HMAC-SHA256
/// over `kind:id`, its first 128 bits in hex. Keyed, so that whoever reads
/// the key names cannot hash every phone number to find one.
#[derive(Clone)]
struct IdHash(Hmac<Sha256>);

impl std::fmt::Debug for IdHash {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("IdHash(***)")
    }
}

/// Hex digits of a hashed id: 128 bits, far from any collision among the
/// ids one deployment sees.
const HASHED_ID_BYTES: usize = 16;

impl IdHash {
    fn id(&self, kind: &str, id: &str) -> String {
        let mut mac = self.0.clone();
        mac.update(kind.as_bytes());
        mac.update(b":");
        mac.update(id.as_bytes());
        crate::hex::lower(&mac.finalize().into_bytes()[..HASHED_ID_BYTES])
    }
}

impl Keys {
    /// Keys under `prefix`, subject ids in clear.
    pub fn new(prefix: impl Into<String>) -> Self {
        Self {
            prefix: prefix.into(),
            ids: None,
        }
    }

    /// Keys under `prefix`, subject ids replaced by their HMAC under
    /// `secret` (`store.hash_subject_ids`).
    pub fn hashed(prefix: impl Into<String>, secret: &[u8]) -> Self {
        let mac = <Hmac<Sha256> as KeyInit>::new_from_slice(secret)
            .expect("HMAC accepts keys of any length");
        Self {
            prefix: prefix.into(),
            ids: Some(IdHash(mac)),
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
        // Not `format!`: three of these a send, some 600 instructions each.
        let mut key = String::with_capacity(window_key.len() + 6);
        key.push_str(window_key);
        key.push_str(":meter");
        key
    }

    /// The meter hash beside `window_key` when one of `windows` is a meter
    /// (on Redis, unless the subject's log is read whole: then its meters
    /// are members of the log, `store::redis::layout`).
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
        let ip = match &self.ids {
            Some(hash) => hash.id("ip", ip).into(),
            None => std::borrow::Cow::Borrowed(ip),
        };
        // Not `format!` (its machinery, a few hundred instructions a login).
        let mut suffix = String::with_capacity(8 + ip.len());
        suffix.push_str("lock:ip:");
        suffix.push_str(&ip);
        self.subject_key("user", user, &suffix)
    }

    /// An IP subject's id as a code keeps its asker (`WindowStore::otp_put`):
    /// hashed as in a key name when ids are hashed, so that the code's hash
    /// does not show the address its key hides.
    pub fn code_asker(&self, ip_id: String) -> String {
        match &self.ids {
            Some(hash) => hash.id("ip", &ip_id),
            None => ip_id,
        }
    }

    /// The user's index of its locked pairs' IPs.
    pub fn pair_index(&self, user: &str) -> String {
        self.subject_key("user", user, "login_pairs")
    }

    /// The pending one-time code of a subject (a phone).
    pub fn otp(&self, kind: &str, id: &str) -> String {
        self.subject_key(kind, id, "otp")
    }

    /// A captcha token's claim (`guard::captcha_tokens`), by the token's
    /// digest: its own hash tag, touched by no script with another key.
    pub fn captcha_token(&self, digest: &str) -> String {
        format!("{}:{{captcha_token:{}}}:used", self.prefix, digest)
    }

    /// What `/readyz` writes to learn that the store takes writes.
    pub fn readiness(&self) -> String {
        format!("{}:readyz", self.prefix)
    }

    /// The keys `readyz.lua` reads beside the `readiness` key, of two
    /// hash tags (keys of several slots, as a decision's script outside a
    /// Cluster).
    pub fn readiness_tags(readiness: &str) -> [String; 2] {
        [format!("{readiness}:{{a}}"), format!("{readiness}:{{b}}")]
    }

    /// Process-wide secrets shared by every instance (the code HMAC key).
    pub fn secret(&self, name: &str) -> String {
        format!("{}:secret:{}", self.prefix, name)
    }

    /// `prefix:{kind:id}:suffix`, built without the formatting machinery
    /// (three of these per request).
    fn subject_key(&self, kind: &str, id: &str, suffix: &str) -> String {
        let id = match &self.ids {
            Some(hash) => hash.id(kind, id).into(),
            None => escape(id),
        };
        let mut key =
            String::with_capacity(self.prefix.len() + kind.len() + id.len() + suffix.len() + 5);
        for part in [&self.prefix, ":{", kind, ":", &id, "}:", suffix] {
            key.push_str(part);
        }
        key
    }
}

fn escape(id: &str) -> std::borrow::Cow<'_, str> {
    // Bytes, not chars: the three are ASCII, and a char pattern decodes
    // UTF-8 and compares three times per character of every key's id.
    if !id.bytes().any(|b| matches!(b, b'{' | b'}' | b'%')) {
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
    fn hashed_ids_hide_the_id_and_keep_one_tag_per_subject() {
        let keys = Keys::hashed("tg", b"0123456789abcdef-secret");
        let otp = keys.otp("phone", "+8613800138000");
        assert!(!otp.contains("8613800138000"), "{otp}");
        let tag = |key: &str| key[key.find('{').unwrap()..=key.find('}').unwrap()].to_string();
        assert_eq!(
            tag(&otp),
            tag(&keys.window("phone", "+8613800138000", "sms_send"))
        );
        let pair = keys.pair_lock("alice", "192.0.2.7");
        assert!(
            !pair.contains("alice") && !pair.contains("192.0.2.7"),
            "{pair}"
        );
        assert_eq!(tag(&pair), tag(&keys.lock("user", "alice")));
        assert_eq!(tag(&pair), tag(&keys.pair_index("alice")));
        assert_eq!(otp.len(), "tg:{phone:}:otp".len() + 32);
        let asker = keys.code_asker("192.0.2.7".into());
        assert!(!asker.contains("192.0.2.7") && asker.len() == 32, "{asker}");
        assert_eq!(
            asker,
            keys.code_asker("192.0.2.7".into()),
            "compared as it is"
        );
        assert_eq!(Keys::new("tg").code_asker("192.0.2.7".into()), "192.0.2.7");
        // Another kind, or another secret, another hash.
        assert_ne!(
            tag(&keys.lock("user", "x")),
            tag(&keys.lock("ip", "x")).replace("ip:", "user:")
        );
        let other = Keys::hashed("tg", b"another secret, as long as this");
        assert_ne!(other.otp("phone", "+8613800138000"), otp);
    }

    #[test]
    fn braces_in_ids_cannot_end_the_hash_tag() {
        let keys = Keys::new("tg");
        assert_eq!(keys.lock("user", "a}b{%"), "tg:{user:a%7Db%7B%25}:lock");
    }
}
