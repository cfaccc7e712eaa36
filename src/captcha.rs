//! Captcha checks: either the caller vouches (`kind = "none"`) or tollgate asks
//! the provider's siteverify endpoint about the token.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use serde::Deserialize;

use crate::settings::{CaptchaKind, CaptchaSettings};

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
    pause: Mutex<Pause>,
    http: reqwest::Client,
}

/// While the provider throttles (429), tokens are not sent to it: each call
/// it refuses that way would keep its throttle on (it counts per secret),
/// and one address could keep it on at no cost (a 429 is no one's refused
/// token). A token meanwhile is `Unanswered`, as it would be answered.
#[derive(Debug, Default)]
struct Pause {
    until: Option<Instant>,
    /// 429s in a row, each pause twice the last without a `Retry-After`.
    streak: u32,
}

/// The longest pause, whatever `Retry-After` asks: a person waits for it.
const MAX_PAUSE: Duration = Duration::from_secs(30);

/// How long to leave the provider alone after the `streak`th 429 in a row:
/// its `Retry-After` if it gave one, else 1 s, 2 s, 4 s, …; at most
/// `MAX_PAUSE`.
fn pause_after(streak: u32, retry_after: Option<Duration>) -> Duration {
    let doubling = Duration::from_secs(1u64 << streak.saturating_sub(1).min(5));
    retry_after.unwrap_or(doubling).min(MAX_PAUSE)
}

/// `Retry-After` in whole seconds (the HTTP-date form is not read).
fn retry_after(response: &reqwest::Response) -> Option<Duration> {
    let value = response.headers().get(reqwest::header::RETRY_AFTER)?;
    let secs: u64 = value.to_str().ok()?.trim().parse().ok()?;
    Some(Duration::from_secs(secs))
}

/// All three providers answer `{"success": bool, "error-codes": [...], ...}`;
/// the other fields are each provider's own, and read only as `Expected` says.
#[derive(Deserialize)]
struct SiteverifyAnswer {
    success: bool,
    #[serde(rename = "error-codes", default)]
    error_codes: Vec<String>,
    /// reCAPTCHA v3's score; hCaptcha Enterprise's risk score has the same
    /// name and the opposite sense, so it is read only for reCAPTCHA.
    #[serde(default)]
    score: Option<f64>,
    #[serde(default)]
    hostname: Option<String>,
    #[serde(default)]
    action: Option<String>,
}

/// What a passed token's answer must also say (`captcha.min_score`,
/// `hostnames`, `actions`): a solved captcha proves a person only on the
/// operator's site, in the operator's flow, and, for reCAPTCHA v3, with a
/// score above the line; v3 answers `success` for every bot.
#[derive(Debug, Default)]
struct Expected {
    /// Only for `kind = "recaptcha"`; `None` reads no score.
    min_score: Option<f64>,
    /// Compared without case; empty takes any.
    hostnames: Vec<String>,
    /// Empty takes any.
    actions: Vec<String>,
}

/// Why a token the provider passed is refused all the same.
#[derive(Debug, PartialEq)]
enum Mismatch {
    Score(f64),
    Hostname(Option<String>),
    Action(Option<String>),
}

impl Expected {
    fn new(settings: &CaptchaSettings) -> Self {
        Self {
            min_score: (settings.kind == CaptchaKind::Recaptcha && settings.min_score.get() > 0.0)
                .then(|| settings.min_score.get()),
            hostnames: settings.hostnames.clone(),
            actions: settings.actions.clone(),
        }
    }

    /// Whether a `success: true` answer is also one this site asked for. An
    /// answer that leaves out a field being checked fails it: a v2 key
    /// names no action, an Android one no hostname.
    fn check(&self, answer: &SiteverifyAnswer) -> Result<(), Mismatch> {
        if let (Some(min), Some(score)) = (self.min_score, answer.score) {
            if score < min {
                return Err(Mismatch::Score(score));
            }
        }
        if !self.hostnames.is_empty() {
            let known = answer
                .hostname
                .as_deref()
                .is_some_and(|h| self.hostnames.iter().any(|e| e.eq_ignore_ascii_case(h)));
            if !known {
                return Err(Mismatch::Hostname(answer.hostname.clone()));
            }
        }
        if !self.actions.is_empty() {
            let known = answer
                .action
                .as_deref()
                .is_some_and(|a| self.actions.iter().any(|e| e == a));
            if !known {
                return Err(Mismatch::Action(answer.action.clone()));
            }
        }
        Ok(())
    }
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
        Ok(Self {
            kind: settings.kind,
            secret: settings.secret.expose().to_string(),
            verify_url,
            timeout: settings.timeout,
            expected: Expected::new(settings),
            pause: Mutex::default(),
            http: reqwest::Client::builder()
                .timeout(settings.timeout)
                .connect_timeout(settings.timeout)
                .redirect(reqwest::redirect::Policy::none())
                .user_agent(concat!("tollgate/", env!("CARGO_PKG_VERSION")))
                .build()?,
        })
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

    /// Whether the proof counts, without a call: `passed: true` with
    /// `kind = "none"`. A token is for [`Self::ask_provider`].
    pub fn vouched(&self, proof: &CaptchaProof) -> bool {
        self.kind == CaptchaKind::None && proof.passed == Some(true)
    }

    /// What the provider says of the proof's token (not asked, and
    /// `Refused`, when there is none). A provider that cannot be read or
    /// reached, or that is down or throttling, is `Unanswered`: the token
    /// counts as not passed, but it is not the sender's doing.
    pub async fn ask_provider(
        &self,
        proof: &CaptchaProof,
        client_ip: Option<&str>,
    ) -> TokenVerdict {
        let Some(token) = proof.token.as_deref().filter(|t| !t.is_empty()) else {
            return TokenVerdict::Refused;
        };
        if self.paused() {
            crate::metrics::captcha_check("paused");
            return TokenVerdict::Unanswered;
        }
        let mut form = vec![("secret", self.secret.as_str()), ("response", token)];
        if let Some(ip) = client_ip {
            form.push(("remoteip", ip));
        }
        let answer = self.http.post(&self.verify_url).form(&form).send().await;
        let answer_status = answer.as_ref().ok().map(|r| r.status().as_u16());
        let verdict = match answer {
            Ok(response) if response.status().is_success() => {
                match crate::answer_body::json::<SiteverifyAnswer>(response).await {
                    Ok(answer) if answer.success => match self.expected.check(&answer) {
                        Ok(()) => TokenVerdict::Passed,
                        Err(mismatch) => {
                            tracing::info!(request_id = %crate::telemetry::request_id(), kind = ?self.kind, ?mismatch, "captcha token passed, but not as captcha.min_score, hostnames or actions ask");
                            TokenVerdict::Refused
                        }
                    },
                    Ok(answer) if answer.error_codes.iter().any(|c| not_the_tokens(c)) => {
                        tracing::warn!(request_id = %crate::telemetry::request_id(), kind = ?self.kind, errors = ?answer.error_codes, "captcha siteverify refused the call, not the token: check captcha.secret");
                        TokenVerdict::Unanswered
                    }
                    Ok(answer) => {
                        tracing::info!(request_id = %crate::telemetry::request_id(), kind = ?self.kind, errors = ?answer.error_codes, "captcha token not accepted");
                        TokenVerdict::Refused
                    }
                    Err(e) => {
                        tracing::warn!(request_id = %crate::telemetry::request_id(), error = %e, "captcha siteverify's answer cannot be read");
                        TokenVerdict::Unanswered
                    }
                }
            }
            Ok(response) if response.status() == reqwest::StatusCode::TOO_MANY_REQUESTS => {
                let pause = self.pause_for(retry_after(&response));
                tracing::warn!(request_id = %crate::telemetry::request_id(), pause_ms = pause.as_millis() as u64, "captcha siteverify is throttling this secret: not asked until the pause ends");
                TokenVerdict::Unanswered
            }
            Ok(response) if refuses_the_request(response.status()) => {
                tracing::info!(request_id = %crate::telemetry::request_id(), status = %response.status(), "captcha siteverify refused the token's request");
                TokenVerdict::Refused
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
        if !matches!(answer_status, Some(429)) {
            self.lock_pause().streak = 0;
        }
        crate::metrics::captcha_check(verdict.as_str());
        verdict
    }

    fn lock_pause(&self) -> std::sync::MutexGuard<'_, Pause> {
        // A panic elsewhere while it was held leaves two plain fields.
        self.pause.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether the provider asked to be left alone until later than now.
    fn paused(&self) -> bool {
        let pause = self.lock_pause();
        pause.until.is_some_and(|until| Instant::now() < until)
    }

    /// Start (or lengthen) the pause after a 429; answers its length.
    fn pause_for(&self, retry_after: Option<Duration>) -> Duration {
        let mut pause = self.lock_pause();
        pause.streak = pause.streak.saturating_add(1);
        let length = pause_after(pause.streak, retry_after);
        let until = Instant::now() + length;
        pause.until = Some(pause.until.map_or(until, |u| u.max(until)));
        length
    }
}

/// A status by which the provider refused what the token made of the call:
/// a bad request, or one too large (a token too long). Counted as a
/// refused token, or such a token would cost calls without end. Not 401,
/// 403, 404 or 405 (a proxy or address set up wrong), nor 408 or 429: no
/// one's token is at fault there.
fn refuses_the_request(status: reqwest::StatusCode) -> bool {
    matches!(status.as_u16(), 400 | 413 | 414 | 422)
}

/// An error code that blames the secret or the provider, not the token
/// (the three providers' names): counting it against the sender's address
/// would lock every address out after a rotated or mistyped secret.
fn not_the_tokens(code: &str) -> bool {
    code.contains("secret")
        || matches!(
            code,
            "invalid-keys" | "bad-request" | "internal-error" | "sitekey-secret-mismatch"
        )
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
    fn a_throttling_provider_is_left_alone_for_its_retry_after_or_longer_each_time() {
        let secs = Duration::from_secs;
        assert_eq!(pause_after(1, None), secs(1));
        assert_eq!(pause_after(2, None), secs(2));
        assert_eq!(pause_after(3, None), secs(4));
        assert_eq!(pause_after(6, None), secs(30));
        assert_eq!(pause_after(40, None), secs(30));
        assert_eq!(pause_after(1, Some(secs(7))), secs(7));
        assert_eq!(pause_after(1, Some(secs(0))), secs(0));
        assert_eq!(pause_after(3, Some(secs(3600))), MAX_PAUSE);
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

    fn answer(json: &str) -> SiteverifyAnswer {
        serde_json::from_str(json).unwrap()
    }

    fn expected(kind: CaptchaKind, min_score: f64, hosts: &[&str], actions: &[&str]) -> Expected {
        let settings = CaptchaSettings {
            kind,
            min_score: crate::settings::Fraction::new(min_score).unwrap(),
            hostnames: hosts.iter().map(|h| h.to_string()).collect(),
            actions: actions.iter().map(|a| a.to_string()).collect(),
            ..crate::settings::Settings::defaults().unwrap().captcha
        };
        Expected::new(&settings)
    }

    #[test]
    fn a_recaptcha_score_below_min_score_is_refused_and_other_kinds_read_none() {
        let v3 = expected(CaptchaKind::Recaptcha, 0.5, &[], &[]);
        assert_eq!(
            v3.check(&answer(r#"{"success": true, "score": 0.1}"#)),
            Err(Mismatch::Score(0.1))
        );
        assert_eq!(
            v3.check(&answer(r#"{"success": true, "score": 0.5}"#)),
            Ok(())
        );
        assert_eq!(
            v3.check(&answer(r#"{"success": true, "score": 0.9}"#)),
            Ok(())
        );
        // A v2 key's answers carry no score.
        assert_eq!(v3.check(&answer(r#"{"success": true}"#)), Ok(()));
        let off = expected(CaptchaKind::Recaptcha, 0.0, &[], &[]);
        assert_eq!(
            off.check(&answer(r#"{"success": true, "score": 0.0}"#)),
            Ok(())
        );
        // hCaptcha's enterprise score is a risk: 0.9 is a bot, not a person.
        let hcaptcha = expected(CaptchaKind::Hcaptcha, 0.5, &[], &[]);
        assert_eq!(
            hcaptcha.check(&answer(r#"{"success": true, "score": 0.1}"#)),
            Ok(())
        );
    }

    #[test]
    fn hostnames_and_actions_are_checked_only_when_listed() {
        let any = expected(CaptchaKind::Turnstile, 0.5, &[], &[]);
        let elsewhere = answer(r#"{"success": true, "hostname": "evil.example", "action": "x"}"#);
        assert_eq!(any.check(&elsewhere), Ok(()));

        let ours = expected(
            CaptchaKind::Turnstile,
            0.5,
            &["WWW.Example.com"],
            &["login"],
        );
        let good = answer(r#"{"success": true, "hostname": "www.example.COM", "action": "login"}"#);
        assert_eq!(ours.check(&good), Ok(()));
        assert_eq!(
            ours.check(&elsewhere),
            Err(Mismatch::Hostname(Some("evil.example".into())))
        );
        assert_eq!(
            ours.check(&answer(r#"{"success": true, "action": "login"}"#)),
            Err(Mismatch::Hostname(None))
        );
        assert_eq!(
            ours.check(&answer(
                r#"{"success": true, "hostname": "www.example.com", "action": "Login"}"#
            )),
            Err(Mismatch::Action(Some("Login".into())))
        );
        assert_eq!(
            ours.check(&answer(
                r#"{"success": true, "hostname": "www.example.com"}"#
            )),
            Err(Mismatch::Action(None))
        );
    }

    #[test]
    fn error_codes_are_optional_in_the_answer() {
        let answer: SiteverifyAnswer = serde_json::from_str(r#"{"success": true}"#).unwrap();
        assert!(answer.success && answer.error_codes.is_empty());
        let answer: SiteverifyAnswer = serde_json::from_str(
            r#"{"success": false, "error-codes": ["invalid-input-response"]}"#,
        )
        .unwrap();
        assert_eq!(answer.error_codes, ["invalid-input-response"]);
    }
}
