//! CSRF tokens for the console's forms and its CSV export link (the purpose
//! below kept from when the unblock form was the only one: a new one would
//! void every page open at an upgrade). Stateless: an HMAC-SHA256 keyed
//! by the admin token the browser authenticates with, over the form's purpose,
//! the subject and the time it was issued. A page from another site can make a
//! browser send cached Basic credentials, but cannot read or forge the token;
//! it works on every instance behind a load balancer and survives restarts,
//! and rotating the admin token voids every form issued with it.

use chrono::{DateTime, Utc};
use hmac::{Hmac, KeyInit, Mac};
use sha2::Sha256;

use crate::domain::Subject;
use crate::settings::Secret;

const PURPOSE: &[u8] = b"tollgate console unblock v1";
/// How long a rendered form stays usable.
const VALID_SECS: i64 = 12 * 3600;
/// Clock skew tolerated between instances.
const SKEW_SECS: i64 = crate::oidc::CLOCK_SKEW_SECS;

fn mac(key: &Secret, subject: &Subject, issued: i64) -> Hmac<Sha256> {
    let mut mac = <Hmac<Sha256> as KeyInit>::new_from_slice(key.expose().as_bytes())
        .expect("HMAC-SHA256 accepts keys of any length");
    // Length-prefixed parts: no two (kind, id) pairs share an encoding.
    for part in [
        PURPOSE,
        subject.kind.as_str().as_bytes(),
        subject.id.as_bytes(),
    ] {
        mac.update(&(part.len() as u64).to_be_bytes());
        mac.update(part);
    }
    mac.update(&issued.to_be_bytes());
    mac
}

/// The query parameter that carries a link's token (the CSV export's).
pub const QUERY_PARAMETER: &str = "csrf";

/// A link's token (the last one given), and the rest of its query.
pub fn split_query(query: &str) -> (Option<String>, String) {
    let mut token = None;
    let mut rest = form_urlencoded::Serializer::new(String::new());
    for (name, value) in form_urlencoded::parse(query.as_bytes()) {
        if name == QUERY_PARAMETER {
            token = Some(value.into_owned());
        } else {
            rest.append_pair(&name, &value);
        }
    }
    (token, rest.finish())
}

/// `<issued unix seconds>.<hex HMAC>`.
pub fn issue(key: &Secret, subject: &Subject, now: DateTime<Utc>) -> String {
    let issued = now.timestamp();
    let tag = hex::encode(mac(key, subject, issued).finalize().into_bytes());
    format!("{issued}.{tag}")
}

/// Whether `token` was issued with `key` for `subject` and has not expired.
/// The tag is compared in constant time.
pub fn verify(key: &Secret, subject: &Subject, token: &str, now: DateTime<Utc>) -> bool {
    let Some((issued, tag)) = token.split_once('.') else {
        return false;
    };
    let Ok(issued) = issued.parse::<i64>() else {
        return false;
    };
    let age = now.timestamp().saturating_sub(issued);
    if !(-SKEW_SECS..=VALID_SECS).contains(&age) || tag.len() != 64 {
        return false;
    }
    let bytes: Option<Vec<u8>> = (0..tag.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(tag.get(i..i + 2)?, 16).ok())
        .collect();
    match bytes {
        Some(bytes) => mac(key, subject, issued).verify_slice(&bytes).is_ok(),
        None => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::SubjectKind;

    #[test]
    fn a_token_is_bound_to_its_key_subject_and_age() {
        let key = Secret::new("admin-token");
        let alice = Subject::new(SubjectKind::User, "alice");
        let now = Utc::now();
        let token = issue(&key, &alice, now);
        assert!(verify(&key, &alice, &token, now));
        assert!(verify(
            &key,
            &alice,
            &token,
            now + chrono::Duration::hours(11)
        ));

        let bob = Subject::new(SubjectKind::User, "bob");
        let alice_ip = Subject::new(SubjectKind::Ip, "alice");
        assert!(!verify(&key, &bob, &token, now), "another subject");
        assert!(!verify(&key, &alice_ip, &token, now), "another kind");
        assert!(
            !verify(&Secret::new("other"), &alice, &token, now),
            "another key"
        );
        assert!(
            !verify(&key, &alice, &token, now + chrono::Duration::hours(13)),
            "expired"
        );
        assert!(
            !verify(&key, &alice, &token, now - chrono::Duration::minutes(5)),
            "from the future"
        );
        let (issued, tag) = token.split_once('.').unwrap();
        let later = format!("{}.{tag}", issued.parse::<i64>().unwrap() + 1);
        for bad in ["", ".", "abc", "1.2", &later, &token[..token.len() - 1]] {
            assert!(!verify(&key, &alice, bad, now), "{bad:?}");
        }
    }
}
