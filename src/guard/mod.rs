//! The decisions. Guards take parsed domain values, talk to the store, the
//! audit sink and the delivery providers, and return domain outcomes; they know
//! nothing of HTTP.

pub mod admin;
mod code;
pub mod login;
mod policy;
pub mod pumping;
mod reserve;
pub mod sms;

use std::sync::Arc;

pub use policy::{Policy, PolicyCell, SubjectRules};

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
}

impl GuardContext {
    /// What the allow and block lists say of a request about the subject
    /// `(kind, id)` (a phone or a user) from `info.ip`; a `Subject` is built
    /// only for the audit row of a block. A block is audited (`blocklisted`,
    /// shadowed when `shadow`) unless `read_only` (`/login/check`); every
    /// match is counted in metrics.
    fn listed(
        &self,
        action: Action,
        info: &RequestInfo,
        (kind, id): (SubjectKind, &str),
        shadow: bool,
        read_only: bool,
    ) -> Listed {
        let request = ListRequest {
            ip: info.ip.map(|ip| ip.addr()),
            phone: (kind == SubjectKind::Phone).then_some(id),
            user: (kind == SubjectKind::User).then_some(id),
        };
        let listed = self.lists.current().check(request);
        match listed {
            Listed::No => {}
            Listed::Allowed(kind) => crate::metrics::list_match(ListName::Allow, kind, action),
            Listed::Blocked(_) if read_only => {}
            Listed::Blocked(entry) => {
                crate::metrics::list_match(ListName::Block, entry, action);
                let matched = match (entry, info.ip) {
                    (EntryKind::Ip, Some(ip)) => Subject::new(SubjectKind::Ip, ip.subject_id()),
                    _ => Subject::new(kind, id),
                };
                let row =
                    AuditEvent::new(action, AuditDecision::Deny, Reason::Blocklisted, &matched);
                self.audit(info, row.shadow(shadow));
            }
        }
        listed
    }

    fn audit(&self, info: &RequestInfo, event: AuditEvent) {
        let ip = info.ip.map(|ip| ip.to_string());
        self.audit
            .record(event.request(ip, &info.request_id, info.user_agent.as_deref()));
    }
}

/// A unique id for one event in the windows it is offered to: 64 random bits
/// as 16 hex digits (a UUID's 36 characters cost Redis memory in every
/// window member and buy nothing here).
fn event_member() -> String {
    format!("{:016x}", rand::random::<u64>())
}

/// Whole seconds, rounded up, as `Retry-After` wants them.
pub fn ceil_secs(ms: u64) -> u64 {
    ms.div_ceil(1000)
}
