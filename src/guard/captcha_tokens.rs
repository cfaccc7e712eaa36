//! Captcha proofs, and a budget on the provider calls one address can
//! cost: every token the provider refuses counts against the client
//! address (IPv6 per /64) in the store's own window,
//! `captcha.failed_token_limit` (20 per 10 minutes by default). While the
//! window is full, a token from that address is refused without asking the
//! provider: 429 `rate_limited`, rule `failed_captcha 20/10m`.
//!
//! Why: without it, a refused token cost its sender nothing, so one address
//! could make a siteverify call per request; providers throttle or bill per
//! secret, and once one throttles every token fails, so every captcha tier
//! refuses real users as a limit would.
//!
//! The token is counted before the call and given back when it passes or
//! the provider does not answer: exact under concurrency (twenty tokens in
//! flight take the twenty places), and a provider outage costs no one their
//! budget. A request whose address cannot be told is not throttled (it has
//! no window), as with every per-address limit.

use super::{event_member, GuardContext, Policy, RequestInfo};
use crate::audit::{AuditDecision, AuditEvent};
use crate::captcha::{CaptchaProof, TokenVerdict};
use crate::domain::rule::format_window;
use crate::domain::{Action, ClientIp, Reason, Rule, Subject, SubjectKind};
use crate::store::{HitRequest, HitVerdict, StoreError, WindowSpec};

/// The window's name under the IP subject: `tg:{ip:203.0.113.7}:captcha_token`.
pub const WINDOW: &str = "captcha_token";

/// What a request's captcha proof comes to.
#[derive(Debug)]
pub enum ProofCheck {
    /// The caller vouched (`kind = "none"`), or the provider passed the token.
    Passed,
    /// No proof, a refused token, or a provider that did not answer.
    NotPassed,
    /// The address's refused tokens fill its window: the provider was not
    /// asked.
    Throttled(TokenThrottle),
}

/// An address whose refused tokens fill `captcha.failed_token_limit`.
#[derive(Debug)]
pub struct TokenThrottle {
    subject: Subject,
    rule: Rule,
    observed: u32,
    retry_after_ms: u64,
}

impl TokenThrottle {
    /// `failed_captcha 20/10m`: what answers and audit rows call the rule.
    pub fn rule_name(&self) -> String {
        format!(
            "failed_captcha {}/{}",
            self.rule.limit,
            format_window(self.rule.window_ms())
        )
    }

    /// Until the oldest refused token leaves the window.
    pub fn retry_after_ms(&self) -> u64 {
        self.retry_after_ms
    }

    /// The audit row of a request of `action` refused for it: `deny`,
    /// `rate_limited`, on the address.
    pub fn audit_row(&self, action: Action) -> AuditEvent {
        AuditEvent::new(
            action,
            AuditDecision::Deny,
            Reason::RateLimited,
            &self.subject,
        )
        .described(
            self.rule_name(),
            self.observed,
            self.rule.limit,
            self.rule.window_ms(),
        )
        .retry_after_ms(self.retry_after_ms)
    }
}

/// The refused-token window of `policy`'s `captcha.failed_token_limit`.
pub fn rule(limit: u32, window: std::time::Duration) -> Rule {
    Rule::new(SubjectKind::Ip, limit, window)
}

impl GuardContext {
    /// Whether `proof` counts, as `[captcha]` says, from `ip`: a caller's
    /// word decides at once; a token is asked of the provider within the
    /// address's budget of refused tokens.
    pub(super) async fn check_captcha(
        &self,
        policy: &Policy,
        proof: &CaptchaProof,
        ip: Option<ClientIp>,
    ) -> Result<ProofCheck, StoreError> {
        let captcha = &policy.captcha;
        if !captcha.asks_provider(proof) {
            return Ok(if captcha.vouched(proof) {
                ProofCheck::Passed
            } else {
                ProofCheck::NotPassed
            });
        }
        let address = ip.map(|ip| ip.text());
        let Some(ip) = ip else {
            return Ok(verdict_of(captcha.ask_provider(proof, None).await));
        };
        let rule = policy.failed_tokens;
        let subject = Subject::new(SubjectKind::Ip, ip.subject_id());
        let key = self.keys.window(subject.kind.as_str(), &subject.id, WINDOW);
        let window = [WindowSpec::enforce(rule.limit, rule.window_ms())];
        let member = event_member();
        let hit = HitRequest {
            key: &key,
            windows: &window,
            member: &member,
            gate_open: false,
            force: false,
        };
        let outcome = self.store.hit(hit).await?;
        if let HitVerdict::Denied { retry_after_ms, .. } = outcome.verdict {
            crate::metrics::captcha_check("throttled");
            return Ok(ProofCheck::Throttled(TokenThrottle {
                subject,
                rule,
                observed: outcome.counts.first().copied().unwrap_or(rule.limit),
                retry_after_ms,
            }));
        }
        let verdict = captcha.ask_provider(proof, address.as_deref()).await;
        if verdict != TokenVerdict::Refused && outcome.added {
            // Not the sender's doing: its place in the window goes back.
            if let Err(error) = self.store.undo(&key, &member, &window).await {
                tracing::warn!(request_id = %crate::telemetry::request_id(), %error, "a captcha token's count could not be given back");
            }
        }
        Ok(verdict_of(verdict))
    }

    /// Whether `proof` passes before the store is asked: a caller's word,
    /// or (in shadow mode, where the first call records) a token. A
    /// throttled token is not passed, and audited as the shadow's would-be
    /// refusal of `action`.
    pub(super) async fn captcha_passed_now(
        &self,
        policy: &Policy,
        proof: &CaptchaProof,
        info: &RequestInfo,
        action: Action,
    ) -> Result<bool, StoreError> {
        Ok(match self.check_captcha(policy, proof, info.ip).await? {
            ProofCheck::Passed => true,
            ProofCheck::NotPassed => false,
            ProofCheck::Throttled(throttle) => {
                self.audit(info, throttle.audit_row(action).shadow(true));
                false
            }
        })
    }
}

fn verdict_of(verdict: TokenVerdict) -> ProofCheck {
    match verdict {
        TokenVerdict::Passed => ProofCheck::Passed,
        TokenVerdict::Refused | TokenVerdict::Unanswered => ProofCheck::NotPassed,
    }
}
