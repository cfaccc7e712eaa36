//! JWT access tokens from the provider, as the admin API's bearer
//! credential (RFC 9068): signed by one of the provider's keys with an
//! asymmetric algorithm, issued by the configured issuer for
//! `admin.oidc.api_audience`, not expired and not before its `nbf` (60 s of
//! clock skew allowed).
//!
//! What is refused, and why: `alg: none` and unknown algorithms (the header
//! does not parse); HMAC algorithms (`HS256` "signed" with the provider's
//! public key is the classic forgery); a key whose own `alg` differs from
//! the header's, or of another family; a symmetric (`oct`) key in the set.

use jsonwebtoken::jwk::{AlgorithmParameters, Jwk};
use jsonwebtoken::{Algorithm, DecodingKey, Validation};
use serde_json::{Map, Value};

/// The algorithms a provider's access tokens may use: asymmetric only.
const ASYMMETRIC: [Algorithm; 9] = [
    Algorithm::RS256,
    Algorithm::RS384,
    Algorithm::RS512,
    Algorithm::PS256,
    Algorithm::PS384,
    Algorithm::PS512,
    Algorithm::ES256,
    Algorithm::ES384,
    Algorithm::EdDSA,
];

/// Clock skew allowed on `exp` and `nbf`, in seconds.
const LEEWAY_SECS: u64 = super::CLOCK_SKEW_SECS.unsigned_abs();

/// Why an access token was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TokenError {
    /// Not a JWS, or its header names `none` or an algorithm not known.
    #[error("malformed token or unsupported algorithm")]
    Malformed,
    /// An algorithm tollgate does not accept for access tokens (HMAC).
    #[error("algorithm {0:?} is not accepted")]
    Algorithm(Algorithm),
    /// No key of the provider has the token's key id.
    #[error("unknown key id")]
    UnknownKid(String),
    /// The key does not fit the algorithm, or is symmetric.
    #[error("the key does not fit the token's algorithm")]
    KeyMismatch,
    /// Signature, issuer, audience, expiry or another claim is wrong.
    #[error("{0}")]
    Invalid(String),
}

/// The key id a token's header names, if it parses: to know whether the
/// held keys can check it before checking.
pub fn kid(token: &str) -> Result<Option<String>, TokenError> {
    jsonwebtoken::decode_header(token)
        .map(|h| h.kid)
        .map_err(|_| TokenError::Malformed)
}

fn key_for<'a>(
    keys: &'a jsonwebtoken::jwk::JwkSet,
    kid: Option<&str>,
) -> Result<&'a Jwk, TokenError> {
    match kid {
        Some(kid) => keys
            .find(kid)
            .ok_or_else(|| TokenError::UnknownKid(kid.to_string())),
        // Without a key id, only a set of one key says which.
        None => match keys.keys.as_slice() {
            [only] => Ok(only),
            _ => Err(TokenError::UnknownKid(String::new())),
        },
    }
}

/// The verified claims of `token`.
pub fn verify(
    token: &str,
    keys: &jsonwebtoken::jwk::JwkSet,
    issuer: &str,
    audience: &str,
) -> Result<Map<String, Value>, TokenError> {
    let header = jsonwebtoken::decode_header(token).map_err(|_| TokenError::Malformed)?;
    if !ASYMMETRIC.contains(&header.alg) {
        return Err(TokenError::Algorithm(header.alg));
    }
    let jwk = key_for(keys, header.kid.as_deref())?;
    if matches!(jwk.algorithm, AlgorithmParameters::OctetKey(_)) {
        return Err(TokenError::KeyMismatch);
    }
    if let Some(key_alg) = jwk.common.key_algorithm {
        if key_alg.to_string() != format!("{:?}", header.alg) {
            return Err(TokenError::KeyMismatch);
        }
    }
    let key = DecodingKey::from_jwk(jwk).map_err(|_| TokenError::KeyMismatch)?;
    let mut validation = Validation::new(header.alg);
    validation.leeway = LEEWAY_SECS;
    // Off by default in jsonwebtoken: a token issued for later is refused
    // until then.
    validation.validate_nbf = true;
    validation.set_issuer(&[issuer]);
    validation.set_audience(&[audience]);
    validation.set_required_spec_claims(&["exp", "iss", "aud", "sub"]);
    jsonwebtoken::decode::<Map<String, Value>>(token, &key, &validation)
        .map(|data| data.claims)
        .map_err(|e| match e.kind() {
            jsonwebtoken::errors::ErrorKind::InvalidAlgorithm => TokenError::KeyMismatch,
            _ => TokenError::Invalid(e.to_string()),
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use base64::Engine as _;

    fn b64(json: &str) -> String {
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(json)
    }

    #[test]
    fn none_and_hmac_tokens_are_refused_before_any_key_is_looked_at() {
        let keys = jsonwebtoken::jwk::JwkSet { keys: Vec::new() };
        let claims = b64(r#"{"sub":"x","iss":"i","aud":"a","exp":9999999999}"#);
        let none = format!("{}.{claims}.", b64(r#"{"alg":"none"}"#));
        assert_eq!(verify(&none, &keys, "i", "a"), Err(TokenError::Malformed));
        let hs = format!("{}.{claims}.c2ln", b64(r#"{"alg":"HS256","kid":"k"}"#));
        assert_eq!(
            verify(&hs, &keys, "i", "a"),
            Err(TokenError::Algorithm(Algorithm::HS256))
        );
        let rs = format!("{}.{claims}.c2ln", b64(r#"{"alg":"RS256","kid":"k"}"#));
        assert_eq!(
            verify(&rs, &keys, "i", "a"),
            Err(TokenError::UnknownKid("k".into()))
        );
        assert_eq!(kid(&rs), Ok(Some("k".into())));
        for garbage in ["", "a.b", "x.y.z", "..."] {
            assert_eq!(
                verify(garbage, &keys, "i", "a"),
                Err(TokenError::Malformed),
                "{garbage}"
            );
        }
    }
}
