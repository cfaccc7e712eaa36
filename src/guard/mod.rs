//! The decisions. Guards take parsed domain values, talk to the store, the
//! audit sink and the delivery providers, and return domain outcomes; they know
//! nothing of HTTP.

pub mod admin;
pub mod admin_auth;
mod captcha_tokens;
mod code;
pub mod login;
mod policy;
pub mod pumping;
mod reserve;
pub mod sms;

use std::sync::Arc;

pub use captcha_tokens::{ProofCheck, TokenThrottle, TokensInFlight};

pub use policy::{
    IpLoginRules, LoginRules, Policy, PolicyCell, SmsRules, SubjectRules, Windows, ACTIONS,
};

use crate::audit::{AuditDecision, AuditEvent, AuditSink};
use crate::domain::{Action, ClientIp, Reason, Subject, SubjectKind};
use crate::lists::{EntryKind, ListName, ListRequest, Listed};
use crate::store::{Keys, WindowStore};

/// Who asked: carried into audit rows.
#[derive(Debug, Clone)]
pub struct RequestInfo {
    /// The request's id (`x-request-id`, taken or made), for audit rows.
    pub request_id: String,
    /// The `User-Agent` header, cut to 512 characters.
    pub user_agent: Option<String>,
    /// The client's address as `routes::caller` works it out; `None` when it
    /// cannot be told, and then no IP subject is counted.
    pub ip: Option<ClientIp>,
    /// The caller is a backend that may vouch for outcomes (an API key, or
    /// loopback when none is configured); see `routes::caller`.
    pub backend: bool,
    /// `ip` is the backend's own address (or the proxy's on its host), not a
    /// client's: a backend called without naming its client in `ip`
    /// (DESIGN.md §3's verify body has no `ip`, the others' is optional; a
    /// keyless loopback backend's is never read). Audit rows still name it;
    /// nothing that judges a client does (see [`client_ip`](Self::client_ip)).
    pub backends_own_ip: bool,
    /// The admin who asked (`token:oncall`, `oidc:ann@example.com`), on
    /// admin requests: audit rows name it.
    pub actor: Option<String>,
}

impl RequestInfo {
    /// The client's address, for what judges a client: its windows (IP,
    /// network, the captcha tokens it had refused), the (user, IP) pair,
    /// the lists, the captcha provider's `remoteip`. `None` when the address
    /// is the backend's own: every user of that backend would add up under
    /// it, so twenty strangers' sends or failures would refuse them all (and
    /// an allow-listed backend address would let them all through).
    pub fn client_ip(&self) -> Option<ClientIp> {
        if self.backends_own_ip {
            None
        } else {
            self.ip
        }
    }

    /// `event` with what the request tells: client IP, request id, user
    /// agent and, on an admin's request, the admin.
    pub fn stamp(&self, event: AuditEvent) -> AuditEvent {
        let ip = self.ip.map(|ip| ip.text());
        event
            .request(ip, &self.request_id, self.user_agent.as_deref())
            .actor(self.actor.clone())
    }
}

/// What every guard shares.
#[derive(Clone)]
pub struct GuardContext {
    /// Windows, locks and codes, behind the `store.on_error` policy.
    pub store: Arc<dyn WindowStore>,
    /// Names the store keys, under `store.key_prefix`.
    pub keys: Keys,
    /// Where audit rows go; recording one never waits for the database.
    pub audit: Arc<dyn AuditSink>,
    /// The decision settings in force, swapped whole on SIGHUP.
    pub policy: Arc<PolicyCell>,
    /// The allow and block lists in force.
    pub lists: Arc<crate::lists::Lists>,
    /// Each address's captcha tokens at the provider now.
    pub tokens_in_flight: Arc<TokensInFlight>,
    /// Whether the captcha provider throttles; kept across reloads.
    pub provider_pause: Arc<crate::captcha::ProviderPause>,
}

/// How a lookup in the allow and block lists is used.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Lookup {
    /// A request that counts (a send, a verify, a login attempt): every
    /// match is counted in metrics and a block gets an audit row.
    Attempt,
    /// A read-only look (`/login/check`): a block is neither counted nor
    /// audited.
    Peek,
}

/// What the lists say of a request, and the audit row of a block (not yet
/// written: the caller's decision writes it, shadowed or not).
struct Listing {
    /// The lists' answer.
    listed: Listed,
    /// `blocklisted` for the entry that matched, on an attempt's block.
    row: Option<AuditEvent>,
    /// Whether the phone or user is on the allow list by its own entry, not
    /// a prefix: with an allow-listed address, besides it (the address is
    /// matched first); with an allow-listed phone, whether by itself or by
    /// a range's entry.
    subject_allowed_exactly: bool,
}

impl GuardContext {
    /// What the guards share, with no captcha token out and no pause of
    /// the provider yet.
    pub fn new(
        store: Arc<dyn WindowStore>,
        keys: Keys,
        audit: Arc<dyn AuditSink>,
        policy: Arc<PolicyCell>,
        lists: Arc<crate::lists::Lists>,
    ) -> Self {
        Self {
            store,
            keys,
            audit,
            policy,
            lists,
            tokens_in_flight: Arc::default(),
            provider_pause: Arc::default(),
        }
    }
}

impl GuardContext {
    /// What the allow and block lists say of a request about the subject
    /// `(kind, id)` (a phone or a user) from `info.ip`; a `Subject` is built
    /// only for the audit row of a block.
    fn listed(
        &self,
        action: Action,
        info: &RequestInfo,
        (kind, id): (SubjectKind, &str),
        lookup: Lookup,
    ) -> Listing {
        let request = ListRequest {
            ip: info.client_ip().map(|ip| ip.addr()),
            phone: (kind == SubjectKind::Phone).then_some(id),
            user: (kind == SubjectKind::User).then_some(id),
        };
        let matcher = self.lists.current();
        let listed = matcher.check(request);
        // Only an exact entry: a prefix's whole range would be past every
        // window for whoever names the listed address, or past each
        // number's own windows for anyone.
        let subject_allowed_exactly =
            matches!(listed, Listed::Allowed(EntryKind::Ip | EntryKind::Phone))
                && matcher.allows_exactly(ListRequest {
                    ip: None,
                    ..request
                });
        let row = match listed {
            Listed::No => None,
            Listed::Allowed(kind) => {
                crate::metrics::list_match(ListName::Allow, kind, action);
                None
            }
            Listed::Blocked(_) if lookup == Lookup::Peek => None,
            Listed::Blocked(entry) => {
                crate::metrics::list_match(ListName::Block, entry, action);
                let matched = match (entry, info.client_ip()) {
                    (EntryKind::Ip, Some(ip)) => Subject::new(SubjectKind::Ip, ip.subject_id()),
                    _ => Subject::new(kind, id),
                };
                let row =
                    AuditEvent::new(action, AuditDecision::Deny, Reason::Blocklisted, &matched);
                Some(row)
            }
        };
        Listing {
            listed,
            row,
            subject_allowed_exactly,
        }
    }

    fn audit(&self, info: &RequestInfo, event: AuditEvent) {
        self.audit.record(info.stamp(event));
    }
}

/// A unique id for one event in the windows it is offered to: 64 random bits
/// as 16 hex digits (a UUID's 36 characters cost Redis memory in every
/// window member and buy nothing here).
fn event_member() -> String {
    hex16(rand::random::<u64>())
}

/// `n` as `format!("{n:016x}")` writes it, without the formatting machinery
/// (every decision makes one).
fn hex16(n: u64) -> String {
    crate::hex::lower(&n.to_be_bytes())
}

/// Whole seconds, rounded up, as `Retry-After` wants them.
pub fn ceil_secs(ms: u64) -> u64 {
    ms.div_ceil(1000)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_event_member_is_sixteen_hex_digits() {
        for n in [0, 1, 0xabc, u64::MAX, 0x0123_4567_89ab_cdef, rand::random()] {
            assert_eq!(hex16(n), format!("{n:016x}"));
        }
        assert_ne!(event_member(), event_member());
    }
}
