//! Who is calling: API-key authentication and the client IP (DESIGN.md §3
//! "Client IP").

use std::time::Duration;

use actix_web::http::header::{self, HeaderValue};
use actix_web::HttpRequest;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use crate::domain::admin_role::{Actor, Roles};
use crate::domain::forwarding::{ClientAddress, ProxyTrust, CLIENT_ADDRESS_HEADERS};
use crate::domain::text::disguises;
use crate::domain::ClientIp;
use crate::error::ApiError;
use crate::guard::RequestInfo;
use crate::metrics::Route;
use crate::settings::{AdminToken, Secret, ServerSettings};

const MAX_USER_AGENT: usize = 512;

/// A user agent as the audit trail keeps it: read lossily (`to_str` takes
/// visible ASCII only, and a browser's `café` is still its user agent), at
/// most [`MAX_USER_AGENT`] characters, and every character of the general
/// categories control (C1 included: U+009B introduces terminal escapes),
/// format (bidirectional overrides, zero-width characters, tags) and line or
/// paragraph separator replaced by U+FFFD, so that the console, a CSV export
/// or a terminal shows the row as it was sent, not as the sender wanted it
/// to look.
fn readable_user_agent(raw: &[u8]) -> String {
    // Nearly every user agent is printable ASCII and short: copied as it
    // is, without decoding and classifying it character by character (it
    // is read on every request, audited or not).
    if raw.len() <= MAX_USER_AGENT && raw.iter().all(|b| (b' '..=b'~').contains(b)) {
        return String::from_utf8_lossy(raw).into_owned();
    }
    String::from_utf8_lossy(raw)
        .chars()
        .take(MAX_USER_AGENT)
        .map(|c| {
            if disguises(c) {
                char::REPLACEMENT_CHARACTER
            } else {
                c
            }
        })
        .collect()
}

/// A list of bearer secrets, compared in constant time. Comparing digests keeps
/// the time independent of the secrets' lengths too.
#[derive(Clone)]
pub struct BearerSecrets(Vec<[u8; 32]>);

impl BearerSecrets {
    /// Keep only each secret's SHA-256 digest.
    pub fn new(secrets: &[Secret]) -> Self {
        Self(secrets.iter().map(|s| digest(s.expose())).collect())
    }

    /// Whether none is configured.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Whether the request carries one of the secrets as `Authorization: Bearer`.
    pub fn admits(&self, req: &HttpRequest) -> bool {
        bearer(req).is_some_and(|token| self.contains(token))
    }

    /// Whether `token` is one of the secrets.
    pub fn contains(&self, token: &str) -> bool {
        self.position(token).is_some()
    }

    /// Which of the secrets `token` is; every one is compared, so the time
    /// does not tell which.
    pub fn position(&self, token: &str) -> Option<usize> {
        let given = digest(token);
        self.0.iter().enumerate().fold(None, |found, (i, known)| {
            if bool::from(known.ct_eq(&given)) {
                Some(i)
            } else {
                found
            }
        })
    }
}

fn digest(s: &str) -> [u8; 32] {
    Sha256::digest(s.as_bytes()).into()
}

fn authorization(req: &HttpRequest) -> Option<&str> {
    req.headers().get(header::AUTHORIZATION)?.to_str().ok()
}

/// The credential after `scheme` (any case) and a space in an
/// `Authorization` value, trimmed. Every reader parses with it, so that what
/// counts as presented ([`checks_a_credential`]) and what is compared cannot
/// drift apart.
fn credential_of<'a>(value: &'a str, scheme: &str) -> Option<&'a str> {
    let (given, credential) = value.split_once(' ')?;
    given
        .eq_ignore_ascii_case(scheme)
        .then(|| credential.trim())
}

fn bearer(req: &HttpRequest) -> Option<&str> {
    credential_of(authorization(req)?, "bearer")
}

/// The admin token an HTML console request presents: `Authorization: Bearer
/// <token>`, or HTTP Basic with user `admin` and the token as password.
fn console_token(req: &HttpRequest) -> Option<Secret> {
    if let Some(token) = bearer(req) {
        return Some(Secret::new(token));
    }
    use base64::Engine as _;
    let encoded = credential_of(authorization(req)?, "basic")?;
    let decoded = base64::engine::general_purpose::STANDARD
        .decode(encoded)
        .ok()?;
    let (user, password) = std::str::from_utf8(&decoded).ok()?.split_once(':')?;
    (user == "admin").then(|| Secret::new(password))
}

/// Whether an `Authorization` value holds something an admin route checks:
/// a Bearer token, or (`basic`, the console) HTTP Basic, not empty. A value
/// that is not visible ASCII is checked (and refused) as a token would be.
fn checks_a_credential(value: &HeaderValue, basic: bool) -> bool {
    let Ok(value) = value.to_str() else {
        return true;
    };
    let presented = |scheme| credential_of(value, scheme).is_some_and(|c| !c.is_empty());
    presented("bearer") || (basic && presented("basic"))
}

/// A static admin token's admin.
#[derive(Clone)]
pub struct TokenAdmin {
    /// `token:<name>`.
    pub actor: Actor,
    /// What its entry grants.
    pub roles: Roles,
    /// The token itself; the console keys its CSRF tokens by it.
    pub secret: Secret,
}

/// The credential an admin request presents.
pub enum AdminCredential {
    /// No `Authorization` header: not a guess, not counted.
    Missing,
    /// An `Authorization` this route checks against nothing: another
    /// scheme (HTTP Basic on the JSON API, `Digest`, …) or an empty token.
    /// Not a guess either: an admin whose script sends the console's Basic
    /// credentials to the API must not throttle its own address.
    Unread,
    /// A token or password that is not an admin token (an API key
    /// included): a failed authentication.
    Wrong,
    /// One of `server.admin_tokens`.
    Token(TokenAdmin),
    /// A Bearer that is no static token but has the shape of a JWT (three
    /// dot-separated parts): an access token for the provider to vouch
    /// for, if single sign-on takes them.
    Jwt(String),
}

/// What a public request's `Authorization` came to ([`Access::check_key`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyCheck {
    /// One of the configured keys: the backend.
    Key,
    /// No API keys are configured and the call is straight from loopback:
    /// the backend.
    Loopback,
    /// No API keys are configured and the call is not straight from
    /// loopback: a browser's.
    NoKey,
    /// `server.keyless_sms`: a browser's `/sms/*` request, without
    /// `Authorization`.
    Keyless,
}

/// Who may call what, and from which client IP, as `[server]` says: API
/// keys, admin tokens and trusted proxies.
pub struct Access {
    api_keys: BearerSecrets,
    /// `server.keyless_sms`.
    keyless_sms: bool,
    admin_tokens: BearerSecrets,
    /// Each admin token's actor and roles, in `admin_tokens`' order.
    token_admins: Vec<(Actor, Roles)>,
    trust: ProxyTrust,
}

/// A proxy that forwards unusable client addresses may do so on every
/// request: one warning per minute says so, the metric counts them all.
static UNUSABLE_FORWARDING: crate::telemetry::log_budget::LogBudget =
    crate::telemetry::log_budget::LogBudget::new(Duration::from_secs(60));

/// A backend that never names its clients does so on every call: one
/// warning a minute says so, the metric counts them all.
static BACKENDS_OWN_IP: crate::telemetry::log_budget::LogBudget =
    crate::telemetry::log_budget::LogBudget::new(Duration::from_secs(60));

/// Count a backend's call that names no client (its address judges no one:
/// `RequestInfo::client_ip`), and say so a minute at most.
fn report_backends_own_ip(route: Route, backend: Option<ClientIp>) {
    crate::metrics::backend_without_client_ip(route);
    if let Some(held_back) = BACKENDS_OWN_IP.admit() {
        tracing::warn!(
            route = route.as_str(),
            backend = backend.map(|ip| ip.text()).unwrap_or_default(),
            held_back,
            "a backend called without the client's address (ip): its users are not counted \
             per address, not listed, not throttled per address; pass ip on every call \
             (docs/integration.md)"
        );
    }
}

impl Access {
    /// From `[server]`.
    pub fn new(server: &ServerSettings) -> Self {
        Self {
            api_keys: BearerSecrets::new(&server.api_keys),
            keyless_sms: server.keyless_sms,
            admin_tokens: BearerSecrets::new(
                &server
                    .admin_tokens
                    .iter()
                    .map(|t| t.secret().clone())
                    .collect::<Vec<_>>(),
            ),
            token_admins: server
                .admin_tokens
                .iter()
                .enumerate()
                .map(|(i, t): (usize, &AdminToken)| (Actor::token(&t.name(i)), t.roles()))
                .collect(),
            trust: ProxyTrust {
                proxies: server.trusted_proxies.clone(),
                header: server.client_ip_header.clone(),
                hops: server.trusted_proxy_hops,
            },
        }
    }

    /// What credential an admin request presents: an admin token as
    /// `Authorization: Bearer`, or (`basic`, the HTML console) as the Basic
    /// password of user `admin`; or a Bearer JWT. No list of tokens means
    /// no static admin.
    pub fn admin_credential(&self, req: &HttpRequest, basic: bool) -> AdminCredential {
        let Some(value) = req.headers().get(header::AUTHORIZATION) else {
            return AdminCredential::Missing;
        };
        if !checks_a_credential(value, basic) {
            return AdminCredential::Unread;
        }
        let token = if basic {
            console_token(req)
        } else {
            bearer(req).map(Secret::new)
        };
        let Some(token) = token else {
            return AdminCredential::Wrong;
        };
        let found = self.admin_tokens.position(token.expose());
        match found.and_then(|i| self.token_admins.get(i)) {
            Some((actor, roles)) => AdminCredential::Token(TokenAdmin {
                actor: actor.clone(),
                roles: *roles,
                secret: token,
            }),
            None if bearer(req).is_some() && token.expose().split('.').count() == 3 => {
                AdminCredential::Jwt(token.expose().to_string())
            }
            None => AdminCredential::Wrong,
        }
    }

    /// Whether the request reached tollgate over HTTPS: tollgate serves
    /// plain HTTP, so only a trusted proxy (`server.trusted_proxies`) that
    /// says `X-Forwarded-Proto: https` can tell. Anyone else's header is
    /// ignored.
    pub fn forwarded_https(&self, req: &HttpRequest) -> bool {
        let trusted = req
            .peer_addr()
            .is_some_and(|peer| self.trust.is_trusted(peer.ip()));
        trusted
            && req
                .headers()
                .get("x-forwarded-proto")
                .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"https"))
    }

    /// Check a public request's API key, before its body is read
    /// (`routes::api_key`). `keyless`: on the routes a browser may call,
    /// `/sms/send` and `/sms/verify`, where with `server.keyless_sms` a
    /// request without an `Authorization` header is a browser's even where
    /// keys are configured.
    pub fn check_key(&self, req: &HttpRequest, keyless: bool) -> Result<KeyCheck, ApiError> {
        if self.api_keys.is_empty() {
            return Ok(if self.is_loopback_backend(req) {
                KeyCheck::Loopback
            } else {
                KeyCheck::NoKey
            });
        }
        if keyless && self.keyless_sms && !req.headers().contains_key(header::AUTHORIZATION) {
            return Ok(KeyCheck::Keyless);
        }
        if self.api_keys.admits(req) {
            Ok(KeyCheck::Key)
        } else {
            Err(ApiError::Unauthorized)
        }
    }

    /// [`check_key`](Self::check_key) for `/login/*`, the login
    /// backend's routes: only it knows whether a password was right, and
    /// its word clears failures, passes captcha tiers and sends mail.
    /// Without keys configured, only a call straight from loopback; any
    /// other is refused 403 before its body is read.
    pub fn check_backend(&self, req: &HttpRequest) -> Result<KeyCheck, ApiError> {
        let key = self.check_key(req, false)?;
        if key == KeyCheck::NoKey {
            return Err(ApiError::Forbidden(
                "only the login backend may call /login/*: give it an API key (server.api_keys), \
                 or call from loopback when none is configured",
            ));
        }
        Ok(key)
    }

    /// Who called, once [`check_key`](Self::check_key) let the request
    /// in, and its client IP. `body_ip` counts only with an API key
    /// (DESIGN.md §3: a loopback backend without keys reports no one
    /// else's address). A keyless browser's address is its peer's (or a
    /// trusted proxy's word), never the body's, and it is no backend: not
    /// even from loopback, since with keys a backend shows one.
    pub fn caller(
        &self,
        req: &HttpRequest,
        route: Route,
        key: KeyCheck,
        body_ip: Option<&str>,
    ) -> Result<RequestInfo, ApiError> {
        let (backend, ip, backends_own_ip) = match key {
            KeyCheck::Key => match body_ip {
                Some(raw) => {
                    let ip = ClientIp::parse(raw).ok_or_else(|| {
                        ApiError::InvalidRequest("ip is not an IP address".into())
                    })?;
                    (true, Some(ip), ip.names_no_client())
                }
                // Unless a trusted proxy named a client, the address is the
                // backend's own: the one that called.
                None => {
                    let client = self.client_address(req);
                    let own = client.is_some_and(|c| self.is_callers_own(c));
                    (true, client.map(|c| ClientIp::new(c.ip())), own)
                }
            },
            // Without a key the body's `ip` is ignored altogether, checked
            // or not: a browser's placeholder must not fail its send. A
            // loopback backend carries no client-address header, so its
            // address is its own.
            KeyCheck::Loopback => {
                let ip = self.peer_ip(req);
                (true, ip, ip.is_some())
            }
            KeyCheck::NoKey | KeyCheck::Keyless => (false, self.peer_ip(req), false),
        };
        if backends_own_ip {
            // For a body's loopback `ip`, the caller's own address: which
            // backend it was is what the warning is for. (Its peer as the
            // socket has it: `peer_ip` would count a proxy fallback twice.)
            let backend = match (key, body_ip) {
                (KeyCheck::Key, Some(_)) => req.peer_addr().map(|a| ClientIp::new(a.ip())),
                _ => ip,
            };
            report_backends_own_ip(route, backend);
        }
        let mut info = self.info(req, ip);
        info.backend = backend;
        info.backends_own_ip = backends_own_ip;
        Ok(info)
    }

    /// The trust boundary: who may vouch for a login's outcome, a passed
    /// captcha or a client's IP. With API keys configured, a request that
    /// carries one (the others were refused already, in `check_key`). Without,
    /// a request straight from loopback: not one that came through a proxy,
    /// since the browsers behind a reverse proxy on the same host are not
    /// loopback callers, trusted proxy or not. A request that carries any
    /// client-address header (`X-Forwarded-For`, `Forwarded`, `X-Real-IP`,
    /// `CF-Connecting-IP`, … or the configured `client_ip_header`) came
    /// through one, or says it did: a browser's either way.
    fn is_loopback_backend(&self, req: &HttpRequest) -> bool {
        let loopback = req
            .peer_addr()
            .is_some_and(|a| a.ip().to_canonical().is_loopback());
        let headers = req.headers();
        let proxied = CLIENT_ADDRESS_HEADERS
            .iter()
            .chain([&self.trust.header.name()])
            .any(|name| headers.contains_key(*name));
        loopback && !proxied
    }

    /// Who asked, for audit rows: request id, user agent, client address.
    pub(crate) fn info(&self, req: &HttpRequest, ip: Option<ClientIp>) -> RequestInfo {
        let request_id = crate::telemetry::current_request_id()
            .unwrap_or_else(|| crate::uuid_v7::now().to_string());
        let user_agent = req
            .headers()
            .get(header::USER_AGENT)
            .map(|v| readable_user_agent(v.as_bytes()));
        RequestInfo {
            request_id,
            user_agent,
            ip,
            backend: false,
            backends_own_ip: false,
            actor: None,
        }
    }

    /// The client's address (see `domain::forwarding`): the peer, or,
    /// behind a trusted proxy, what `server.client_ip_header` says. A proxy
    /// that forwards no usable address is counted (a metric) and reported
    /// (a rate-limited warning); the request counts under its address.
    pub(crate) fn peer_ip(&self, req: &HttpRequest) -> Option<ClientIp> {
        self.client_address(req).map(|c| ClientIp::new(c.ip()))
    }

    /// Whether `client` is the caller's own address (or its proxy's): no
    /// trusted proxy named a client outside the trusted ranges. A forwarded
    /// address within them is where the chain started (every hop trusted):
    /// a backend inside them. One forwarded unusably counts as a client's,
    /// under the proxy (never uncounted).
    fn is_callers_own(&self, client: ClientAddress) -> bool {
        match client {
            ClientAddress::Forwarded(ip) => self.trust.is_trusted(ip),
            ClientAddress::Unusable(_) => false,
            ClientAddress::Peer(_) | ClientAddress::NotForwarded(_) => true,
        }
    }

    /// [`peer_ip`](Self::peer_ip), and how it was found.
    fn client_address(&self, req: &HttpRequest) -> Option<ClientAddress> {
        let peer = req.peer_addr().map(|a| a.ip())?;
        // An untrusted peer's header is not even collected: a client far
        // from any proxy costs nothing however much it sends.
        if !self.trust.reads_header_from(peer) {
            return Some(ClientAddress::Peer(peer));
        }
        // Read lossily, not with `to_str`: an appending proxy puts what the
        // client wrote (any bytes) on the same line as its own entry, and
        // one byte past ASCII must not void that entry (the request would
        // then count under the proxy, not the client).
        let values: Vec<_> = req
            .headers()
            .get_all(self.trust.header.name())
            .map(|v| String::from_utf8_lossy(v.as_bytes()))
            .collect();
        let client = self.trust.client(peer, values.iter().map(|v| v.as_ref()));
        match client {
            ClientAddress::Peer(_) | ClientAddress::Forwarded(_) => {}
            ClientAddress::NotForwarded(_) => crate::metrics::client_ip_fallback("not_forwarded"),
            ClientAddress::Unusable(counted) => {
                crate::metrics::client_ip_fallback("unusable");
                if let Some(held_back) = UNUSABLE_FORWARDING.admit() {
                    tracing::warn!(
                        request_id = %crate::telemetry::request_id(),
                        header = self.trust.header.name(),
                        peer = %peer,
                        counted_as = %counted,
                        held_back,
                        "a trusted proxy forwarded no usable client address; \
                         counted under the proxy's (check server.client_ip_header)"
                    );
                }
            }
        }
        Some(client)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What is not presented is never compared: a value this finds unread
    /// gives `bearer` (and, on the console, Basic) nothing to check.
    #[test]
    fn only_a_scheme_the_route_reads_with_a_credential_is_presented() {
        let cases: [(&[u8], bool, bool); 12] = [
            (b"Bearer x", false, true),
            (b"bEaReR x", false, true),
            (b"Bearer  x", false, true),
            (b"Bearer", false, false),
            (b"Bearer ", false, false),
            (b"Bearer\tx", false, false),
            (b"Basic YWRtaW46eA==", false, false),
            (b"Basic YWRtaW46eA==", true, true),
            (b"Basic\tYWRtaW46eA==", true, false),
            (b"Digest username=admin", true, false),
            (b"Bearer \xff", false, true),
            (b"x", true, false),
        ];
        for (value, basic, presented) in cases {
            let header = HeaderValue::from_bytes(value).unwrap();
            assert_eq!(
                checks_a_credential(&header, basic),
                presented,
                "{value:?}, basic {basic}"
            );
            if !presented {
                let token = header
                    .to_str()
                    .ok()
                    .and_then(|v| credential_of(v, "bearer"));
                assert!(token.is_none_or(str::is_empty), "{value:?}");
            }
        }
    }

    /// Which callers name no client: a backend's own address (or its
    /// proxy's) never counts in the verify windows every user would fill,
    /// a client's always does.
    #[test]
    fn only_a_backend_that_names_no_client_has_its_own_address() {
        use actix_web::test::TestRequest;
        let mut server = crate::settings::Settings::defaults()
            .expect("the embedded defaults are valid")
            .server;
        server.trusted_proxies = vec!["10.0.0.0/8".parse().unwrap()];
        let access = Access::new(&server);
        let own = |peer: &str, xff: Option<&str>, key: KeyCheck, body_ip: Option<&str>| {
            let mut req = TestRequest::default().peer_addr(peer.parse().unwrap());
            if let Some(xff) = xff {
                req = req.insert_header(("X-Forwarded-For", xff));
            }
            let info = access
                .caller(&req.to_http_request(), Route::SmsVerify, key, body_ip)
                .expect("a caller");
            (info.ip.map(|ip| ip.text()), info.backends_own_ip)
        };
        let cases = [
            (
                ("203.0.113.5:1", None, KeyCheck::Key, None),
                ("203.0.113.5", true),
            ),
            (
                ("203.0.113.5:1", None, KeyCheck::Key, Some("198.51.100.7")),
                ("198.51.100.7", false),
            ),
            (
                ("10.0.0.1:1", Some("198.51.100.7"), KeyCheck::Key, None),
                ("198.51.100.7", false),
            ),
            (
                ("10.0.0.1:1", Some("10.2.3.4"), KeyCheck::Key, None),
                ("10.2.3.4", true),
            ),
            (
                ("10.0.0.1:1", None, KeyCheck::Key, None),
                ("10.0.0.1", true),
            ),
            (
                ("10.0.0.1:1", Some("unknown"), KeyCheck::Key, None),
                ("10.0.0.1", false),
            ),
            (
                ("127.0.0.1:1", None, KeyCheck::Loopback, None),
                ("127.0.0.1", true),
            ),
            (
                ("198.51.100.7:1", None, KeyCheck::Keyless, None),
                ("198.51.100.7", false),
            ),
            (
                ("198.51.100.7:1", None, KeyCheck::NoKey, None),
                ("198.51.100.7", false),
            ),
        ];
        for ((peer, xff, key, body_ip), (ip, expected)) in cases {
            assert_eq!(
                own(peer, xff, key, body_ip),
                (Some(ip.to_string()), expected),
                "{peer} {xff:?} {key:?} {body_ip:?}"
            );
        }
    }

    #[test]
    fn a_user_agent_keeps_its_text_and_loses_what_would_disguise_it() {
        assert_eq!(readable_user_agent(b"curl/8.5"), "curl/8.5");
        assert_eq!(readable_user_agent("café/2.0".as_bytes()), "café/2.0");
        assert_eq!(readable_user_agent(b"a\xffb"), "a\u{fffd}b");
        for disguise in [
            "\u{9b}31m",
            "\u{202e}gpj.exe",
            "a\u{200b}b",
            "x\u{2028}y",
            "\u{e0041}",
        ] {
            let kept = readable_user_agent(disguise.as_bytes());
            assert!(kept.contains('\u{fffd}'), "{disguise:?} -> {kept:?}");
            assert!(!kept.chars().any(disguises), "{kept:?}");
        }
        // The ASCII shortcut says what the tables say.
        for c in (0u8..=127).map(char::from) {
            use unicode_properties::{GeneralCategory, UnicodeGeneralCategory};
            assert_eq!(
                disguises(c),
                c.general_category() == GeneralCategory::Control,
                "{c:?}"
            );
        }
        let long = "a".repeat(2 * MAX_USER_AGENT);
        assert_eq!(readable_user_agent(long.as_bytes()).len(), MAX_USER_AGENT);
        // The printable-ASCII shortcut keeps exactly what the slow path keeps.
        let browser = b"Mozilla/5.0 (X11; Linux x86_64) AppleWebKit/537.36 (KHTML, like Gecko)";
        let slow: String = String::from_utf8_lossy(browser).chars().collect();
        assert_eq!(readable_user_agent(browser), slow);
        assert_eq!(readable_user_agent(b"a\tb"), "a\u{fffd}b");
        assert_eq!(readable_user_agent(b"a\x7fb"), "a\u{fffd}b");
    }
}
