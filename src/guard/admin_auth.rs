//! Throttling online guessing of admin tokens: failed admin authentications
//! are counted per client address in the store's own windows
//! (`server.admin_auth_limit`, 20 per 10 minutes by default); while an
//! address's window is full, every admin request from it is refused before
//! its token is looked at.
//!
//! Why a right token waits too: answering it differently while throttled
//! would tell a guesser which guess was right, so the throttle would not
//! slow guessing at all. An admin locked out by someone else's guessing from
//! the same address waits for the window, uses another address, or has an
//! admin elsewhere unblock the IP subject (the unblock clears this window).
//!
//! Each failure is counted in a metric and logged at warn, at most one line
//! per 10 seconds (a flood cannot fill the disk; each line says how many
//! were held back before it). The failure that fills the window is audited once, as `admin` /
//! `lock` / `admin_auth_failures` on the IP: one row per crossing, not per
//! failure, so a flood cannot flood the trail either.
//!
//! A store failure does not lock admins out: the check then lets the
//! request through to the token check (and says so in the log). Tokens are
//! at least 16 random characters; the throttle is a second line of defence.

use std::time::Duration;

use super::{event_member, GuardContext, RequestInfo};
use crate::audit::{AuditDecision, AuditEvent};
use crate::domain::{Action, ClientIp, Reason, Rule, Subject, SubjectKind};
use crate::settings::LimitSetting;
use crate::store::WindowSpec;
use crate::telemetry::log_budget::LogBudget;

/// Lines about failed admin authentication: one per 10 seconds.
static FAILURE_LINES: LogBudget = LogBudget::new(Duration::from_secs(10));
/// Lines about a store that cannot count them: one a minute.
static STORE_LINES: LogBudget = LogBudget::new(Duration::from_secs(60));

/// An address that failed too often, and for how long it stays refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Throttled {
    /// The rule, `ip 20/10m`.
    pub rule: String,
    /// Until the oldest counted failure leaves the window.
    pub retry_after_ms: u64,
}

/// Counts failed admin authentications per client address.
pub struct AdminAuthGuard {
    ctx: GuardContext,
    rule: Rule,
}

impl AdminAuthGuard {
    /// Over the guards' store and audit sink, with `server.admin_auth_limit`.
    pub fn new(ctx: GuardContext, limit: &LimitSetting) -> Self {
        Self {
            ctx,
            rule: Rule::new(SubjectKind::Ip, limit.limit, limit.window),
        }
    }

    fn window(&self) -> [WindowSpec; 1] {
        [WindowSpec::enforce(self.rule.limit, self.rule.window_ms())]
    }

    fn key(&self, ip: ClientIp) -> String {
        let subject = Subject::new(SubjectKind::Ip, ip.subject_id());
        self.ctx.keys.subject_window(&subject, Action::Admin)
    }

    /// Whether `ip` may try to authenticate now: refused while its window
    /// of failures is full. A request whose address cannot be told is not
    /// throttled (it has no window).
    pub async fn check(&self, ip: Option<ClientIp>) -> Result<(), Throttled> {
        let Some(ip) = ip else { return Ok(()) };
        match self.ctx.store.peek(&self.key(ip), &self.window()).await {
            Ok(peek) if peek.counts.first().is_some_and(|&n| n >= self.rule.limit) => {
                crate::metrics::admin_auth_throttled();
                Err(Throttled {
                    rule: self.rule.name(),
                    retry_after_ms: peek.retry_after_ms.first().copied().unwrap_or(0),
                })
            }
            Ok(_) => Ok(()),
            Err(error) => {
                if STORE_LINES.admit().is_some() {
                    tracing::warn!(%error, "failed admin authentications cannot be counted; not throttled");
                }
                Ok(())
            }
        }
    }

    /// Record one failed authentication from `info.ip`: counted, logged
    /// (within the budget), and audited when it fills the window.
    pub async fn failed(&self, info: &RequestInfo) {
        crate::metrics::admin_auth_failure();
        let address = info.ip.map(|ip| ip.to_string());
        if let Some(held_back) = FAILURE_LINES.admit() {
            tracing::warn!(
                request_id = %info.request_id,
                ip = address.as_deref().unwrap_or("unknown"),
                held_back,
                "admin authentication failed"
            );
        }
        let Some(ip) = info.ip else { return };
        let key = self.key(ip);
        let member = event_member();
        let window = self.window();
        let hit = crate::store::HitRequest {
            key: &key,
            windows: &window,
            member: &member,
            gate_open: false,
            force: false,
        };
        match self.ctx.store.hit(hit).await {
            Ok(outcome)
                if outcome.added
                    && outcome.counts.first() == Some(&self.rule.limit.saturating_sub(1)) =>
            {
                tracing::warn!(
                    request_id = %info.request_id,
                    ip = %ip,
                    rule = %self.rule.name(),
                    "admin authentication throttled for this address"
                );
                let subject = Subject::new(SubjectKind::Ip, ip.subject_id());
                let row = AuditEvent::new(
                    Action::Admin,
                    AuditDecision::Lock,
                    Reason::AdminAuthFailures,
                    &subject,
                )
                .rule(&self.rule, self.rule.limit)
                .retry_after_ms(outcome.next_retry_after_ms);
                self.ctx.audit(info, row);
            }
            // Counted below the limit, or refused as already full (a
            // failure racing the one that filled it): nothing to audit.
            Ok(_) => {}
            Err(error) => {
                if STORE_LINES.admit().is_some() {
                    tracing::warn!(%error, "a failed admin authentication could not be counted");
                }
            }
        }
    }
}
