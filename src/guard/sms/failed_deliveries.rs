//! A budget on the failed deliveries one address can pick. A send whose
//! delivery failed for a reason a retry may mend is given back whole, so
//! that an outage costs no user their windows. But some failures are the
//! caller's pick, though the number is not refused for good
//! (`DeliveryError::Declined`): a number in a region the account may not
//! text (Twilio's 21408), a number a webhook answers 400 for. Given
//! back whole each time, one address could make a provider call per
//! request without end, and enough of them would push the account into the
//! provider's own throttling, failing every real user's send. A
//! connection closed or reset once the message went out
//! (`DeliveryError::Dropped`) is budgeted alike: a provider that takes a
//! message and then drops the connection would otherwise text a phone
//! without limit, every send answered 502 and given back; a proxy that
//! drops every connection while the provider is down costs an address
//! its budget, not its users' windows at once.
//!
//! So each client address (IPv6 per /64) has `sms.failed_delivery_limit`
//! such failures given back whole (5 an hour by default), and each IPv6
//! network (`sms.network_bits`; one /48 holds 65,536 /64s)
//! `sms.failed_delivery_network_limit` (1280, a /56's worth: one /64
//! cannot spend the network's for every other /64 in it), counted in the
//! store's own windows `tg:{ip:…}:sms_failed` and
//! `tg:{network:…}:sms_failed`; past either, a declined send keeps
//! counting in the address's windows (`sms.ip_limits`, the network's), as
//! a number the provider refused does, and those bound it. The address is
//! counted first, so that an address past its own budget spends none of
//! its network's; a send its network's budget refuses takes its count
//! back from the address's, as the address's windows keep that send.
//! The provider's outage, throttling or a wrong set-up is no one's pick:
//! it is given back whole and spends no budget, or every user behind one
//! NAT would pay for it. A send that names no client has no address to
//! count, and one budget for the backend that sent it would be every
//! user's to spend: it has none, and its phone's, prefix's and global
//! windows keep a declined send, as they keep a number refused for good,
//! or a backend relaying no `ip` would make one provider call per
//! request. A dropped connection naming no client is kept by the phone's
//! windows alone: during an outage behind a proxy every send meets it,
//! and the prefix's and global windows are everyone's.

use super::decision::GiveBack;
use super::SmsGuard;
use crate::domain::{ClientIp, SubjectKind};
use crate::guard::{event_member, Policy};
use crate::settings::LimitSetting;
use crate::store::{HitRequest, HitVerdict, WindowSpec};

/// The failed deliveries' window under the IP and network subjects.
pub const FAILED: &str = "sms_failed";

impl SmsGuard {
    /// What a declined send from `ip` gives back, `give_back` being what
    /// its failure alone says: a whole give-back is counted in the
    /// address's budget and its network's, and past either the address's
    /// windows keep the send (every window, for a send `address_counted`
    /// false: an allow-listed address's, which no address window counts;
    /// so it costs what a delivered send would). A send that names no
    /// client has no budget (`decision::without_a_budget`). Without the store's
    /// answer the send is not given back whole: an outage of the store
    /// must not lift the bound (a store that fails open,
    /// `store.on_error = "allow"`, answers allowed, and counts nothing
    /// then, as it chose).
    pub(super) async fn within_failure_budget(
        &self,
        policy: &Policy,
        give_back: GiveBack,
        ip: ClientIp,
        address_counted: bool,
    ) -> GiveBack {
        let GiveBack::Whole = give_back else {
            return give_back;
        };
        let settings = &policy.sms.settings;
        let address = Budget::new(
            self,
            SubjectKind::Ip,
            &ip.subject_id(),
            &settings.failed_delivery_limit,
        );
        if !self.spend(&address).await {
            return give_back.past_the_budget(address_counted);
        }
        let Some(network) = ip.network_id(settings.network_bits) else {
            return GiveBack::Whole;
        };
        let network = Budget::new(
            self,
            SubjectKind::Network,
            &network,
            &settings.failed_delivery_network_limit,
        );
        if self.spend(&network).await {
            return GiveBack::Whole;
        }
        if let Err(error) = self
            .ctx
            .store
            .undo(&address.key, &address.member, &address.windows)
            .await
        {
            tracing::warn!(request_id = %crate::telemetry::request_id(), %error, "a declined delivery's count could not be taken back from its address's budget");
        }
        give_back.past_the_budget(address_counted)
    }

    /// Count one declined send in `budget`: whether it had room (false
    /// when the store could not tell).
    async fn spend(&self, budget: &Budget) -> bool {
        let hit = HitRequest {
            key: &budget.key,
            windows: &budget.windows,
            member: &budget.member,
            gate_open: false,
            force: false,
        };
        match self.ctx.store.hit(hit).await {
            Ok(outcome) => outcome.verdict == HitVerdict::Allowed,
            Err(error) => {
                tracing::warn!(request_id = %crate::telemetry::request_id(), %error, "a declined delivery could not be counted; the address's windows keep the send");
                false
            }
        }
    }
}

/// One subject's budget of declined sends, and this send's entry in it.
struct Budget {
    key: String,
    windows: [WindowSpec; 1],
    member: String,
}

impl Budget {
    fn new(guard: &SmsGuard, kind: SubjectKind, id: &str, limit: &LimitSetting) -> Self {
        Budget {
            key: guard.ctx.keys.window(kind.as_str(), id, FAILED),
            windows: [WindowSpec::enforce(
                limit.limit,
                limit.window.as_millis() as u64,
            )],
            member: event_member(),
        }
    }
}
