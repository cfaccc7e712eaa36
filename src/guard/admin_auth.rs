//! Throttling online guessing of admin tokens: failed admin authentications
//! are counted per client address in the store's own windows
//! (`server.admin_auth_limit`, 20 per 10 minutes by default), and an IPv6
//! client's per network too (`server.admin_auth_network_limit`, 100: a /48
//! holds 65,536 /64s); while either window is full, every admin request
//! from the address is refused before its token is looked at.
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
use crate::settings::ServerSettings;
use crate::store::WindowSpec;
use crate::telemetry::log_budget::LogBudget;

/// An admin's network: always a /48, whatever `sms.network_bits` says (an
/// operator who widens that to a /32 against SMS abuse must not widen who
/// shares an admin's window of failures with it).
pub const NETWORK_BITS: u8 = 48;

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

/// Counts failed admin authentications per client address, and an IPv6
/// client's per network too.
pub struct AdminAuthGuard {
    ctx: GuardContext,
    rule: Rule,
    /// `server.admin_auth_network_limit`: one /48 holds 65,536 /64s, each
    /// with `rule` of its own.
    network_rule: Rule,
}

/// One subject's window of failures: an address's, or its network's.
struct Watched {
    subject: Subject,
    key: String,
    rule: Rule,
}

impl Watched {
    fn window(&self) -> [WindowSpec; 1] {
        [WindowSpec::enforce(self.rule.limit, self.rule.window_ms())]
    }
}

impl AdminAuthGuard {
    /// Over the guards' store and audit sink, with `server.admin_auth_limit`
    /// and `server.admin_auth_network_limit` (networks of [`NETWORK_BITS`]).
    pub fn new(ctx: GuardContext, server: &ServerSettings) -> Self {
        let (limit, network) = (&server.admin_auth_limit, &server.admin_auth_network_limit);
        Self {
            ctx,
            rule: Rule::new(SubjectKind::Ip, limit.limit, limit.window),
            network_rule: Rule::new(SubjectKind::Network, network.limit, network.window),
        }
    }

    /// The windows `ip`'s failures count in: its own, then (IPv6) its
    /// network's.
    fn watched(&self, ip: ClientIp) -> impl Iterator<Item = Watched> + '_ {
        let address = Subject::new(SubjectKind::Ip, ip.subject_id());
        let network = ip
            .network_id(NETWORK_BITS)
            .map(|id| Subject::new(SubjectKind::Network, id));
        [
            Some((address, self.rule)),
            network.map(|n| (n, self.network_rule)),
        ]
        .into_iter()
        .flatten()
        .map(|(subject, rule)| Watched {
            key: self.ctx.keys.subject_window(&subject, Action::Admin),
            subject,
            rule,
        })
    }

    /// Whether `ip` may try to authenticate now: refused while its window
    /// of failures, or its network's, is full. A request whose address
    /// cannot be told is not throttled (it has no window).
    pub async fn check(&self, ip: Option<ClientIp>) -> Result<(), Throttled> {
        let Some(ip) = ip else { return Ok(()) };
        let watched: Vec<Watched> = self.watched(ip).collect();
        // Both windows at once: an IPv6 admin request waits one round trip.
        let peeks = futures::future::join_all(
            watched
                .iter()
                .map(|w| async move { self.ctx.store.peek(&w.key, &w.window()).await }),
        )
        .await;
        for (watched, peek) in watched.iter().zip(peeks) {
            match peek {
                Ok(peek)
                    if peek
                        .counts
                        .first()
                        .is_some_and(|&n| n >= watched.rule.limit) =>
                {
                    crate::metrics::admin_auth_throttled();
                    return Err(Throttled {
                        rule: watched.rule.name(),
                        retry_after_ms: peek.retry_after_ms.first().copied().unwrap_or(0),
                    });
                }
                Ok(_) => {}
                Err(error) => {
                    if STORE_LINES.admit().is_some() {
                        tracing::warn!(%error, "failed admin authentications cannot be counted; not throttled");
                    }
                    return Ok(());
                }
            }
        }
        Ok(())
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
        for watched in self.watched(ip) {
            self.count(info, ip, &watched).await;
        }
    }

    /// Count one failure in `watched`; the one that fills it is audited.
    async fn count(&self, info: &RequestInfo, ip: ClientIp, watched: &Watched) {
        let member = event_member();
        let window = watched.window();
        let hit = crate::store::HitRequest {
            key: &watched.key,
            windows: &window,
            member: &member,
            gate_open: false,
            force: false,
        };
        let rule = &watched.rule;
        match self.ctx.store.hit(hit).await {
            Ok(outcome)
                if outcome.added
                    && outcome.counts.first() == Some(&rule.limit.saturating_sub(1)) =>
            {
                tracing::warn!(
                    request_id = %info.request_id,
                    ip = %ip,
                    subject = %watched.subject.id,
                    rule = %rule.name(),
                    "admin authentication throttled for this address"
                );
                let row = AuditEvent::new(
                    Action::Admin,
                    AuditDecision::Lock,
                    Reason::AdminAuthFailures,
                    &watched.subject,
                )
                .rule(rule, rule.limit)
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
