//! Email addresses a caller hands in (`notify_email`): a plain ASCII
//! `local@domain`, checked here once, so that an address the API accepted is
//! one the mailer (lettre) takes too and no notice is dropped later.

use std::sync::LazyLock;

/// The most characters an address may have (RFC 5321's path limit less the
/// angle brackets).
pub const MAX_LEN: usize = 254;
const LOCAL_MAX: usize = 64;

/// RFC 5322 `atext`, ASCII only.
const ATEXT: &str = "A-Za-z0-9!#$%&'*+/=?^_`{|}~-";
/// A DNS label: letters, digits and inner hyphens, at most 63.
const LABEL: &str = "[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?";
/// The local part's length limit, as a lookahead (ECMA 262 and Python have
/// them; the tests check it apart, since Rust's `regex` has none).
const LOCAL_LENGTH: &str = "(?=[^@]{1,64}@)";

/// The address without its length limits: a dot-atom local part, `@`, and a
/// domain of two or more labels.
fn shape() -> String {
    format!("[{ATEXT}]+(?:\\.[{ATEXT}]+)*@{LABEL}(?:\\.{LABEL})+")
}

/// What [`EmailAddress::parse`] accepts, as the OpenAPI document's `pattern`
/// (with `maxLength` [`MAX_LEN`]).
pub static PATTERN: LazyLock<String> = LazyLock::new(|| format!("^{LOCAL_LENGTH}{}$", shape()));

/// `notify_email` is not an address the mailer would take.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("notify_email is not an email address (local@example.com, ASCII)")]
pub struct EmailError;

/// An address the mailer can send to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EmailAddress(String);

fn atext(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+/=?^_`{|}~-".contains(&b)
}

fn label(l: &str) -> bool {
    let b = l.as_bytes();
    (1..=63).contains(&b.len())
        && b[0].is_ascii_alphanumeric()
        && b[b.len() - 1].is_ascii_alphanumeric()
        && b.iter().all(|&c| c.is_ascii_alphanumeric() || c == b'-')
}

impl EmailAddress {
    /// Take `raw` unchanged (not trimmed, not lowercased) when it is what
    /// `PATTERN` describes, at most `MAX_LEN` long.
    pub fn parse(raw: &str) -> Result<Self, EmailError> {
        let (local, domain) = raw.split_once('@').ok_or(EmailError)?;
        let local_ok = (1..=LOCAL_MAX).contains(&local.len())
            && local
                .split('.')
                .all(|atom| !atom.is_empty() && atom.bytes().all(atext));
        let domain_ok = domain.contains('.') && domain.split('.').all(label);
        if raw.len() <= MAX_LEN && local_ok && domain_ok {
            Ok(Self(raw.to_string()))
        } else {
            Err(EmailError)
        }
    }

    /// The address as given.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The address as given.
    pub fn into_string(self) -> String {
        self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn documented(s: &str) -> bool {
        let shape = regex::Regex::new(&format!("^{}$", shape())).unwrap();
        let local = regex::Regex::new("^[^@]{1,64}@").unwrap();
        shape.is_match(s) && local.is_match(s) && s.chars().count() <= MAX_LEN
    }

    #[test]
    fn plain_addresses_pass_and_odd_ones_do_not() {
        for ok in [
            "alice@example.com",
            "a.b+tag@mail.example.co.uk",
            "x@a-b.c1",
        ] {
            assert!(EmailAddress::parse(ok).is_ok(), "{ok}");
            assert!(documented(ok), "{ok}");
        }
        for bad in [
            "",
            "alice",
            "@example.com",
            "alice@",
            "alice@localhost",
            "a..b@example.com",
            ".a@example.com",
            "a@-example.com",
            "a@example-.com",
            "a@example..com",
            "a b@example.com",
            "a@b@example.com",
            "ü@example.com",
            "alice@example.com\n",
        ] {
            assert!(EmailAddress::parse(bad).is_err(), "{bad:?}");
            assert!(!documented(bad), "{bad:?}");
        }
        let long_local = format!("{}@example.com", "a".repeat(65));
        assert!(EmailAddress::parse(&long_local).is_err());
        assert!(!documented(&long_local));
        let long = format!("a@{}.com", vec!["b".repeat(63); 4].join("."));
        assert!(long.len() > MAX_LEN);
        assert!(EmailAddress::parse(&long).is_err());
        assert!(!documented(&long));
    }

    proptest::proptest! {
        /// The pattern is what `parse` accepts, and lettre takes whatever
        /// `parse` accepts.
        #[test]
        fn the_pattern_parse_and_lettre_agree(
            raw in "[a-c.@+-]{0,6}(@|\\.)[a-c0-9.-]{0,6}(\\.[a-c]{1,3})?|[a-z]{60,70}@[a-z]{1,5}\\.[a-z]{2}",
        ) {
            let parsed = EmailAddress::parse(&raw);
            proptest::prop_assert_eq!(parsed.is_ok(), documented(&raw), "{:?}", raw);
            if parsed.is_ok() {
                proptest::prop_assert!(raw.parse::<lettre::Address>().is_ok(), "{:?}", raw);
            }
        }
    }
}
