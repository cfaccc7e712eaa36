//! A budget on the failed deliveries one address can cost. A send whose
//! delivery failed for a reason a retry may mend (the provider's outage or
//! throttling, tollgate's set-up) is given back whole, so that an outage
//! costs no user their windows. But some such failures are the caller's
//! pick: a number in a region the account may not text (Twilio's 21408),
//! a number a webhook answers 400 or 404 for. Given back whole each time,
//! one address could make a provider call per request without end, and
//! enough of them would push the account into the provider's own
//! throttling, failing every real user's send.
//!
//! So each client address (IPv6 per /64) has `sms.failed_delivery_limit`
//! failures given back whole (5 an hour by default), counted in the
//! store's own window `tg:{ip:…}:sms_failed`; past it, a failed send keeps
//! counting in the address's windows (`sms.ip_limits`, the network's), as
//! a number the provider refused does, and those bound it. A send that
//! names no client has no address to count and is given back whole, as
//! every per-address limit leaves it.

use super::decision::GiveBack;
use super::SmsGuard;
use crate::domain::{ClientIp, SubjectKind};
use crate::guard::{event_member, Policy};
use crate::store::{HitRequest, HitVerdict, WindowSpec};

/// The failed deliveries' window under the IP subject.
pub const FAILED: &str = "sms_failed";

impl SmsGuard {
    /// What a failed send from `ip` gives back, `give_back` being what its
    /// failure alone says: a whole give-back is counted in the address's
    /// budget, and past it the address's windows keep the send (every
    /// window, for a send `address_counted` false: an allow-listed
    /// address's, which no address window counts). Without
    /// the store's answer the send is not given back whole: an outage of
    /// the store must not lift the bound.
    pub(super) async fn within_failure_budget(
        &self,
        policy: &Policy,
        give_back: GiveBack,
        ip: Option<ClientIp>,
        address_counted: bool,
    ) -> GiveBack {
        let (GiveBack::Whole, Some(ip)) = (give_back, ip) else {
            return give_back;
        };
        let budget = &policy.sms.settings.failed_delivery_limit;
        let windows = [WindowSpec::enforce(
            budget.limit,
            budget.window.as_millis() as u64,
        )];
        let keys = &self.ctx.keys;
        let key = keys.window(SubjectKind::Ip.as_str(), &ip.subject_id(), FAILED);
        let member = event_member();
        let hit = HitRequest {
            key: &key,
            windows: &windows,
            member: &member,
            gate_open: false,
            force: false,
        };
        match self.ctx.store.hit(hit).await {
            Ok(outcome) if outcome.verdict == HitVerdict::Allowed => GiveBack::Whole,
            Ok(_) => give_back.past_the_budget(address_counted),
            Err(error) => {
                tracing::warn!(request_id = %crate::telemetry::request_id(), %error, "a failed delivery could not be counted; the address's windows keep the send");
                give_back.past_the_budget(address_counted)
            }
        }
    }
}
