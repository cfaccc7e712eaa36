//! Captcha checks: either the caller vouches (`kind = "none"`) or tollgate asks
//! the provider's siteverify endpoint about the token.

use std::time::{Duration, Instant};

use crate::domain::Action;
use crate::settings::{CaptchaKind, CaptchaSettings};

mod answer;
mod pause;

use answer::{Expected, SiteverifyAnswer};
pub use pause::ProviderPause;

/// What a request brought as proof of a solved captcha.
#[derive(Debug, Clone, Default)]
pub struct CaptchaProof {
    /// `captcha_token`: a token for the provider to confirm.
    pub token: Option<String>,
    /// `captcha_passed`: the caller's word, trusted only with `captcha.kind = "none"`.
    pub passed: Option<bool>,
}

impl CaptchaProof {
    /// Whether the request brought any proof: most bring none, and then
    /// there is nothing to check (not even a future to build).
    pub fn offered(&self) -> bool {
        self.token.is_some() || self.passed.is_some()
    }
}

/// Decides whether a captcha proof counts, as `[captcha]` says.
pub struct CaptchaVerifier {
    kind: CaptchaKind,
    secret: String,
    verify_url: String,
    timeout: Duration,
    expected: Expected,
    /// Names the provider's address and secret to its pause.
    fingerprint: u64,
    http: reqwest::Client,
}

/// The siteverify address of each provider, used when `captcha.verify_url` is empty.
pub fn default_verify_url(kind: CaptchaKind) -> &'static str {
    match kind {
        CaptchaKind::None => "",
        CaptchaKind::Turnstile => "https://challenges.cloudflare.com/turnstile/v0/siteverify",
        CaptchaKind::Hcaptcha => "https://api.hcaptcha.com/siteverify",
        CaptchaKind::Recaptcha => "https://www.google.com/recaptcha/api/siteverify",
    }
}

impl CaptchaVerifier {
    /// Builds the siteverify client: `captcha.timeout` per call, no redirects.
    pub fn new(settings: &CaptchaSettings) -> Result<Self, reqwest::Error> {
        let verify_url = if settings.verify_url.is_empty() {
            default_verify_url(settings.kind).to_string()
        } else {
            settings.verify_url.expose().to_string()
        };
        let provider = fingerprint(&verify_url, settings.secret.expose());
        Ok(Self {
            kind: settings.kind,
            secret: settings.secret.expose().to_string(),
            verify_url,
            timeout: settings.timeout,
            expected: Expected::new(settings),
            fingerprint: provider,
            http: reqwest::Client::builder()
                .timeout(settings.timeout)
                .connect_timeout(settings.timeout)
                .redirect(reqwest::redirect::Policy::none())
                .user_agent(concat!("tollgate/", env!("CARGO_PKG_VERSION")))
                .build()?,
        })
    }

    /// Whether tokens go to a provider at all (`kind` is not `none`).
    pub fn checks_tokens(&self) -> bool {
        self.kind != CaptchaKind::None
    }

    /// Upper bound of one siteverify call (`captcha.timeout`).
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// Whether checking `proof` means a call to the provider (a non-empty
    /// token, with a provider configured); `kind = "none"` decides locally.
    pub fn asks_provider(&self, proof: &CaptchaProof) -> bool {
        self.kind != CaptchaKind::None && proof.token.as_deref().is_some_and(|t| !t.is_empty())
    }

    /// Whether the proof's token is longer than the provider makes one: no
    /// such token was ever made, so it is refused without a call, as the
    /// provider would refuse it (a made-up one costs a call no more than a
    /// refused one does).
    pub fn too_long(&self, proof: &CaptchaProof) -> bool {
        let length = proof.token.as_deref().map_or(0, str::len);
        longest_token(self.kind).is_some_and(|most| length > most)
    }

    /// Whether the proof counts, without a call: `passed: true` with
    /// `kind = "none"`. A token is for [`Self::ask_provider`].
    pub fn vouched(&self, proof: &CaptchaProof) -> bool {
        self.kind == CaptchaKind::None && proof.passed == Some(true)
    }

    /// What the provider says of the proof's token, offered for `action`'s
    /// route (not asked, and `Refused`, when there is none). A provider
    /// that cannot be read or reached, or that is down or throttling, is
    /// `Unanswered`: the token counts as not passed, but it is not the
    /// sender's doing. While `pause` says the provider throttles, it is not
    /// asked.
    pub async fn ask_provider(
        &self,
        proof: &CaptchaProof,
        action: Action,
        client_ip: Option<&str>,
        pause: &ProviderPause,
    ) -> TokenVerdict {
        let Some(token) = proof.token.as_deref().filter(|t| !t.is_empty()) else {
            return TokenVerdict::Refused;
        };
        // Stamped before the pause is read: a 429 that starts a pause after
        // this look then counts this call as one that raced it.
        let sent = Instant::now();
        if pause.paused(self.fingerprint) {
            crate::metrics::captcha_check("paused");
            return TokenVerdict::Unanswered;
        }
        // The metric's outcome, where it is not the verdict's own.
        let mut outcome = None;
        let mut form = vec![("secret", self.secret.as_str()), ("response", token)];
        if let Some(ip) = client_ip {
            form.push(("remoteip", ip));
        }
        let answer = self.http.post(&self.verify_url).form(&form).send().await;
        if let Ok(response) = &answer {
            if response.status() != reqwest::StatusCode::TOO_MANY_REQUESTS {
                pause.answered(self.fingerprint, sent, response.status().as_u16());
            }
        }
        let verdict = match answer {
            Ok(response) if response.status().is_success() => {
                let (verdict, own_outcome) = self.read_answer(response, action).await;
                outcome = own_outcome;
                verdict
            }
            Ok(response) if response.status() == reqwest::StatusCode::TOO_MANY_REQUESTS => {
                if let Some(length) =
                    pause.throttled(self.fingerprint, sent, pause::retry_after(&response))
                {
                    tracing::warn!(request_id = %crate::telemetry::request_id(), pause_ms = length.as_millis() as u64, "captcha siteverify is throttling this secret: not asked until the pause ends");
                }
                TokenVerdict::Unanswered
            }
            Ok(response) if refuses_the_request(response.status()) => {
                let status = response.status();
                // Read as any JSON: a refusal's body may carry its error
                // codes without `success`.
                let blamed: Vec<String> = crate::answer_body::json::<serde_json::Value>(response)
                    .await
                    .ok()
                    .and_then(|body| body.get("error-codes").and_then(|c| c.as_array()).cloned())
                    .unwrap_or_default()
                    .iter()
                    .filter_map(|c| c.as_str().map(str::to_string))
                    .collect();
                if blamed.iter().any(|c| blames_the_secret(c)) {
                    tracing::warn!(request_id = %crate::telemetry::request_id(), %status, errors = ?blamed, "captcha siteverify refused the call, not the token: check captcha.secret");
                    TokenVerdict::Unanswered
                } else {
                    tracing::info!(request_id = %crate::telemetry::request_id(), %status, "captcha siteverify refused the token's request");
                    TokenVerdict::Refused
                }
            }
            Ok(response) => {
                tracing::warn!(request_id = %crate::telemetry::request_id(), status = %response.status(), "captcha siteverify refused the call");
                TokenVerdict::Unanswered
            }
            Err(e) if e.is_timeout() => {
                tracing::warn!(
                    request_id = %crate::telemetry::request_id(),
                    timeout_ms = self.timeout.as_millis() as u64,
                    "captcha siteverify timed out"
                );
                TokenVerdict::Unanswered
            }
            Err(e) => {
                // Without the URL: `captcha.verify_url` may carry a password.
                tracing::warn!(request_id = %crate::telemetry::request_id(), error = %e.without_url(), "captcha siteverify unreachable");
                TokenVerdict::Unanswered
            }
        };
        crate::metrics::captcha_check(outcome.unwrap_or(verdict.as_str()));
        verdict
    }

    /// The verdict of a 2xx answer, and the metric's outcome where it is
    /// not the verdict's own (`mismatched`).
    async fn read_answer(
        &self,
        response: reqwest::Response,
        action: Action,
    ) -> (TokenVerdict, Option<&'static str>) {
        let answer = match crate::answer_body::json::<SiteverifyAnswer>(response).await {
            Ok(answer) => answer,
            Err(e) => {
                tracing::warn!(request_id = %crate::telemetry::request_id(), error = %e, "captcha siteverify's answer cannot be read");
                return (TokenVerdict::Unanswered, None);
            }
        };
        if answer.success {
            return match self.expected.check(&answer, action) {
                Ok(()) => (TokenVerdict::Passed, None),
                Err(mismatch) => {
                    if mismatch.may_be_the_settings() {
                        tracing::warn!(request_id = %crate::telemetry::request_id(), kind = ?self.kind, action = action.as_str(), ?mismatch, "captcha token passed, but not on captcha.hostnames or the route's actions: a token from elsewhere, or a list to mend");
                    } else {
                        tracing::info!(request_id = %crate::telemetry::request_id(), kind = ?self.kind, ?mismatch, "captcha token passed with a score below captcha.min_score");
                    }
                    (TokenVerdict::Refused, Some("mismatched"))
                }
            };
        }
        if answer.error_codes.iter().any(|c| not_the_tokens(c)) {
            tracing::warn!(request_id = %crate::telemetry::request_id(), kind = ?self.kind, errors = ?answer.error_codes, "captcha siteverify refused the call, not the token: check captcha.secret");
            return (TokenVerdict::Unanswered, None);
        }
        tracing::info!(request_id = %crate::telemetry::request_id(), kind = ?self.kind, errors = ?answer.error_codes, "captcha token not accepted");
        (TokenVerdict::Refused, None)
    }
}

/// Tells one provider account from another: a pause is the address's and
/// secret's, kept in this process only.
fn fingerprint(verify_url: &str, secret: &str) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    (verify_url, secret).hash(&mut hasher);
    hasher.finish()
}

/// The longest token a provider makes, where it says: Turnstile's are at
/// most 2048 characters. hCaptcha and reCAPTCHA give no bound (hCaptcha's
/// have been seen past 2000), so theirs are bounded by the body's 16 KiB.
fn longest_token(kind: CaptchaKind) -> Option<usize> {
    (kind == CaptchaKind::Turnstile).then_some(2048)
}

/// A status by which the provider refused what the token made of the call:
/// a bad request, or one too large (a token too long). Counted as a
/// refused token, or such a token would cost calls without end, unless its
/// body's error codes blame the secret ([`blames_the_secret`]). Not 401,
/// 403, 404 or 405 (a proxy or address set up wrong), nor 408 or 429: no
/// one's token is at fault there.
fn refuses_the_request(status: reqwest::StatusCode) -> bool {
    matches!(status.as_u16(), 400 | 413 | 414 | 422)
}

/// An error code that blames the secret or the provider, not the token
/// (the three providers' names): counting it against the sender's address
/// would lock every address out after a rotated or mistyped secret.
fn not_the_tokens(code: &str) -> bool {
    blames_the_secret(code) || matches!(code, "bad-request" | "internal-error")
}

/// An error code that names the secret or the keys: even on a 400 (as a
/// provider may answer a rotated secret), no sender's token is at fault.
fn blames_the_secret(code: &str) -> bool {
    code.contains("secret") || matches!(code, "invalid-keys" | "sitekey-secret-mismatch")
}

/// The provider's word on one token.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TokenVerdict {
    /// `success: true`.
    Passed,
    /// `success: false` for the token (a wrong, expired or reused one), or
    /// 400, 413, 414, 422; or `success: true` with a score, hostname or
    /// action other than `[captcha]` expects.
    Refused,
    /// No answer that blames the token: timed out, unreachable, another
    /// status, a body that is not siteverify's, an error code that blames
    /// the secret.
    Unanswered,
}

impl TokenVerdict {
    /// The metric's `outcome` label.
    pub fn as_str(self) -> &'static str {
        match self {
            TokenVerdict::Passed => "passed",
            TokenVerdict::Refused => "refused",
            TokenVerdict::Unanswered => "unanswered",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_provider_has_its_documented_siteverify_address() {
        assert_eq!(
            default_verify_url(CaptchaKind::Turnstile),
            "https://challenges.cloudflare.com/turnstile/v0/siteverify"
        );
        assert_eq!(
            default_verify_url(CaptchaKind::Hcaptcha),
            "https://api.hcaptcha.com/siteverify"
        );
        assert_eq!(
            default_verify_url(CaptchaKind::Recaptcha),
            "https://www.google.com/recaptcha/api/siteverify"
        );
    }

    #[test]
    fn a_bad_or_too_large_request_refuses_the_token() {
        use reqwest::StatusCode;
        for status in [400, 413, 414, 422] {
            assert!(
                refuses_the_request(StatusCode::from_u16(status).unwrap()),
                "{status}"
            );
        }
        for status in [200, 301, 401, 403, 404, 405, 408, 429, 500, 503] {
            assert!(
                !refuses_the_request(StatusCode::from_u16(status).unwrap()),
                "{status}"
            );
        }
    }

    #[test]
    fn a_secret_the_provider_refuses_is_not_the_tokens_fault() {
        for code in [
            "missing-input-secret",
            "invalid-input-secret",
            "invalid-parsed-secret",
            "sitekey-secret-mismatch",
            "internal-error",
        ] {
            assert!(not_the_tokens(code), "{code}");
        }
        for code in [
            "invalid-input-response",
            "timeout-or-duplicate",
            "missing-input-response",
            "invalid-or-already-seen-response",
        ] {
            assert!(!not_the_tokens(code), "{code}");
        }
    }
}
