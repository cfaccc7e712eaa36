//! Captcha checks: either the caller vouches (`kind = "none"`) or tollgate asks
//! the provider's siteverify endpoint about the token.

use std::time::Duration;

use serde::Deserialize;

use crate::settings::{CaptchaKind, CaptchaSettings};

/// What a request brought as proof of a solved captcha.
#[derive(Debug, Clone, Default)]
pub struct CaptchaProof {
    pub token: Option<String>,
    pub passed: Option<bool>,
}

pub struct CaptchaVerifier {
    kind: CaptchaKind,
    secret: String,
    verify_url: String,
    http: reqwest::Client,
}

#[derive(Deserialize)]
struct SiteverifyAnswer {
    success: bool,
}

impl CaptchaVerifier {
    pub fn new(settings: &CaptchaSettings) -> Result<Self, reqwest::Error> {
        let default_url = match settings.kind {
            CaptchaKind::None => "",
            CaptchaKind::Turnstile => "https://challenges.cloudflare.com/turnstile/v0/siteverify",
            CaptchaKind::Hcaptcha => "https://api.hcaptcha.com/siteverify",
            CaptchaKind::Recaptcha => "https://www.google.com/recaptcha/api/siteverify",
        };
        let verify_url = if settings.verify_url.is_empty() {
            default_url.to_string()
        } else {
            settings.verify_url.clone()
        };
        Ok(Self {
            kind: settings.kind,
            secret: settings.secret.expose().to_string(),
            verify_url,
            http: reqwest::Client::builder()
                .timeout(Duration::from_secs(5))
                .build()?,
        })
    }

    /// Whether the proof counts. `passed: true` counts only with `kind = "none"`;
    /// with a provider only a token it confirms counts. Provider failures count
    /// as not passed.
    pub async fn passed(&self, proof: &CaptchaProof, client_ip: Option<&str>) -> bool {
        if self.kind == CaptchaKind::None {
            return proof.passed == Some(true);
        }
        let Some(token) = proof.token.as_deref().filter(|t| !t.is_empty()) else {
            return false;
        };
        let mut form = vec![("secret", self.secret.as_str()), ("response", token)];
        if let Some(ip) = client_ip {
            form.push(("remoteip", ip));
        }
        let answer = self.http.post(&self.verify_url).form(&form).send().await;
        match answer {
            Ok(response) if response.status().is_success() => {
                match response.json::<SiteverifyAnswer>().await {
                    Ok(answer) => answer.success,
                    Err(e) => {
                        tracing::warn!(error = %e, "captcha siteverify answered unreadable JSON");
                        false
                    }
                }
            }
            Ok(response) => {
                tracing::warn!(status = %response.status(), "captcha siteverify refused the call");
                false
            }
            Err(e) => {
                tracing::warn!(error = %e, "captcha siteverify unreachable");
                false
            }
        }
    }
}
