//! One allow or block list entry: which list, what it matches, and the
//! parsing that turns what an operator wrote into the form requests match.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::domain::ip_range::{checked_range, stored_range, RangeRefusal};
use crate::domain::{PhoneNumber, Username};

/// Which list an entry is on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum ListName {
    /// Never limited, captcha-gated or locked.
    Allow,
    /// Always refused (`403 blocklisted`).
    Block,
}

impl ListName {
    /// The wire form.
    pub fn as_str(self) -> &'static str {
        match self {
            ListName::Allow => "allow",
            ListName::Block => "block",
        }
    }

    /// The list whose wire form is `s`.
    pub fn parse(s: &str) -> Option<Self> {
        [Self::Allow, Self::Block]
            .into_iter()
            .find(|l| l.as_str() == s)
    }
}

/// What an entry matches.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum EntryKind {
    /// A client IP in a CIDR.
    Ip,
    /// A phone number, or a prefix of one (`+86138*`).
    Phone,
    /// A user name (normalised as logins are).
    User,
}

impl EntryKind {
    /// The wire form.
    pub fn as_str(self) -> &'static str {
        match self {
            EntryKind::Ip => "ip",
            EntryKind::Phone => "phone",
            EntryKind::User => "user",
        }
    }

    /// The kind whose wire form is `s`.
    pub fn parse(s: &str) -> Option<Self> {
        [Self::Ip, Self::Phone, Self::User]
            .into_iter()
            .find(|k| k.as_str() == s)
    }
}

/// Where an entry comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum EntrySource {
    /// The `[lists]` section of the config file (changed by editing it).
    Config,
    /// The admin API or console (stored in the audit database).
    Admin,
}

/// One entry as the admin API shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, utoipa::ToSchema)]
#[schema(example = json!({"id": "0192f0c4-5b6e-7d30-8a55-3f1c2b9e4d10", "list": "block",
    "kind": "phone", "value": "+88213*", "note": "toll fraud range", "source": "admin",
    "created_at": "2026-11-22T10:00:00.000Z"}))]
pub struct ListEntry {
    /// The id to delete it by; null for entries of the config file.
    #[schema(required = true)]
    pub id: Option<Uuid>,
    /// `allow` or `block`.
    pub list: ListName,
    /// `ip`, `phone` or `user`.
    pub kind: EntryKind,
    /// What it matches, normalised: a CIDR (`203.0.113.0/24`, one address
    /// as `/32` or `/128`), an E.164 number or a prefix ending in `*`, a
    /// user name; as stored, for an entry listed `unreadable`.
    pub value: String,
    /// Why it was added.
    pub note: String,
    /// `config` or `admin`.
    pub source: EntrySource,
    /// When it was added; null for entries of the config file.
    #[schema(required = true)]
    pub created_at: Option<DateTime<Utc>>,
}

/// `value`, a new entry's (the admin API's, the config file's), in the form
/// requests are matched against, or why it is not one.
pub fn normalise(kind: EntryKind, value: &str) -> Result<String, String> {
    read(kind, value, Reading::New)
}

/// A stored entry's `value` as this version matches it. Read as when it
/// was added: a range with host bits as its network, a range of every
/// address, a prefix of no calling code stay in force (and listed, to be
/// deleted), where a new one is refused; what earlier versions refused
/// too (the translators' /96) is not.
pub(super) fn renormalise(kind: EntryKind, value: &str) -> Result<String, String> {
    read(kind, value, Reading::Stored)
}

/// Whose value is read: a new entry's, checked for what it seems to say,
/// or a stored one's, kept as it was taken.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Reading {
    New,
    Stored,
}

fn read(kind: EntryKind, value: &str, reading: Reading) -> Result<String, String> {
    match kind {
        EntryKind::Ip => {
            let read = match reading {
                Reading::New => checked_range(value),
                Reading::Stored => stored_range(value),
            };
            read.map(|net| net.to_string())
                .map_err(|why| range_refused(value, why))
        }
        EntryKind::Phone => normalise_phone(value, reading),
        EntryKind::User => Username::parse(value)
            .map(|u| u.as_str().to_string())
            .map_err(|e| format!("{value:?} is not a user name: {e}")),
    }
}

/// Why `value` is no entry, in a list's words.
fn range_refused(value: &str, why: RangeRefusal) -> String {
    match why {
        RangeRefusal::NotARange => format!("{value:?} is not an IP address or CIDR"),
        RangeRefusal::HoldsTranslationPrefix => format!(
            "{value:?} holds 64:ff9b::/96, where a NAT64 or SIIT translator writes IPv4 \
             clients, and they count as their IPv4 addresses: list those, \
             or a range inside the /96"
        ),
        RangeRefusal::MappedPrefix => format!(
            "{value:?} is ::ffff:0:0/96, the IPv4-mapped addresses, which count as \
             the IPv4 addresses they carry: as an entry it would be 0.0.0.0/0, every \
             IPv4 client; list the IPv4 ranges meant, or a range inside the /96"
        ),
        RangeRefusal::EveryAddress { v4 } => format!(
            "{value:?} is every {} address: an allow entry would take every \
             limit off, a block entry refuse every client; list the ranges meant",
            if v4 { "IPv4" } else { "IPv6" }
        ),
        RangeRefusal::HostBits {
            prefix_len,
            network,
        } => format!(
            "{value:?} has bits set right of its /{prefix_len} mask: write {network} for the \
             range it names, or the address alone"
        ),
    }
}

/// The longest note an admin may give an entry, in characters: a line on
/// the Lists page (the console's form also holds 4 KB in all, percent-encoded).
pub const MAX_NOTE_CHARS: usize = 256;

/// An admin's note, trimmed: one line of text, checked as given (as the
/// OpenAPI document's `pattern` and `maxLength` say). A control character
/// (NUL among them, which PostgreSQL refuses in text) or an over-long note
/// is the caller's mistake, not the database's.
pub fn checked_note(note: &str) -> Result<String, String> {
    if note.chars().any(char::is_control) {
        return Err("the note holds a control character (one line of text)".into());
    }
    if note.chars().count() > MAX_NOTE_CHARS {
        return Err(format!(
            "the note is longer than {MAX_NOTE_CHARS} characters"
        ));
    }
    Ok(note.trim().to_string())
}

/// A number in E.164, or `+` digits `*` for a prefix (at least one digit).
fn normalise_phone(value: &str, reading: Reading) -> Result<String, String> {
    let value = value.trim();
    if let Some(prefix) = value.strip_suffix('*') {
        let digits = prefix.strip_prefix('+').unwrap_or_default();
        if digits.is_empty() || digits.len() > 15 || !digits.bytes().all(|b| b.is_ascii_digit()) {
            return Err(format!(
                "{value:?} is not a phone prefix (`+` then 1 to 15 digits, then `*`)"
            ));
        }
        if reading == Reading::New && !crate::domain::phone::reaches_a_calling_code(digits) {
            return Err(format!(
                "{value:?} matches no number: no country calling code starts with, \
                 or begins, +{digits}"
            ));
        }
        return Ok(format!("+{digits}*"));
    }
    PhoneNumber::parse(value)
        .map(|p| p.e164().to_string())
        .map_err(|e| format!("{value:?} is not a phone number or prefix: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn notes_are_one_line_of_bounded_length_as_the_document_says() {
        assert_eq!(checked_note("  abuse "), Ok("abuse".to_string()));
        assert!(checked_note(&"é".repeat(MAX_NOTE_CHARS)).is_ok());
        let long = "x".repeat(MAX_NOTE_CHARS + 1);
        for bad in ["a\u{0}b", "a\nb", "a\u{85}b", "\t", &long] {
            assert!(checked_note(bad).is_err(), "{bad:?}");
        }
        let pattern = regex::Regex::new(&crate::domain::pattern::without_control())
            .expect("the pattern compiles");
        for c in (0..0x300).filter_map(char::from_u32) {
            let text = format!("a{c}b");
            assert_eq!(
                pattern.is_match(&text),
                checked_note(&text).is_ok(),
                "{c:?}"
            );
        }
    }

    #[test]
    fn values_are_normalised_as_requests_are() {
        let cases = [
            (EntryKind::Ip, "203.0.113.7", "203.0.113.7/32"),
            (EntryKind::Ip, "203.0.113.0/24", "203.0.113.0/24"),
            (EntryKind::Ip, " 2001:db8::/64 ", "2001:db8::/64"),
            (EntryKind::Ip, "::ffff:203.0.113.7", "203.0.113.7/32"),
            (EntryKind::Ip, "::ffff:203.0.113.0/120", "203.0.113.0/24"),
            (EntryKind::Ip, "64:ff9b::203.0.113.7", "203.0.113.7/32"),
            (EntryKind::Ip, "64:ff9b::203.0.113.0/120", "203.0.113.0/24"),
            (EntryKind::Ip, "64:ff9b::128.0.0.0/97", "128.0.0.0/1"),
            (EntryKind::Ip, "::ffff:128.0.0.0/97", "128.0.0.0/1"),
            // Around the mapped /96 are the subject ::/64's own clients.
            (EntryKind::Ip, "::/64", "::/64"),
            (EntryKind::Ip, "::fffe:0:0/95", "::fffe:0:0/95"),
            (EntryKind::Ip, "::/31", "::/31"),
            (EntryKind::Ip, "::/1", "::/1"),
            (EntryKind::Phone, "+86 138 0013 8000", "+8613800138000"),
            (EntryKind::Phone, "+88213*", "+88213*"),
            (EntryKind::Phone, "+8*", "+8*"),
            (EntryKind::Phone, "+1*", "+1*"),
            (EntryKind::User, "ALICE", "alice"),
        ];
        for (kind, raw, want) in cases {
            assert_eq!(normalise(kind, raw).as_deref(), Ok(want), "{raw}");
        }
        for (kind, raw) in [
            (EntryKind::Ip, "300.1.1.1"),
            (EntryKind::Ip, "64:ff9b::/96"),
            (EntryKind::Ip, "64:ff9b::/64"),
            (EntryKind::Ip, "64:ff9b::/32"),
            // The mapped /96 would be 0.0.0.0/0: every IPv4 client.
            (EntryKind::Ip, "::ffff:0:0/96"),
            (EntryKind::Ip, "::ffff:0.0.0.0/96"),
            (EntryKind::Ip, "::ffff:1.2.3.4/96"),
            // Host bits: a typo's range, not the one written.
            (EntryKind::Ip, "203.0.113.7/24"),
            (EntryKind::Ip, "198.51.100.7/2"),
            (EntryKind::Ip, "2001:db8::1/64"),
            (EntryKind::Ip, "64:ff9b::203.0.113.0/97"),
            // Everyone.
            (EntryKind::Ip, "0.0.0.0/0"),
            (EntryKind::Ip, "::/0"),
            (EntryKind::Phone, "+86a*"),
            // No calling code starts 0, or 28x (spare).
            (EntryKind::Phone, "+0*"),
            (EntryKind::Phone, "+28*"),
            (EntryKind::Phone, "+2851*"),
            (EntryKind::Phone, "*"),
            (EntryKind::Phone, "12345"),
            (EntryKind::User, ""),
        ] {
            assert!(normalise(kind, raw).is_err(), "{raw}");
        }
        let mapped = normalise(EntryKind::Ip, "::ffff:0:0/96").unwrap_err();
        assert!(
            mapped.contains("::ffff:0:0/96") && mapped.contains("every IPv4 client"),
            "{mapped}"
        );
        let translated = normalise(EntryKind::Ip, "64:ff9b::/64").unwrap_err();
        assert!(translated.contains("64:ff9b::/96"), "{translated}");
        // Stored by an earlier version, they stay as they were taken.
        for (kind, raw, kept) in [
            (EntryKind::Ip, "0.0.0.0/0", "0.0.0.0/0"),
            (EntryKind::Ip, "::/0", "::/0"),
            (EntryKind::Ip, "198.51.100.7/2", "192.0.0.0/2"),
            (EntryKind::Phone, "+28*", "+28*"),
        ] {
            assert_eq!(renormalise(kind, raw).as_deref(), Ok(kept), "{raw}");
        }
        assert!(renormalise(EntryKind::Ip, "64:ff9b::/96").is_err());
        let typo = normalise(EntryKind::Ip, "198.51.100.7/2").unwrap_err();
        assert!(typo.contains("write 192.0.0.0/2"), "{typo}");
        let everyone = normalise(EntryKind::Ip, "0.0.0.0/0").unwrap_err();
        assert!(everyone.contains("every IPv4 address"), "{everyone}");
    }
}
