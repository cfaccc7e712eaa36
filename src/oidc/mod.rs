//! Single sign-on for admins through an OpenID Connect provider
//! (`[admin.oidc]`): the console's authorization code flow with PKCE (S256),
//! `state` and `nonce`, ID tokens checked by `openidconnect`, and JWT access
//! tokens for the admin API checked by `jsonwebtoken`, both against the
//! provider's keys as `jwks` keeps them.
//!
//! The provider is discovered on first use, not at start-up: a provider
//! that is down must not stop tollgate (static tokens keep working), and a
//! failed discovery is tried again at most every [`DISCOVERY_RETRY`].
//! HTTP knows nothing of this module's callers: it returns identities and
//! errors; `routes::admin::sso` turns them into cookies, pages and audit rows.

pub mod access_token;
pub mod claims;
mod http;
pub mod jwks;
mod sign_in;

use std::sync::Arc;
use std::time::{Duration, Instant};

use openidconnect::core::{
    CoreAuthDisplay, CoreAuthPrompt, CoreErrorResponseType, CoreGenderClaim, CoreJsonWebKey,
    CoreJweContentEncryptionAlgorithm, CoreJwsSigningAlgorithm, CoreProviderMetadata,
    CoreRevocableToken, CoreRevocationErrorResponse, CoreTokenIntrospectionResponse, CoreTokenType,
};
use openidconnect::{
    AdditionalClaims, ClientId, ClientSecret, EmptyExtraTokenFields, EndpointMaybeSet,
    EndpointNotSet, EndpointSet, IdTokenFields, IssuerUrl, RedirectUrl, StandardErrorResponse,
    StandardTokenResponse,
};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use subtle::ConstantTimeEq;

pub use claims::{Grants, Identity};
use http::Http;
use jwks::KeyCache;

use crate::domain::admin_role::Roles;
use crate::settings::OidcSettings;

/// Least time between two discovery attempts after one failed.
pub const DISCOVERY_RETRY: Duration = Duration::from_secs(10);
/// How long a browser may take at the provider, from leaving tollgate to
/// coming back with a code.
pub const LOGIN_TTL: Duration = Duration::from_secs(600);
/// How far apart clocks may be: instances' (a sign-in started on one
/// finishes on another; a console form rendered by one is posted to
/// another) and the provider's (a token's `exp` and `nbf`).
pub const CLOCK_SKEW_SECS: i64 = 60;

/// Every claim of the ID token besides the standard ones, kept so that
/// `roles_claim` can name any of them.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct OtherClaims {
    #[serde(flatten)]
    rest: Map<String, Value>,
}

impl AdditionalClaims for OtherClaims {}

type IdFields = IdTokenFields<
    OtherClaims,
    EmptyExtraTokenFields,
    CoreGenderClaim,
    CoreJweContentEncryptionAlgorithm,
    CoreJwsSigningAlgorithm,
>;
type TokenResponse = StandardTokenResponse<IdFields, CoreTokenType>;
type Client = openidconnect::Client<
    OtherClaims,
    CoreAuthDisplay,
    CoreGenderClaim,
    CoreJweContentEncryptionAlgorithm,
    CoreJsonWebKey,
    CoreAuthPrompt,
    StandardErrorResponse<CoreErrorResponseType>,
    TokenResponse,
    CoreTokenIntrospectionResponse,
    CoreRevocableToken,
    CoreRevocationErrorResponse,
    EndpointSet,
    EndpointNotSet,
    EndpointNotSet,
    EndpointNotSet,
    EndpointMaybeSet,
    EndpointMaybeSet,
>;

/// What a sign-in started: kept by the browser (in an encrypted cookie)
/// until it comes back from the provider.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PendingLogin {
    /// The `state` sent; the callback must carry it back.
    pub state: String,
    /// The `nonce` sent; the ID token must carry it.
    pub nonce: String,
    /// The PKCE verifier of the S256 challenge sent.
    pub verifier: String,
    /// The console path to return to (always under `/admin`).
    pub return_to: String,
    /// Unix seconds: the login expires [`LOGIN_TTL`] after.
    pub started: i64,
}

impl PendingLogin {
    /// Whether a callback carrying `state` answers this sign-in, while it
    /// is fresh (`LOGIN_TTL`); compared in constant time. A start up to
    /// [`CLOCK_SKEW_SECS`] ahead is fresh: the callback may reach another
    /// instance whose clock is behind the one that started it.
    pub fn answered_by(&self, state: &str) -> bool {
        let age = now_secs().saturating_sub(self.started);
        let fresh = (-CLOCK_SKEW_SECS..=LOGIN_TTL.as_secs() as i64).contains(&age);
        fresh && bool::from(self.state.as_bytes().ct_eq(state.as_bytes()))
    }
}

/// Why a sign-in failed; each is an audit row's reason.
#[derive(Debug, thiserror::Error)]
pub enum SignInError {
    /// No pending login, another `state`, or an expired one.
    #[error("the sign-in callback does not match a sign-in this browser started")]
    InvalidCallback,
    /// The provider said no (`error=access_denied`), or could not be
    /// reached, or refused the code.
    #[error("the identity provider: {0}")]
    Provider(String),
    /// The ID token is missing or fails validation.
    #[error("the ID token: {0}")]
    IdToken(String),
    /// The claims name no one, or grant no role.
    #[error("no tollgate role for {0}")]
    NoRole(String),
}

/// Why a bearer token was not accepted.
#[derive(Debug, thiserror::Error)]
pub enum BearerError {
    /// Not valid: 401, counted as a failed authentication.
    #[error("{0}")]
    Invalid(#[from] access_token::TokenError),
    /// Valid, but it grants no role: 401 too.
    #[error("the token grants no tollgate role")]
    NoRole,
    /// The provider's keys cannot be had: 503.
    #[error("the identity provider's keys are unavailable")]
    Unavailable,
}

/// The provider as discovered.
struct Provider {
    client: Client,
    issuer: IssuerUrl,
    keys: KeyCache,
    /// The ID token algorithms the provider says it uses, asymmetric only.
    id_token_algs: Vec<CoreJwsSigningAlgorithm>,
}

/// Discovery's state: found, or when it last failed.
enum Discovery {
    Pending { failed_at: Option<Instant> },
    Found(Arc<Provider>),
}

/// The OpenID Connect relying party: the console's sign-in and the API's
/// bearer tokens.
pub struct Oidc {
    settings: OidcSettings,
    http: Http,
    discovery: tokio::sync::Mutex<Discovery>,
}

fn now_secs() -> i64 {
    chrono::Utc::now().timestamp()
}

/// Whether `alg` is asymmetric: an ID token "signed" with the client secret
/// (HS256) is not accepted either.
fn asymmetric(alg: &CoreJwsSigningAlgorithm) -> bool {
    use CoreJwsSigningAlgorithm::*;
    matches!(
        alg,
        RsaSsaPkcs1V15Sha256
            | RsaSsaPkcs1V15Sha384
            | RsaSsaPkcs1V15Sha512
            | RsaSsaPssSha256
            | RsaSsaPssSha384
            | RsaSsaPssSha512
            | EcdsaP256Sha256
            | EcdsaP384Sha384
            | EcdsaP521Sha512
            | EdDsa
    )
}

impl Oidc {
    /// The relying party `settings` describe; `None` when it is off.
    pub fn new(settings: &OidcSettings) -> anyhow::Result<Option<Self>> {
        if !settings.enabled() {
            return Ok(None);
        }
        Ok(Some(Self {
            settings: settings.clone(),
            http: Http::new(settings.timeout)?,
            discovery: tokio::sync::Mutex::new(Discovery::Pending { failed_at: None }),
        }))
    }

    /// Whether JWT access tokens are accepted on the admin API.
    pub fn accepts_bearer_tokens(&self) -> bool {
        !self.settings.api_audience.is_empty()
    }

    /// How long a console session lasts.
    pub fn session_ttl(&self) -> Duration {
        self.settings.session_ttl
    }

    /// What a console session holds now: the roles today's `role_map`
    /// grants to the claim values it signed in with (`grants`, its row's
    /// JSON). A row without them (written before they were kept) or
    /// unreadable holds nothing, so its admin signs in again.
    pub fn session_roles(&self, grants: Option<&str>) -> Roles {
        let Some(grants) = grants.and_then(|g| serde_json::from_str::<Grants>(g).ok()) else {
            return Roles::NONE;
        };
        grants.roles_now(&self.settings.roles_claim, &self.settings.role_map)
    }

    /// Whether the console is reached over https (its `redirect_url` is).
    pub fn served_over_https(&self) -> bool {
        // Parsed, as start-up checked it: `HTTPS://…` or a value with a
        // leading space is https too (a prefix test left such a console's
        // cookies without `Secure`).
        url::Url::parse(self.settings.redirect_url.trim()).is_ok_and(|url| url.scheme() == "https")
    }

    /// What keys the console's cookies: the client secret, which every
    /// instance shares and only tollgate and the provider know.
    pub fn cookie_secret(&self) -> &[u8] {
        self.settings.client_secret.expose().as_bytes()
    }

    /// The provider, discovered now if not yet (at most one attempt per
    /// [`DISCOVERY_RETRY`] after a failure).
    async fn provider(&self) -> Result<Arc<Provider>, String> {
        let mut discovery = self.discovery.lock().await;
        if let Discovery::Found(provider) = &*discovery {
            return Ok(provider.clone());
        }
        if let Discovery::Pending {
            failed_at: Some(at),
        } = &*discovery
        {
            if at.elapsed() < DISCOVERY_RETRY {
                return Err(
                    "the identity provider could not be discovered; retrying shortly".into(),
                );
            }
        }
        match self.discover().await {
            Ok(provider) => {
                let provider = Arc::new(provider);
                *discovery = Discovery::Found(provider.clone());
                Ok(provider)
            }
            Err(error) => {
                tracing::warn!(%error, issuer = %self.settings.issuer_url, "OpenID Connect discovery failed");
                *discovery = Discovery::Pending {
                    failed_at: Some(Instant::now()),
                };
                Err(error)
            }
        }
    }

    /// Read the discovery document (its `issuer` must be the configured one,
    /// exactly) and fetch the keys.
    async fn discover(&self) -> Result<Provider, String> {
        let issuer = IssuerUrl::new(self.settings.issuer_url.clone()).map_err(|e| e.to_string())?;
        let url = issuer
            .join(".well-known/openid-configuration")
            .map_err(|e| e.to_string())?;
        let body = self
            .http
            .get(url.as_str())
            .await
            .map_err(|e| e.to_string())?;
        let metadata: CoreProviderMetadata =
            serde_json::from_slice(&body).map_err(|e| format!("discovery document: {e}"))?;
        if metadata.issuer() != &issuer {
            return Err(format!(
                "the discovery document names the issuer {:?}, not {:?}",
                metadata.issuer().as_str(),
                issuer.as_str()
            ));
        }
        let keys = KeyCache::new(metadata.jwks_uri().url().to_string(), self.http.clone());
        if keys.current().await.is_none() {
            return Err("the provider's keys could not be fetched".into());
        }
        let id_token_algs = metadata
            .id_token_signing_alg_values_supported()
            .iter()
            .filter(|alg| asymmetric(alg))
            .cloned()
            .collect();
        let redirect =
            RedirectUrl::new(self.settings.redirect_url.clone()).map_err(|e| e.to_string())?;
        let client = Client::from_provider_metadata(
            metadata,
            ClientId::new(self.settings.client_id.clone()),
            Some(ClientSecret::new(
                self.settings.client_secret.expose().to_string(),
            )),
        )
        .set_redirect_uri(redirect);
        Ok(Provider {
            client,
            issuer,
            keys,
            id_token_algs,
        })
    }

    /// The admin a JWT access token names, checked against the provider's
    /// keys (fetched again, within `jwks`' limits, for an unknown key id).
    pub async fn verify_bearer(&self, token: &str) -> Result<Identity, BearerError> {
        // A malformed token is refused before the provider is asked anything.
        let kid = access_token::kid(token)?;
        let provider = self
            .provider()
            .await
            .map_err(|_| BearerError::Unavailable)?;
        let mut keys = provider
            .keys
            .current()
            .await
            .ok_or(BearerError::Unavailable)?;
        if let Some(kid) = kid.as_deref().filter(|k| !keys.has_kid(k)) {
            keys = provider
                .keys
                .with_kid(kid)
                .await
                .ok_or(BearerError::Unavailable)?;
        }
        let claims = access_token::verify(
            token,
            &keys.jwt,
            provider.issuer.as_str(),
            &self.settings.api_audience,
        )?;
        let found = claims::identity(&claims, &self.settings.roles_claim, &self.settings.role_map)
            .ok_or(BearerError::NoRole)?;
        if found.roles.is_empty() {
            return Err(BearerError::NoRole);
        }
        Ok(found)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::settings::Secret;

    fn pending(started: i64) -> PendingLogin {
        PendingLogin {
            state: "s".repeat(43),
            nonce: "n".into(),
            verifier: "v".into(),
            return_to: "/admin".into(),
            started,
        }
    }

    /// A callback on an instance whose clock is a little behind the one
    /// that started the sign-in still answers it; a stale or far-future
    /// start does not.
    #[test]
    fn a_sign_in_started_a_little_ahead_is_fresh() {
        let state = "s".repeat(43);
        let now = now_secs();
        for (started, fresh) in [
            (now, true),
            (now + 1, true),
            (now + CLOCK_SKEW_SECS - 5, true),
            (now + CLOCK_SKEW_SECS + 5, false),
            (now - LOGIN_TTL.as_secs() as i64 + 5, true),
            (now - LOGIN_TTL.as_secs() as i64 - 5, false),
        ] {
            assert_eq!(
                pending(started).answered_by(&state),
                fresh,
                "{}",
                started - now
            );
        }
        assert!(!pending(now).answered_by("another state"));
    }

    /// `redirect_url` is judged as parsed, as start-up checked it.
    #[test]
    fn a_console_is_https_by_its_parsed_redirect_url() {
        for (url, https) in [
            ("https://tollgate.example.com/admin/oidc/callback", true),
            ("HTTPS://tollgate.example.com/admin/oidc/callback", true),
            (" https://tollgate.example.com/admin/oidc/callback", true),
            ("http://127.0.0.1:8080/admin/oidc/callback", false),
        ] {
            let settings = OidcSettings {
                issuer_url: "https://sso.example.com".into(),
                client_id: "tollgate".into(),
                client_secret: Secret::new("s".repeat(32)),
                redirect_url: url.into(),
                ..OidcSettings::default()
            };
            let oidc = Oidc::new(&settings).expect("built").expect("on");
            assert_eq!(oidc.served_over_https(), https, "{url:?}");
        }
    }
}
