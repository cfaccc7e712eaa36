//! The provider's signing keys (its JWKS), fetched from the `jwks_uri` its
//! discovery document names, kept, and fetched again:
//!
//! - when a token names a key id (`kid`) the set lacks: the provider has
//!   rotated its keys. Such a fetch happens at most once per
//!   [`UNKNOWN_KID_COOLDOWN`], so a stream of tokens with made-up key ids
//!   (anyone can send them) costs the provider one request a minute, not
//!   one per token; a token with a truly new key that arrives inside the
//!   cooldown is refused (401) and accepted after it.
//! - when the set is older than [`MAX_AGE`], on the next use: a key the
//!   provider withdrew (a leaked one) stops being accepted within the hour.
//!
//! Fetches are single-flight: concurrent requests wait for one fetch, but
//! while keys are held, old ones serve at once rather than wait for it.
//! When a fetch fails the keys held stay in use, and the next fetch waits
//! [`FAILED_RETRY`]: a provider that is down is not asked on every request.

use std::sync::Arc;
use std::time::{Duration, Instant};

use openidconnect::core::CoreJsonWebKeySet;
use parking_lot::RwLock;

use super::http::Http;

/// Least time between two fetches caused by unknown key ids.
pub const UNKNOWN_KID_COOLDOWN: Duration = Duration::from_secs(60);
/// Keys older than this are fetched again on their next use.
pub const MAX_AGE: Duration = Duration::from_secs(3600);
/// After a failed fetch, how long old keys (or none) are used before the
/// next try, as discovery's retry: a provider that is down is not asked
/// again on every admin request, one at a time, each up to its timeout.
pub const FAILED_RETRY: Duration = Duration::from_secs(10);

/// One fetched key set, read both ways: by `openidconnect` for ID tokens,
/// by `jsonwebtoken` for access tokens.
pub struct Keys {
    /// For the ID token verifier.
    pub oidc: CoreJsonWebKeySet,
    /// For access tokens.
    pub jwt: jsonwebtoken::jwk::JwkSet,
    fetched: Instant,
}

impl Keys {
    /// Both readings of a JWKS document.
    pub fn parse(body: &[u8], fetched: Instant) -> Result<Self, serde_json::Error> {
        Ok(Self {
            oidc: serde_json::from_slice(body)?,
            jwt: parse_jwt_keys(body)?,
            fetched,
        })
    }

    /// Whether the set has a key with id `kid`.
    pub fn has_kid(&self, kid: &str) -> bool {
        self.jwt
            .keys
            .iter()
            .any(|k| k.common.key_id.as_deref() == Some(kid))
    }
}

/// The keys jsonwebtoken can read; a key of a type it does not know (a
/// provider may publish encryption keys beside signing ones) is skipped
/// rather than failing the whole set.
fn parse_jwt_keys(body: &[u8]) -> Result<jsonwebtoken::jwk::JwkSet, serde_json::Error> {
    #[derive(serde::Deserialize)]
    struct Raw {
        keys: Vec<serde_json::Value>,
    }
    let raw: Raw = serde_json::from_slice(body)?;
    let keys = raw
        .keys
        .into_iter()
        .filter_map(|k| serde_json::from_value(k).ok())
        .collect();
    Ok(jsonwebtoken::jwk::JwkSet { keys })
}

/// Why the keys are to be fetched.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Need {
    /// No keys yet, or they are older than [`MAX_AGE`].
    Fresh,
    /// A token names a key id the set lacks.
    UnknownKid,
}

/// When a fetch may happen: pure, so that the rate limit is tested with
/// made-up instants.
#[derive(Debug, Default)]
pub struct Refresh {
    last_unknown_kid: Option<Instant>,
    failed_at: Option<Instant>,
}

impl Refresh {
    /// Whether keys `held` (fetched at that instant, if any) should be
    /// fetched again at `now` for `need`; records the fetch when so.
    pub fn admit(&mut self, need: Need, held: Option<Instant>, now: Instant) -> bool {
        match need {
            Need::Fresh => {
                let stale = held.is_none_or(|at| now.saturating_duration_since(at) >= MAX_AGE);
                let retry = self
                    .failed_at
                    .is_none_or(|at| now.saturating_duration_since(at) >= FAILED_RETRY);
                stale && retry
            }
            Need::UnknownKid => {
                let cooled = self
                    .last_unknown_kid
                    .is_none_or(|at| now.saturating_duration_since(at) >= UNKNOWN_KID_COOLDOWN);
                if cooled {
                    self.last_unknown_kid = Some(now);
                }
                cooled
            }
        }
    }

    /// How the fetch `admit` let through ended, at `now`.
    pub fn fetched(&mut self, ok: bool, now: Instant) {
        self.failed_at = (!ok).then_some(now);
    }
}

/// The keys held, and the one fetch in flight.
pub struct KeyCache {
    url: String,
    http: Http,
    held: RwLock<Option<Arc<Keys>>>,
    refresh: tokio::sync::Mutex<Refresh>,
}

impl KeyCache {
    /// Keys from `url`, none fetched yet.
    pub fn new(url: String, http: Http) -> Self {
        Self {
            url,
            http,
            held: RwLock::new(None),
            refresh: tokio::sync::Mutex::new(Refresh::default()),
        }
    }

    /// The keys held, fetched first when there are none or they are old;
    /// `None` when none could be had.
    pub async fn current(&self) -> Option<Arc<Keys>> {
        let held = self.held.read().clone();
        match held {
            Some(keys) if keys.fetched.elapsed() < MAX_AGE => Some(keys),
            _ => self.fetch(Need::Fresh, None).await,
        }
    }

    /// The keys after a token named `kid`, which the held keys lack: fetched
    /// again unless the cooldown forbids. `None` when no keys are held.
    pub async fn with_kid(&self, kid: &str) -> Option<Arc<Keys>> {
        self.fetch(Need::UnknownKid, Some(kid)).await
    }

    async fn fetch(&self, need: Need, kid: Option<&str>) -> Option<Arc<Keys>> {
        // Old keys serve while another request fetches new ones.
        let mut refresh = match self.refresh.try_lock() {
            Ok(refresh) => refresh,
            Err(_) => {
                let held = self.held.read().clone();
                match (need, held) {
                    (Need::Fresh, Some(old)) => return Some(old),
                    _ => self.refresh.lock().await,
                }
            }
        };
        // Another request may have fetched while this one waited.
        let held = self.held.read().clone();
        if let (Some(keys), Some(kid)) = (&held, kid) {
            if keys.has_kid(kid) {
                return held;
            }
        }
        if !refresh.admit(need, held.as_ref().map(|k| k.fetched), Instant::now()) {
            return held;
        }
        let fetched = self.http.get(&self.url).await;
        let parsed = fetched
            .map_err(|e| e.to_string())
            .and_then(|body| Keys::parse(&body, Instant::now()).map_err(|e| e.to_string()));
        crate::metrics::admin_jwks_fetch(parsed.is_ok());
        refresh.fetched(parsed.is_ok(), Instant::now());
        match parsed {
            Ok(keys) => {
                let keys = Arc::new(keys);
                *self.held.write() = Some(keys.clone());
                Some(keys)
            }
            Err(error) => {
                tracing::warn!(%error, url = %self.url, "the OpenID provider's keys could not be fetched; the held ones stay in use");
                held
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_key_ids_fetch_at_most_once_per_cooldown() {
        let start = Instant::now();
        let mut refresh = Refresh::default();
        let fetched = Some(start);
        // A stream of made-up key ids: one fetch, then none for a minute.
        assert!(refresh.admit(Need::UnknownKid, fetched, start));
        for s in [0, 1, 30, 59] {
            let at = start + Duration::from_secs(s);
            assert!(!refresh.admit(Need::UnknownKid, fetched, at), "{s}s");
        }
        assert!(refresh.admit(Need::UnknownKid, fetched, start + UNKNOWN_KID_COOLDOWN));
        assert!(!refresh.admit(Need::UnknownKid, fetched, start + UNKNOWN_KID_COOLDOWN));
    }

    #[test]
    fn held_keys_are_fetched_again_only_when_missing_or_an_hour_old() {
        let start = Instant::now();
        let mut refresh = Refresh::default();
        assert!(refresh.admit(Need::Fresh, None, start));
        assert!(!refresh.admit(Need::Fresh, Some(start), start + Duration::from_secs(3599)));
        assert!(refresh.admit(Need::Fresh, Some(start), start + MAX_AGE));
        // Age-driven fetches do not use up the unknown-kid allowance.
        assert!(refresh.admit(Need::UnknownKid, Some(start), start));
    }

    #[test]
    fn after_a_failed_fetch_the_next_waits_for_the_retry() {
        let start = Instant::now();
        let old = Some(start);
        let stale = start + MAX_AGE;
        let mut refresh = Refresh::default();
        assert!(refresh.admit(Need::Fresh, old, stale));
        refresh.fetched(false, stale);
        // Every admin request meanwhile uses the old keys, none fetches.
        for s in [0, 1, 9] {
            let at = stale + Duration::from_secs(s);
            assert!(!refresh.admit(Need::Fresh, old, at), "{s}s");
            assert!(!refresh.admit(Need::Fresh, None, at), "{s}s, no keys");
        }
        let later = stale + FAILED_RETRY;
        assert!(refresh.admit(Need::Fresh, old, later));
        refresh.fetched(true, later);
        assert!(
            refresh.admit(Need::Fresh, None, later),
            "a success ends the wait"
        );
    }

    #[test]
    fn keys_of_unknown_types_are_skipped_not_fatal() {
        let body = br#"{"keys": [
            {"kty": "RSA", "kid": "a", "use": "sig", "alg": "RS256", "n": "sXchDaQebHnPiGvyDOAT4saGEUetSyo9MKLOoWFsueri23bOdgWp4Dy1WlUzewbgBHod5pcM9H95GQRV3JDXboIRROSBigeC5yjU1hGzHHyXss8UDprecbAYxknTcQkhslANGRUZmdTOQ5qTRsLAt6BTYuyvVRdhS8exSZEy_c4gs_7svlJJQ4H9_NxsiIoLwAEk7-Q3UXERGYw_75IDrGA84-lA_-Ct4eTlXHBIY2EaV7t7LjJaynVJCpkv4LKjTTAumiGUIuQhrNhZLuF_RJLqHpM2kgWFLU7-VTdL1VbC2tejvcI2BlMkEpk1BzBZI0KQB0GaDWFLN-aEAw3vRw", "e": "AQAB"},
            {"kty": "FUTURE", "kid": "b"}
        ]}"#;
        let keys = Keys::parse(body, Instant::now()).unwrap();
        assert!(keys.has_kid("a"));
        assert!(!keys.has_kid("b"));
        assert_eq!(keys.jwt.keys.len(), 1);
    }
}
