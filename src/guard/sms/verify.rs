//! `POST /sms/verify`: the client IP's (and its network's) failed tries
//! first, then the code (or its stand-in).

use super::decision::{self, Pass};
use super::{SmsGuard, SmsRefusal, Verified};
use crate::audit::{AuditDecision, AuditEvent};
use crate::domain::{Action, PhoneNumber, Reason, Rule, Subject, SubjectKind};
use crate::guard::reserve::{reserve, Offer, Reservation, SubjectHit};
use crate::guard::{code, pumping, Lookup, Policy, RequestInfo};
use crate::store::{CodeTry, OtpOutcome};

impl SmsGuard {
    /// Check `code` against the phone's pending code. The client IP's
    /// failed tries are checked first (`sms.verify_ip_limits`, and an IPv6
    /// client's network's, `sms.verify_network_limits`): a throttled
    /// address is refused before the code is looked at, so it neither
    /// learns whether one is pending nor uses up a try; a right code gives
    /// its try back. Without a pending code a stand-in counts the tries, so
    /// the answers read as a code's would. The address that asked for the
    /// code has its own tries, everyone else shares as many: the wrong try
    /// that uses up either is audited; after that, those tries are refused
    /// as rate limited until a new send replaces the code or it expires
    /// (the asker's last try burns it for everyone). `code` comes trimmed
    /// from the route.
    pub async fn verify(
        &self,
        phone: &PhoneNumber,
        code: &str,
        info: &RequestInfo,
    ) -> Result<Verified, SmsRefusal> {
        let policy = self.ctx.policy.current();
        let sms = &policy.sms.settings;
        let subject = Subject::new(SubjectKind::Phone, phone.e164());
        let subject_id = (SubjectKind::Phone, phone.e164());
        let listing = self
            .ctx
            .listed(Action::SmsVerify, info, subject_id, Lookup::Attempt);
        let screened = decision::lists(listing, info.client_ip().is_some());
        let address_try = match self.apply(screened, &policy, info).await? {
            // An allow-listed address's tries are not counted against it;
            // each code's own tries still bound them.
            Pass::Exempt | Pass::AddressExempt => None,
            // An allow-listed phone's tries count against their address as
            // any other's: its codes come without end.
            Pass::Counted | Pass::AskerCounted | Pass::RangeAllowed => {
                self.verify_try(&policy, info).await?
            }
        };
        let mac = code::mac(self.secret().await?, phone.e164(), code);
        let otp_key = self.ctx.keys.subject_code(&subject);
        let client = self.code_client(info);
        let checked = self
            .ctx
            .store
            .otp_check(CodeTry {
                key: &otp_key,
                mac: &mac,
                client: &client,
                attempts: sms.max_verify_attempts,
                ttl_ms: sms.code_ttl.as_millis() as u64,
            })
            .await?;
        count_verify_hit(&policy, checked);
        if let Some(row) = code_row(checked, &policy.sms.verify_attempts, &subject) {
            self.ctx.audit(info, row);
        }
        match checked {
            OtpOutcome::Valid { counted, .. } => {
                if let Some(address_try) = address_try {
                    address_try.roll_back(self.ctx.store.as_ref()).await;
                }
                // A code whose send was not counted (an allow-listed phone's
                // or address's) is not counted verified either: it would
                // hide as many unverified sends to its range. The code
                // says so, not the verify's own address or lists.
                if counted {
                    pumping::count_verified(&self.ctx, &policy, phone).await;
                }
                Ok(Verified::Valid)
            }
            OtpOutcome::Wrong { attempts_left } => Ok(Verified::Invalid { attempts_left }),
            OtpOutcome::Burnt { retry_after_ms } => Err(SmsRefusal::RateLimited {
                rule: policy.sms.verify_attempts.name(),
                retry_after_ms,
            }),
        }
    }

    /// Count this verify try against the client IP's windows
    /// (`sms.verify_ip_limits`) and an IPv6 client's network's
    /// (`sms.verify_network_limits`: one /48 holds 65,536 /64s, each with
    /// its own windows), refusing it when one is full. The reservation is
    /// kept, to give the try back when the code is right; none without an
    /// IP or windows. Refusals (and what rules on trial would refuse) are
    /// audited as a send's are; shadow mode refuses nothing.
    async fn verify_try<'p>(
        &self,
        policy: &'p Policy,
        info: &RequestInfo,
    ) -> Result<Option<Reservation<'p>>, SmsRefusal> {
        // Not a backend's own address: every user's tries would add up
        // under it, and thirty typos an hour, anyone's, would refuse every
        // verify (`routes::caller` counts and reports such calls).
        let Some(ip) = info.client_ip() else {
            return Ok(None);
        };
        let network_bits = policy.sms.settings.network_bits;
        let subjects = [
            Some(Subject::new(SubjectKind::Ip, ip.subject_id())),
            ip.network_id(network_bits)
                .map(|id| Subject::new(SubjectKind::Network, id)),
        ];
        let hits: Vec<SubjectHit<'p>> = subjects
            .into_iter()
            .flatten()
            .filter_map(|subject| self.hit(policy, Action::SmsVerify, subject, false))
            .collect();
        if hits.is_empty() {
            return Ok(None);
        }
        let offer = Offer {
            hits,
            conversions: Vec::new(),
            member: crate::guard::event_member(),
            gate_open: false,
            force: policy.sms.shadow,
            code: None,
        };
        let reservation = reserve(self.ctx.store.as_ref(), offer).await?;
        reservation.count_rule_hits(policy.sms.shadow);
        let decided = decision::verify_try(&reservation);
        self.apply(decided, policy, info).await?;
        Ok(Some(reservation))
    }
}

/// One hit on the verify rule (`phone 5/5m`: wrong tries per code) for a
/// try on a code (or its stand-in). The count is the wrong tries the code
/// had taken before this one in the trying address's share (the asker's,
/// or everyone else's); a burnt code, or a used-up share, is over the
/// limit. Verify is never relaxed by shadow mode.
fn count_verify_hit(policy: &Policy, checked: OtpOutcome) {
    let max = policy.sms.verify_attempts.limit;
    let (count, over) = match checked {
        OtpOutcome::Valid { attempts_left, .. } => (max.saturating_sub(attempts_left), false),
        OtpOutcome::Wrong { attempts_left } => (max.saturating_sub(attempts_left + 1), false),
        OtpOutcome::Burnt { .. } => (max, true),
    };
    policy.sms.verify_counters.hit_with(count, over, false);
}

/// The audit row of a try on a code: the wrong try that burns it or uses
/// up the strangers' share of its tries, and every try refused after.
/// Verify is never relaxed by shadow mode.
fn code_row(checked: OtpOutcome, rule: &Rule, phone: &Subject) -> Option<AuditEvent> {
    let row = |reason| {
        AuditEvent::new(Action::SmsVerify, AuditDecision::Deny, reason, phone)
            .rule(rule, rule.limit)
    };
    match checked {
        OtpOutcome::Valid { .. } | OtpOutcome::Wrong { attempts_left: 1.. } => None,
        OtpOutcome::Wrong { attempts_left: 0 } => Some(row(Reason::VerifyAttemptsExhausted)),
        OtpOutcome::Burnt { retry_after_ms } => {
            Some(row(Reason::RateLimited).retry_after_ms(retry_after_ms))
        }
    }
}
