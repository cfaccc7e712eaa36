//! Why a send or a verify is refused: the error each refusal maps to, the
//! audit row of a window's refusal, and the region rule.

use super::super::reserve::{Refusal, RefusalKind};
use crate::audit::{AuditDecision, AuditEvent};
use crate::delivery::DeliveryError;
use crate::domain::{Action, Reason, NO_REGION};
use crate::lists::EntryKind;
use crate::store::StoreError;

/// Why a send or a verify was refused; each maps to one error code.
#[derive(Debug, thiserror::Error)]
pub enum SmsRefusal {
    /// The IP or phone is on the block list (403 `blocklisted`).
    #[error("the {} is on the block list", .0.as_str())]
    Blocklisted(EntryKind),
    /// The phone's region may not receive codes (403 `region_blocked`).
    #[error("sending to region {region:?} is not allowed")]
    RegionBlocked {
        /// The phone's ISO 3166 region, when the number belongs to one.
        region: Option<String>,
    },
    /// A captcha tier is reached, or the country is challenged by the
    /// pumping guard, and no captcha passed (403 `captcha_required`).
    #[error("a captcha is required")]
    CaptchaRequired,
    /// Too few codes sent to the phone's number prefix or country were
    /// verified: it is blocked as a likely target of SMS pumping (403
    /// `pumping_suspected`).
    #[error("sending codes to this number range is suspended")]
    PumpingSuspected,
    /// A window is full, or the code is burnt (429 `rate_limited`).
    #[error("rate limited by {rule}")]
    RateLimited {
        /// The refusing rule's name (`phone 5/1h`): a full window's, or
        /// `sms.verify_attempts` for a burnt code.
        rule: String,
        /// How long until the window admits a try, or the burnt code expires.
        retry_after_ms: u64,
    },
    /// The text could not be rendered or the provider did not take it; the
    /// reservation was given back as the failure says (`decision::give_back`:
    /// whole, all but the address's windows, or, when the provider timed
    /// out, only the pumping count). 502 `delivery_failed`.
    #[error("delivery failed: {0}")]
    DeliveryFailed(#[from] DeliveryError),
    /// The store could not answer (503 `store_unavailable`).
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// The audit row of a reservation's refusal of `action`.
pub(super) fn refusal_row(action: Action, refusal: &Refusal) -> AuditEvent {
    let row = |decision, reason| {
        AuditEvent::new(action, decision, reason, &refusal.subject)
            .rule(&refusal.rule, refusal.observed)
    };
    match refusal.kind {
        RefusalKind::RateLimited { retry_after_ms } => {
            row(AuditDecision::Deny, Reason::RateLimited).retry_after_ms(retry_after_ms)
        }
        RefusalKind::CaptchaRequired => row(AuditDecision::Challenge, Reason::CaptchaRequired),
    }
}

impl From<&Refusal> for SmsRefusal {
    fn from(refusal: &Refusal) -> Self {
        match refusal.kind {
            RefusalKind::RateLimited { retry_after_ms } => SmsRefusal::RateLimited {
                rule: refusal.rule.name(),
                retry_after_ms,
            },
            RefusalKind::CaptchaRequired => SmsRefusal::CaptchaRequired,
        }
    }
}

/// `sms.allowed_regions` and `sms.denied_regions` on a phone's region;
/// `"001"` names the numbers of no region (`NO_REGION`).
pub(super) fn region_allowed(region: Option<&str>, allowed: &[String], denied: &[String]) -> bool {
    let region = region.unwrap_or(NO_REGION);
    let listed = |list: &[String]| list.iter().any(|l| l.eq_ignore_ascii_case(region));
    (allowed.is_empty() || listed(allowed)) && !listed(denied)
}

#[cfg(test)]
mod tests {
    use super::region_allowed;

    #[test]
    fn region_lists_allow_and_deny() {
        let s = |v: &[&str]| v.iter().map(|x| x.to_string()).collect::<Vec<_>>();
        assert!(region_allowed(Some("CN"), &[], &[]));
        assert!(region_allowed(Some("CN"), &s(&["cn"]), &[]));
        assert!(!region_allowed(Some("US"), &s(&["CN"]), &[]));
        assert!(!region_allowed(Some("CN"), &[], &s(&["CN"])));
        assert!(!region_allowed(None, &s(&["CN"]), &[]));
        assert!(region_allowed(None, &[], &s(&["CN"])));
        // "001": the numbers no region claims (+800, +881, ...)
        assert!(!region_allowed(None, &[], &s(&["001"])));
        assert!(region_allowed(None, &s(&["CN", "001"]), &[]));
        assert!(region_allowed(Some("CN"), &[], &s(&["001"])));
    }
}
