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
//! Only settled refusals fill that window: a token is counted there once the
//! provider refused it, so a crowd behind one NAT solving captchas while the
//! provider is slow is not taken for an attacker. What bounds a burst is the
//! address's tokens in flight, at most `limit` at a time in each instance
//! (held in the process, so an outage of the store cannot strand them): a
//! token past that is refused unasked until one comes back, for at most
//! `captcha.timeout` (rule `captcha_in_flight 20/5s`). So one address costs
//! at most `limit` refused calls in a window plus what races the last of
//! them (up to `limit` an instance), and a provider outage costs no one
//! their budget: an unanswered token is not a refusal. A request whose
//! address cannot be told is not throttled (it has no window), as with
//! every per-address limit.
//!
//! Each token is asked of the provider once: before the call it is
//! claimed in the store for [`TOKEN_LIFETIME_MS`], by its digest, and a
//! token already claimed is refused unasked, counted as a refused one (the
//! provider would say `timeout-or-duplicate`). Providers refuse a token
//! they verified before, but not always one verified at the same moment
//! (Turnstile's single use is "subject to network convergence"): without
//! the claim, one solve sent in twenty parallel login attempts could be
//! twenty guesses past the captcha tier. Only a passed token's claim is
//! kept: one the provider did not answer is given back, so that the user
//! may send it again, and a refused one, which can never pass, holds no
//! key (a made-up token costs the store nothing past its request).

use std::sync::Arc;
use std::time::Duration;

use dashmap::DashMap;

use super::{event_member, GuardContext, Policy, RequestInfo};
use crate::audit::{AuditDecision, AuditEvent};
use crate::captcha::{CaptchaProof, CaptchaVerifier, TokenVerdict};
use crate::domain::rule::format_window;
use crate::domain::{Action, ClientIp, Reason, Rule, Subject, SubjectKind};
use crate::store::{HitRequest, HitVerdict, StoreError, WindowSpec, WindowStore};

/// The refused tokens' window under the IP subject:
/// `tg:{ip:203.0.113.7}:captcha_token`.
pub const REFUSED: &str = "captcha_token";

/// How long a claimed token stays claimed: as long as any provider keeps
/// a token valid (Turnstile's 300 s; reCAPTCHA's and hCaptcha's are
/// shorter).
pub const TOKEN_LIFETIME_MS: u64 = 300_000;

/// The hex digest a token is claimed by: the first 128 bits of its
/// SHA-256, so that a key name shows no token.
fn token_digest(token: &str) -> String {
    use sha2::{Digest, Sha256};
    crate::hex::lower(&Sha256::digest(token.as_bytes())[..16])
}

/// One token's claim: kept only for a token the provider passed, given
/// back otherwise ([`GuardContext::settle_claim`]), and given back when
/// dropped unsettled (the request was dropped while the provider was
/// asked), so that a claim never outlives its request for nothing.
struct TokenClaim {
    store: Arc<dyn WindowStore>,
    key: String,
    member: String,
    /// Whether the store recorded it: not when it failed and
    /// `store.on_error = "allow"` let the token through unclaimed.
    recorded: bool,
    settled: bool,
}

impl TokenClaim {
    fn window() -> [WindowSpec; 1] {
        [WindowSpec::enforce(1, TOKEN_LIFETIME_MS)]
    }
}

impl Drop for TokenClaim {
    fn drop(&mut self) {
        if self.settled || !self.recorded {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let store = Arc::clone(&self.store);
        let (key, member) = (
            std::mem::take(&mut self.key),
            std::mem::take(&mut self.member),
        );
        // Spawned: a drop cannot wait, and the request is gone.
        runtime.spawn(async move {
            if let Err(error) = store.undo(&key, &member, &TokenClaim::window()).await {
                tracing::warn!(%error, "a dropped request's captcha token claim could not be given back");
            }
        });
    }
}

/// Each address's tokens at the provider now, in this process: an entry
/// lives while one of its tokens is out.
#[derive(Debug, Default)]
pub struct TokensInFlight(DashMap<String, u32>);

impl TokensInFlight {
    /// A place for one more of `address`'s tokens, while it has fewer
    /// than `limit` out; given back when the ticket drops.
    fn take(self: &Arc<Self>, address: &str, limit: u32) -> Result<FlightTicket, u32> {
        let mut out = self.0.entry(address.to_string()).or_insert(0);
        if *out >= limit {
            return Err(*out);
        }
        *out += 1;
        Ok(FlightTicket {
            flights: Arc::clone(self),
            address: address.to_string(),
        })
    }
}

/// One token's place among its address's tokens in flight.
struct FlightTicket {
    flights: Arc<TokensInFlight>,
    address: String,
}

impl Drop for FlightTicket {
    fn drop(&mut self) {
        let map = &self.flights.0;
        if let Some(mut out) = map.get_mut(&self.address) {
            *out = out.saturating_sub(1);
        }
        // The shard's lock is free again: the guard above has dropped.
        map.remove_if(&self.address, |_, out| *out == 0);
    }
}

/// What a request's captcha proof comes to.
#[derive(Debug)]
pub enum ProofCheck {
    /// The caller vouched (`kind = "none"`), or the provider passed the token.
    Passed,
    /// No proof, a refused token, or a provider that did not answer.
    NotPassed,
    /// The address's refused tokens fill its window, or its tokens in
    /// flight do: the provider was not asked.
    Throttled(TokenThrottle),
}

/// An address whose refused tokens fill `captcha.failed_token_limit`, or
/// that has as many tokens at the provider now (the rule's window is then
/// `captcha.timeout`, the longest one stays out).
#[derive(Debug)]
pub struct TokenThrottle {
    subject: Subject,
    /// `failed_captcha` or `captcha_in_flight`.
    window: &'static str,
    limit: u32,
    window_ms: u64,
    observed: u32,
    retry_after_ms: u64,
}

impl TokenThrottle {
    /// `failed_captcha 20/10m` or `captcha_in_flight 20/5s`: what answers
    /// and audit rows call the rule.
    pub fn rule_name(&self) -> String {
        rule_name(self.window, self.limit, self.window_ms)
    }

    /// Until the oldest refused token leaves the window, or a token in
    /// flight comes back.
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
        .described(self.rule_name(), self.observed, self.limit, self.window_ms)
        .retry_after_ms(self.retry_after_ms)
    }
}

/// The refused-token window of `captcha.failed_token_limit`.
pub fn rule(limit: u32, window: Duration) -> Rule {
    Rule::new(SubjectKind::Ip, limit, window)
}

fn rule_name(window: &str, limit: u32, window_ms: u64) -> String {
    format!("{window} {limit}/{}", format_window(window_ms))
}

/// `failed_captcha 20/10m`: what answers, audit rows and the subject view
/// call the refused-token window of `rule`.
pub fn refused_rule_name(rule: &Rule) -> String {
    rule_name(FAILED_CAPTCHA, rule.limit, rule.window_ms())
}

/// The refused-token window's name in rules.
const FAILED_CAPTCHA: &str = "failed_captcha";

impl GuardContext {
    /// The refused-token window of the address `ip_id` (`Subject::id` of
    /// an IP): its key and its one window.
    fn refused_window(&self, policy: &Policy, ip_id: &str) -> (String, [WindowSpec; 1]) {
        let rule = policy.failed_tokens;
        let key = self.keys.window(SubjectKind::Ip.as_str(), ip_id, REFUSED);
        (key, [WindowSpec::enforce(rule.limit, rule.window_ms())])
    }

    /// How many of `ip_id`'s tokens the provider refused in the window;
    /// reads only.
    pub(super) async fn refused_tokens(
        &self,
        policy: &Policy,
        ip_id: &str,
    ) -> Result<u32, StoreError> {
        let (key, refused) = self.refused_window(policy, ip_id);
        let seen = self.store.peek(&key, &refused).await?;
        Ok(seen.counts.first().copied().unwrap_or(0))
    }

    /// Whether `proof` counts for `action`, as `[captcha]` says, from `ip`:
    /// a caller's word decides at once; a token is asked of the provider
    /// within the address's budget of refused tokens.
    pub(super) async fn check_captcha(
        &self,
        policy: &Policy,
        proof: &CaptchaProof,
        action: Action,
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
            let verdict = self.ask_once(captcha, proof, action, None).await?;
            return Ok(verdict_of(verdict));
        };
        let rule = policy.failed_tokens;
        let subject = Subject::new(SubjectKind::Ip, ip.subject_id());
        let (key, refused) = self.refused_window(policy, &subject.id);
        let seen = self.store.peek(&key, &refused).await?;
        let count = seen.counts.first().copied().unwrap_or(0);
        if count >= rule.limit {
            return Ok(throttled(TokenThrottle {
                subject,
                window: FAILED_CAPTCHA,
                limit: rule.limit,
                window_ms: rule.window_ms(),
                observed: count,
                retry_after_ms: seen.retry_after_ms.first().copied().unwrap_or(0),
            }));
        }
        let _ticket = match self.tokens_in_flight.take(&subject.id, rule.limit) {
            Ok(ticket) => ticket,
            Err(out) => {
                // Out at most the call's deadline.
                let timeout_ms = captcha.timeout().as_millis() as u64;
                return Ok(throttled(TokenThrottle {
                    subject,
                    window: "captcha_in_flight",
                    limit: rule.limit,
                    window_ms: timeout_ms,
                    observed: out,
                    retry_after_ms: timeout_ms,
                }));
            }
        };
        let verdict = self
            .ask_once(captcha, proof, action, address.as_deref())
            .await?;
        if verdict == TokenVerdict::Refused {
            // Counted before the ticket gives its place back, so that a
            // token taking that place sees this refusal.
            let member = event_member();
            let refusal = HitRequest {
                key: &key,
                windows: &refused,
                member: &member,
                gate_open: false,
                // Counted even past the limit: it was refused all the same.
                force: true,
            };
            if let Err(error) = self.store.hit(refusal).await {
                tracing::warn!(request_id = %crate::telemetry::request_id(), %error, "a refused captcha token could not be counted");
            }
        }
        Ok(verdict_of(verdict))
    }

    /// The provider's word on `proof`'s token, asked once: a token longer
    /// than the provider makes is refused without a claim or a call, and
    /// one claimed before is refused unasked.
    async fn ask_once(
        &self,
        captcha: &CaptchaVerifier,
        proof: &CaptchaProof,
        action: Action,
        address: Option<&str>,
    ) -> Result<TokenVerdict, StoreError> {
        if captcha.too_long(proof) {
            crate::metrics::captcha_check("refused");
            return Ok(TokenVerdict::Refused);
        }
        let Some(claim) = self.claim_token(proof).await? else {
            return Ok(TokenVerdict::Refused);
        };
        let verdict = captcha
            .ask_provider(proof, action, address, &self.provider_pause)
            .await;
        self.settle_claim(claim, verdict).await;
        Ok(verdict)
    }

    /// Claim `proof`'s token for [`TOKEN_LIFETIME_MS`]: `None` (counted in
    /// the metric as `reused`) when it was claimed before.
    async fn claim_token(&self, proof: &CaptchaProof) -> Result<Option<TokenClaim>, StoreError> {
        let token = proof.token.as_deref().unwrap_or_default();
        let key = self.keys.captcha_token(&token_digest(token));
        let member = event_member();
        let claim = HitRequest {
            key: &key,
            windows: &TokenClaim::window(),
            member: &member,
            gate_open: false,
            force: false,
        };
        let result = self.store.hit(claim).await;
        let mut claim = TokenClaim {
            store: Arc::clone(&self.store),
            key,
            member,
            recorded: true,
            settled: false,
        };
        // On an error the claim may have landed before its answer was lost:
        // dropped unsettled, it is given back without the request waiting
        // for a store that just failed it.
        let outcome = result?;
        if matches!(outcome.verdict, HitVerdict::Denied { .. }) {
            claim.settled = true;
            crate::metrics::captcha_check("reused");
            return Ok(None);
        }
        claim.recorded = outcome.added;
        Ok(Some(claim))
    }

    /// Keep the claim of a token the provider passed; give back any other:
    /// an unanswered token was not spent, and a refused one can never pass,
    /// so only real solves hold a key.
    async fn settle_claim(&self, mut claim: TokenClaim, verdict: TokenVerdict) {
        claim.settled = true;
        if verdict == TokenVerdict::Passed || !claim.recorded {
            return;
        }
        if let Err(error) = self
            .store
            .undo(&claim.key, &claim.member, &TokenClaim::window())
            .await
        {
            tracing::warn!(request_id = %crate::telemetry::request_id(), %error, "a captcha token's claim could not be given back");
        }
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
        Ok(
            match self
                .check_captcha(policy, proof, action, info.client_ip())
                .await?
            {
                ProofCheck::Passed => true,
                ProofCheck::NotPassed => false,
                ProofCheck::Throttled(throttle) => {
                    self.audit(info, throttle.audit_row(action).shadow(true));
                    false
                }
            },
        )
    }
}

fn throttled(throttle: TokenThrottle) -> ProofCheck {
    crate::metrics::captcha_check("throttled");
    ProofCheck::Throttled(throttle)
}

fn verdict_of(verdict: TokenVerdict) -> ProofCheck {
    match verdict {
        TokenVerdict::Passed => ProofCheck::Passed,
        TokenVerdict::Refused | TokenVerdict::Unanswered => ProofCheck::NotPassed,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_address_leaves_the_map_when_its_last_token_comes_back() {
        let flights = Arc::new(TokensInFlight::default());
        let first = flights.take("203.0.113.7", 2).unwrap();
        let second = flights.take("203.0.113.7", 2).unwrap();
        assert_eq!(flights.take("203.0.113.7", 2).err(), Some(2));
        let other = flights.take("198.51.100.9", 2).unwrap();
        drop(first);
        let third = flights.take("203.0.113.7", 2).unwrap();
        drop((second, third, other));
        assert!(flights.0.is_empty(), "{:?}", flights.0);
    }
}
