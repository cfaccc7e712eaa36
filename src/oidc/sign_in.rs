//! The console's sign-in: the authorization code flow with PKCE, from the
//! redirect to the provider to the checked ID token.

use openidconnect::core::{
    CoreAuthenticationFlow, CoreGenderClaim, CoreJweContentEncryptionAlgorithm,
    CoreJwsSigningAlgorithm,
};
use openidconnect::{
    AuthorizationCode, ClientId, CsrfToken, IdTokenVerifier, Nonce, PkceCodeChallenge,
    PkceCodeVerifier, Scope,
};
use serde_json::{Map, Value};

use super::{
    access_token, claims, now_secs, Identity, Oidc, OtherClaims, PendingLogin, Provider,
    SignInError,
};

impl Oidc {
    /// Start a sign-in: where to send the browser, and what it must bring
    /// back. `return_to` is a console path.
    pub async fn begin(&self, return_to: &str) -> Result<(String, PendingLogin), SignInError> {
        let provider = self.provider().await.map_err(SignInError::Provider)?;
        let (challenge, verifier) = PkceCodeChallenge::new_random_sha256();
        let mut request = provider
            .client
            .authorize_url(
                CoreAuthenticationFlow::AuthorizationCode,
                CsrfToken::new_random,
                Nonce::new_random,
            )
            .set_pkce_challenge(challenge);
        for scope in self.settings.scopes.iter().filter(|s| *s != "openid") {
            request = request.add_scope(Scope::new(scope.clone()));
        }
        let (url, state, nonce) = request.url();
        let pending = PendingLogin {
            state: state.secret().clone(),
            nonce: nonce.secret().clone(),
            verifier: verifier.secret().clone(),
            return_to: return_to.to_string(),
            started: now_secs(),
        };
        Ok((url.to_string(), pending))
    }

    /// Finish a sign-in: the callback's `state` must be the pending one's,
    /// the code is exchanged (with the PKCE verifier), and the ID token
    /// checked (signature with the provider's keys, issuer, audience,
    /// expiry, nonce).
    pub async fn finish(
        &self,
        pending: &PendingLogin,
        state: &str,
        code: &str,
    ) -> Result<Identity, SignInError> {
        if !pending.answered_by(state) || code.is_empty() {
            return Err(SignInError::InvalidCallback);
        }
        let provider = self.provider().await.map_err(SignInError::Provider)?;
        let exchange = provider
            .client
            .exchange_code(AuthorizationCode::new(code.to_string()))
            .map_err(|e| SignInError::Provider(e.to_string()))?
            .set_pkce_verifier(PkceCodeVerifier::new(pending.verifier.clone()));
        let response = exchange
            .request_async(&self.http)
            .await
            .map_err(|e| SignInError::Provider(format!("the code was not accepted: {e}")))?;
        let id_token = openidconnect::TokenResponse::id_token(&response)
            .ok_or_else(|| SignInError::IdToken("the provider sent none".into()))?;
        let nonce = Nonce::new(pending.nonce.clone());
        let claims = self.id_token_claims(&provider, id_token, &nonce).await?;
        let found = claims::identity(&claims, &self.settings.roles_claim, &self.settings.role_map)
            .ok_or_else(|| SignInError::IdToken("it names no subject".into()))?;
        if found.roles.is_empty() {
            return Err(SignInError::NoRole(found.actor.to_string()));
        }
        Ok(found)
    }

    /// The ID token's verified claims, every one of them. A key id the held
    /// keys lack fetches them again (within `jwks`' limits) and tries once
    /// more.
    async fn id_token_claims(
        &self,
        provider: &Provider,
        id_token: &openidconnect::IdToken<
            OtherClaims,
            CoreGenderClaim,
            CoreJweContentEncryptionAlgorithm,
            CoreJwsSigningAlgorithm,
        >,
        nonce: &Nonce,
    ) -> Result<Map<String, Value>, SignInError> {
        let unavailable = || SignInError::Provider("its keys could not be fetched".into());
        let mut keys = provider.keys.current().await.ok_or_else(unavailable)?;
        for attempt in 0..2 {
            let verifier = IdTokenVerifier::new_public_client(
                ClientId::new(self.settings.client_id.clone()),
                provider.issuer.clone(),
                keys.oidc.clone(),
            )
            .set_allowed_algs(provider.id_token_algs.clone());
            match id_token.claims(&verifier, nonce) {
                Ok(claims) => {
                    return match serde_json::to_value(claims) {
                        Ok(Value::Object(map)) => Ok(map),
                        _ => Err(SignInError::IdToken("its claims cannot be read".into())),
                    };
                }
                Err(openidconnect::ClaimsVerificationError::SignatureVerification(
                    openidconnect::SignatureVerificationError::NoMatchingKey,
                )) if attempt == 0 => {
                    let kid = access_token::kid(&id_token.to_string()).ok().flatten();
                    keys = provider
                        .keys
                        .with_kid(kid.as_deref().unwrap_or(""))
                        .await
                        .ok_or_else(unavailable)?;
                }
                Err(e) => return Err(SignInError::IdToken(e.to_string())),
            }
        }
        Err(SignInError::IdToken(
            "no key of the provider checks its signature".into(),
        ))
    }
}
