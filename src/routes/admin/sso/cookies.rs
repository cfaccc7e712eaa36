//! The console's two cookies, both encrypted and authenticated
//! (AES-256-GCM, the `cookie` crate's private jar) with a key derived from
//! `admin.oidc.client_secret`, so every instance reads what another wrote:
//!
//! - `tollgate_admin_login`: the sign-in in progress (`state`, `nonce`, PKCE
//!   verifier, where to return), for at most 10 minutes; nothing of it is
//!   kept server-side, so a stranger who opens `/admin` costs no storage.
//!   Encrypted: the verifier never shows, even to the browser's owner.
//! - `tollgate_admin_session`: the random session id; the session itself
//!   (actor, roles, expiry) is a row of `admin_sessions`.
//!
//! Both: `HttpOnly`, `SameSite=Lax` (sent on the provider's top-level
//! redirect back, never on a cross-site POST). Over HTTPS they are named
//! `__Host-tollgate_admin_*`, `Secure`, `Path=/`: a browser takes such a
//! cookie only from this very host, so a page on a sibling subdomain
//! cannot plant its own sign-in cookie and sign an admin in as itself.
//! Over plain HTTP (a laptop) the prefix cannot be had: `Path=/admin`.

use std::borrow::Cow;

use actix_web::cookie::{Cookie, CookieJar, Key, SameSite};
use actix_web::HttpRequest;
use hmac::{Hmac, KeyInit, Mac};
use sha2::Sha512;

/// The session cookie's name (without the prefix it has over HTTPS).
pub const SESSION: &str = "tollgate_admin_session";
/// The pending sign-in's cookie's name (likewise).
pub const LOGIN: &str = "tollgate_admin_login";

/// The cookie `base` is called, over HTTPS (`secure`) or not.
fn name(base: &'static str, secure: bool) -> Cow<'static, str> {
    if secure {
        Cow::Owned(format!("__Host-{base}"))
    } else {
        Cow::Borrowed(base)
    }
}

/// `__Host-` cookies must be for `/`.
fn path(secure: bool) -> &'static str {
    if secure {
        "/"
    } else {
        "/admin"
    }
}

/// The cookies' key: HMAC-SHA512 of a fixed label under the client secret,
/// 64 bytes (the private jar uses its second half).
pub fn key(secret: &[u8]) -> Key {
    let mut mac =
        <Hmac<Sha512> as KeyInit>::new_from_slice(secret).expect("HMAC accepts keys of any length");
    mac.update(b"tollgate admin console cookies v1");
    Key::from(&mac.finalize().into_bytes())
}

/// The cookie `base` holding `value` encrypted, for `max_age`.
pub fn sealed(
    key: &Key,
    base: &'static str,
    value: String,
    secure: bool,
    max_age: std::time::Duration,
) -> Cookie<'static> {
    let name = name(base, secure);
    let cookie = Cookie::build(name.clone(), value)
        .path(path(secure))
        .http_only(true)
        .same_site(SameSite::Lax)
        .secure(secure)
        .max_age(actix_web::cookie::time::Duration::seconds(
            i64::try_from(max_age.as_secs()).unwrap_or(i64::MAX),
        ))
        .finish();
    let mut jar = CookieJar::new();
    jar.private_mut(key).add(cookie);
    jar.get(&name)
        .cloned()
        .unwrap_or_else(|| removal(base, secure))
}

/// The cookie that deletes `base` in the browser.
pub fn removal(base: &'static str, secure: bool) -> Cookie<'static> {
    let mut cookie = Cookie::build(name(base, secure), "")
        .path(path(secure))
        .http_only(true)
        .same_site(SameSite::Lax)
        .secure(secure)
        .finish();
    cookie.make_removal();
    cookie
}

/// The decrypted value of the request's cookie `base` (over HTTPS, its
/// `__Host-` one only); `None` when it is missing, or was not made with
/// `key` (forged, or from before the client secret changed).
pub fn opened(key: &Key, req: &HttpRequest, base: &'static str, secure: bool) -> Option<String> {
    let name = name(base, secure);
    let cookie = req.cookie(&name)?;
    let mut jar = CookieJar::new();
    jar.add_original(cookie);
    jar.private(key).get(&name).map(|c| c.value().to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use actix_web::test::TestRequest;

    #[test]
    fn a_sealed_cookie_opens_with_its_key_only() {
        let key = key(b"client-secret-0123456789");
        let cookie = sealed(
            &key,
            SESSION,
            "id-123".into(),
            true,
            std::time::Duration::from_secs(60),
        );
        assert!(!cookie.value().contains("id-123"), "encrypted");
        assert_eq!(cookie.name(), "__Host-tollgate_admin_session");
        assert_eq!(cookie.path(), Some("/"));
        assert_eq!(cookie.domain(), None);
        assert_eq!(cookie.http_only(), Some(true));
        assert_eq!(cookie.secure(), Some(true));
        assert_eq!(cookie.same_site(), Some(SameSite::Lax));
        let req = TestRequest::default()
            .cookie(cookie.clone())
            .to_http_request();
        assert_eq!(opened(&key, &req, SESSION, true).as_deref(), Some("id-123"));
        assert_eq!(
            opened(&key, &req, SESSION, false),
            None,
            "over HTTPS only the prefixed cookie counts"
        );
        let other = super::key(b"another-secret-0123456789");
        assert_eq!(opened(&other, &req, SESSION, true), None);
        let mut tampered = cookie.clone();
        let mut value = tampered.value().to_string();
        let last = value.pop().unwrap();
        value.push(if last == 'A' { 'B' } else { 'A' });
        tampered.set_value(value);
        let req = TestRequest::default().cookie(tampered).to_http_request();
        assert_eq!(opened(&key, &req, SESSION, true), None);
    }

    /// A sibling subdomain can set `tollgate_admin_login` for the whole
    /// site; over HTTPS tollgate reads only the `__Host-` cookie, which no
    /// other host can set.
    #[test]
    fn over_https_an_unprefixed_cookie_is_not_read() {
        let key = key(b"client-secret-0123456789");
        let plain = sealed(
            &key,
            LOGIN,
            "planted".into(),
            false,
            std::time::Duration::from_secs(60),
        );
        assert_eq!(plain.name(), "tollgate_admin_login");
        assert_eq!(plain.path(), Some("/admin"));
        let req = TestRequest::default().cookie(plain).to_http_request();
        assert_eq!(opened(&key, &req, LOGIN, false).as_deref(), Some("planted"));
        assert_eq!(opened(&key, &req, LOGIN, true), None);
        let removal = removal(LOGIN, true);
        assert_eq!(
            (removal.name(), removal.path()),
            ("__Host-tollgate_admin_login", Some("/"))
        );
    }
}
