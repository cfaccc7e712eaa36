//! Who is calling: API-key authentication and the client IP (DESIGN.md §3
//! "Client IP").

use std::net::IpAddr;

use actix_web::http::header;
use actix_web::{HttpMessage, HttpRequest};
use ipnet::IpNet;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use super::request_id::RequestId;
use crate::domain::client_ip::{forwarded_for, parse_hop};
use crate::domain::ClientIp;
use crate::error::ApiError;
use crate::guard::RequestInfo;
use crate::settings::{Secret, ServerSettings};

const MAX_USER_AGENT: usize = 512;

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
        let given = digest(token);
        self.0.iter().fold(false, |found, known| {
            found | bool::from(known.ct_eq(&given))
        })
    }
}

fn digest(s: &str) -> [u8; 32] {
    Sha256::digest(s.as_bytes()).into()
}

fn bearer(req: &HttpRequest) -> Option<&str> {
    let value = req.headers().get(header::AUTHORIZATION)?.to_str().ok()?;
    let (scheme, token) = value.split_once(' ')?;
    scheme.eq_ignore_ascii_case("bearer").then(|| token.trim())
}

/// The admin token an HTML console request presents: `Authorization: Bearer
/// <token>`, or HTTP Basic with user `admin` and the token as password.
fn console_token(req: &HttpRequest) -> Option<Secret> {
    if let Some(token) = bearer(req) {
        return Some(Secret::new(token));
    }
    use base64::Engine as _;
    let value = req.headers().get(header::AUTHORIZATION)?.to_str().ok()?;
    let (scheme, encoded) = value.split_once(' ')?;
    if !scheme.eq_ignore_ascii_case("basic") {
        return None;
    }
    let decoded = base64::engine::general_purpose::STANDARD
        .decode(encoded.trim())
        .ok()?;
    let (user, password) = std::str::from_utf8(&decoded).ok()?.split_once(':')?;
    (user == "admin").then(|| Secret::new(password))
}

/// Who may call what, and from which client IP, as `[server]` says: API
/// keys, admin tokens and trusted proxies.
pub struct Access {
    api_keys: BearerSecrets,
    admin_tokens: BearerSecrets,
    trusted_proxies: Vec<IpNet>,
}

impl Access {
    /// From `[server]`.
    pub fn new(server: &ServerSettings) -> Self {
        Self {
            api_keys: BearerSecrets::new(&server.api_keys),
            admin_tokens: BearerSecrets::new(&server.admin_tokens),
            trusted_proxies: server.trusted_proxies.clone(),
        }
    }

    /// Authenticate an admin request (an admin token; no list means no admin).
    pub fn admin(&self, req: &HttpRequest) -> Result<RequestInfo, ApiError> {
        if !self.admin_tokens.admits(req) {
            return Err(ApiError::Unauthorized);
        }
        Ok(self.info(req, self.peer_ip(req)))
    }

    /// Authenticate an admin HTML page: an admin token as Bearer or as the
    /// Basic password of user `admin`. Also returns the token, which keys the
    /// console's CSRF tokens.
    pub fn admin_console(&self, req: &HttpRequest) -> Result<(RequestInfo, Secret), ApiError> {
        match console_token(req) {
            Some(token) if self.admin_tokens.contains(token.expose()) => {
                Ok((self.info(req, self.peer_ip(req)), token))
            }
            _ => Err(ApiError::Unauthorized),
        }
    }

    /// Authenticate a public request and work out its client IP. `body_ip`
    /// counts only with an API key (DESIGN.md §3: a loopback backend without
    /// keys reports no one else's address).
    pub fn caller(
        &self,
        req: &HttpRequest,
        body_ip: Option<&str>,
    ) -> Result<RequestInfo, ApiError> {
        let with_key = !self.api_keys.is_empty();
        if with_key && !self.api_keys.admits(req) {
            return Err(ApiError::Unauthorized);
        }
        // A request that got past the check above carries a key, when keys
        // are configured: it is the backend without checking the key again.
        let backend = with_key || self.is_loopback_backend(req);
        let ip = match body_ip {
            Some(raw) if with_key => Some(
                ClientIp::parse(raw)
                    .ok_or_else(|| ApiError::InvalidRequest("ip is not an IP address".into()))?,
            ),
            _ => self.peer_ip(req),
        };
        let mut info = self.info(req, ip);
        info.backend = backend;
        Ok(info)
    }

    /// The trust boundary: who may vouch for a login's outcome, a passed
    /// captcha or a client's IP. With API keys configured, a request that
    /// carries one (the others were refused already, in `caller`). Without,
    /// a request straight from loopback: not one that came through a proxy
    /// (it carries `X-Forwarded-For` or `Forwarded`), since the browsers
    /// behind a reverse proxy on the same host are not loopback callers,
    /// trusted proxy or not.
    fn is_loopback_backend(&self, req: &HttpRequest) -> bool {
        let loopback = req
            .peer_addr()
            .is_some_and(|a| a.ip().to_canonical().is_loopback());
        let headers = req.headers();
        let proxied =
            headers.contains_key("x-forwarded-for") || headers.contains_key(header::FORWARDED);
        loopback && !proxied
    }

    fn info(&self, req: &HttpRequest, ip: Option<ClientIp>) -> RequestInfo {
        let request_id = req
            .extensions()
            .get::<RequestId>()
            .map(|id| id.0.clone())
            .unwrap_or_else(|| uuid::Uuid::now_v7().to_string());
        let user_agent = req
            .headers()
            .get(header::USER_AGENT)
            .and_then(|v| v.to_str().ok())
            .map(|ua| ua.chars().take(MAX_USER_AGENT).collect());
        RequestInfo {
            request_id,
            user_agent,
            ip,
            backend: false,
        }
    }

    /// The peer, or — when the peer is a trusted proxy — the right-most hop
    /// that is not a trusted proxy, from `Forwarded` (RFC 7239) when the
    /// request has one, else from `X-Forwarded-For`. A hop that names no
    /// address (`unknown`, garbage) where the walk needs one leaves the
    /// client unknown (no IP subject): never the proxy's own address, which
    /// would put every client behind it into one subject.
    fn peer_ip(&self, req: &HttpRequest) -> Option<ClientIp> {
        let peer = req.peer_addr().map(|a| a.ip())?;
        if !self.is_trusted(peer) {
            return Some(ClientIp::new(peer));
        }
        let headers = req.headers();
        let forwarded: Vec<&str> = headers
            .get_all(header::FORWARDED)
            .filter_map(|v| v.to_str().ok())
            .flat_map(forwarded_for)
            .collect();
        let hops: Vec<&str> = if forwarded.is_empty() {
            headers
                .get_all("x-forwarded-for")
                .filter_map(|v| v.to_str().ok())
                .flat_map(|v| v.split(','))
                .collect()
        } else {
            forwarded
        };
        // Walk from the proxy towards the client; stop at the first hop we do
        // not trust.
        let mut client = peer;
        for hop in hops.iter().rev() {
            match parse_hop(hop) {
                Some(ip) if self.is_trusted(ip) => client = ip,
                Some(ip) => return Some(ClientIp::new(ip)),
                None => return None,
            }
        }
        Some(ClientIp::new(client))
    }

    fn is_trusted(&self, ip: IpAddr) -> bool {
        let ip = ip.to_canonical();
        self.trusted_proxies.iter().any(|net| net.contains(&ip))
    }
}
