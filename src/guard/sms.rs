//! `POST /sms/send` and `POST /sms/verify` decisions.

use std::sync::Arc;

use tokio::sync::OnceCell;

use super::reserve::{reserve, Refusal, SubjectHit};
use super::{ceil_secs, code, GuardContext, RequestInfo};
use crate::audit::{AuditDecision, AuditEvent};
use crate::captcha::CaptchaProof;
use crate::delivery::{render_sms, DeliveryError, SmsMessage, SmsSender};
use crate::domain::{Action, PhoneNumber, Rule, Subject, SubjectKind};
use crate::store::{CodeToStore, OtpOutcome, StoreError};

pub struct SendRequest {
    pub phone: PhoneNumber,
    pub locale: Option<String>,
    pub captcha: CaptchaProof,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sent {
    pub masked_phone: String,
    pub code_ttl_secs: u64,
    pub resend_after_secs: u64,
    /// Whether the next send will need a captcha.
    pub captcha_required: bool,
}

#[derive(Debug, thiserror::Error)]
pub enum SmsRefusal {
    #[error("sending to region {region:?} is not allowed")]
    RegionBlocked { region: Option<String> },
    #[error("a captcha is required")]
    CaptchaRequired,
    #[error("rate limited by {rule}")]
    RateLimited { rule: String, retry_after_ms: u64 },
    #[error("delivery failed: {0}")]
    DeliveryFailed(#[from] DeliveryError),
    #[error(transparent)]
    Store(#[from] StoreError),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verified {
    Valid,
    Invalid { attempts_left: u32 },
}

pub struct SmsGuard {
    ctx: GuardContext,
    sender: Arc<dyn SmsSender>,
    configured_secret: Option<Vec<u8>>,
    shared_secret: OnceCell<Vec<u8>>,
}

impl SmsGuard {
    /// `code_secret` empty: a random key is created once in the store and
    /// shared by every instance.
    pub fn new(ctx: GuardContext, sender: Arc<dyn SmsSender>, code_secret: &str) -> Self {
        Self {
            ctx,
            sender,
            configured_secret: (!code_secret.is_empty()).then(|| code_secret.as_bytes().to_vec()),
            shared_secret: OnceCell::new(),
        }
    }

    async fn secret(&self) -> Result<&[u8], StoreError> {
        if let Some(secret) = &self.configured_secret {
            return Ok(secret);
        }
        let secret = self
            .shared_secret
            .get_or_try_init(|| async {
                let key = self.ctx.keys.secret("otp");
                let value = self
                    .ctx
                    .store
                    .get_or_init(&key, &code::random_secret())
                    .await?;
                Ok::<_, StoreError>(value.into_bytes())
            })
            .await?;
        Ok(secret)
    }

    pub async fn send(&self, req: SendRequest, info: &RequestInfo) -> Result<Sent, SmsRefusal> {
        let policy = self.ctx.policy.current();
        let sms = &policy.sms;
        let phone_subject = Subject::new(SubjectKind::Phone, req.phone.e164());

        if !region_allowed(
            req.phone.region(),
            &sms.allowed_regions,
            &sms.denied_regions,
        ) {
            let event = AuditEvent::new(
                Action::SmsSend,
                AuditDecision::Deny,
                "region_blocked",
                &phone_subject,
            )
            .shadow(policy.shadow);
            self.ctx.audit(info, event);
            if !policy.shadow {
                return Err(SmsRefusal::RegionBlocked {
                    region: req.phone.region().map(str::to_string),
                });
            }
        }

        let ip = info.ip.map(|ip| ip.subject_id());
        let remote_ip = info.ip.map(|ip| ip.to_string());
        let captcha_passed = policy
            .captcha
            .passed(&req.captcha, remote_ip.as_deref())
            .await;

        let keys = &self.ctx.keys;
        let action = Action::SmsSend.as_str();
        let window_key = |s: &Subject| keys.window(s.kind.as_str(), &s.id, action);
        let mut hits = vec![SubjectHit {
            key: window_key(&phone_subject),
            subject: phone_subject.clone(),
            rules: &policy.sms_phone,
        }];
        let ip_index = ip.as_ref().map(|_| hits.len());
        let prefix = req.phone.prefix(sms.prefix_digits as usize);
        let others = [
            (SubjectKind::Ip, ip.clone(), &policy.sms_ip),
            (SubjectKind::Prefix, Some(prefix), &policy.sms_prefix),
            (
                SubjectKind::Global,
                Some(action.to_string()),
                &policy.sms_global,
            ),
        ];
        for (kind, id, rules) in others {
            if let (Some(id), false) = (id, rules.windows().is_empty()) {
                let subject = Subject::new(kind, id);
                hits.push(SubjectHit {
                    key: window_key(&subject),
                    subject,
                    rules,
                });
            }
        }

        // The code is drawn and sealed before the store call, so that it is
        // stored in the same round trip as the reservation.
        let code = code::generate(sms.code_length);
        let mac = code::mac(self.secret().await?, req.phone.e164(), &code);
        let otp_key = keys.otp(SubjectKind::Phone.as_str(), req.phone.e164());
        let code_to_store = CodeToStore {
            key: &otp_key,
            mac: &mac,
            attempts: sms.max_verify_attempts,
            ttl_ms: sms.code_ttl.as_millis() as u64,
        };
        let member = super::event_member();
        let store = self.ctx.store.as_ref();
        let reservation = reserve(
            store,
            hits,
            member,
            captcha_passed,
            policy.shadow,
            Some(code_to_store),
        )
        .await?;
        if let Some(refusal) = &reservation.refusal {
            self.audit_refusal(info, refusal, policy.shadow);
            if !policy.shadow {
                return Err(match refusal.retry_after_ms {
                    Some(retry_after_ms) => SmsRefusal::RateLimited {
                        rule: refusal.rule.name(),
                        retry_after_ms,
                    },
                    None => SmsRefusal::CaptchaRequired,
                });
            }
        }

        let delivered = async {
            let (locale, body) = render_sms(req.locale.as_deref(), &code, sms.code_ttl.as_secs())
                .map_err(DeliveryError::from)?;
            let message = SmsMessage {
                to: req.phone.e164().to_string(),
                to_masked: req.phone.masked(),
                body,
                locale: locale.to_string(),
                request_id: info.request_id.clone(),
            };
            self.sender.send(&message).await
        }
        .await;
        if let Err(error) = delivered {
            reservation.roll_back(store).await;
            if let Err(e) = store.delete(std::slice::from_ref(&otp_key)).await {
                tracing::warn!(request_id = %crate::telemetry::request_id(), error = %e, "could not delete the code of a failed send");
            }
            return Err(error.into());
        }

        let phone_outcome = reservation.outcome_of(0);
        let resend_after_ms = if policy.shadow {
            0
        } else {
            phone_outcome.map_or(0, |o| o.next_retry_after_ms)
        };
        let captcha_required = !policy.shadow
            && (reservation.gate_reached_after(0)
                || ip_index.is_some_and(|i| reservation.gate_reached_after(i)));
        Ok(Sent {
            masked_phone: req.phone.masked(),
            code_ttl_secs: sms.code_ttl.as_secs(),
            resend_after_secs: ceil_secs(resend_after_ms),
            captcha_required,
        })
    }

    pub async fn verify(
        &self,
        phone: &PhoneNumber,
        code: &str,
        info: &RequestInfo,
    ) -> Result<Verified, SmsRefusal> {
        let policy = self.ctx.policy.current();
        let sms = &policy.sms;
        let attempts_rule = Rule::new(SubjectKind::Phone, sms.max_verify_attempts, sms.code_ttl);
        let mac = code::mac(self.secret().await?, phone.e164(), code.trim());
        let otp_key = self.ctx.keys.otp(SubjectKind::Phone.as_str(), phone.e164());
        match self.ctx.store.otp_check(&otp_key, &mac).await? {
            OtpOutcome::Valid => Ok(Verified::Valid),
            OtpOutcome::Missing => Ok(Verified::Invalid { attempts_left: 0 }),
            OtpOutcome::Wrong { attempts_left } => {
                if attempts_left == 0 {
                    let subject = Subject::new(SubjectKind::Phone, phone.e164());
                    let event = AuditEvent::new(
                        Action::SmsVerify,
                        AuditDecision::Deny,
                        "verify_attempts_exhausted",
                        &subject,
                    )
                    .rule(&attempts_rule, sms.max_verify_attempts);
                    self.ctx.audit(info, event);
                }
                Ok(Verified::Invalid { attempts_left })
            }
            OtpOutcome::Burnt { retry_after_ms } => {
                let subject = Subject::new(SubjectKind::Phone, phone.e164());
                let event = AuditEvent::new(
                    Action::SmsVerify,
                    AuditDecision::Deny,
                    "rate_limited",
                    &subject,
                )
                .rule(&attempts_rule, sms.max_verify_attempts)
                .retry_after_ms(retry_after_ms);
                self.ctx.audit(info, event);
                Err(SmsRefusal::RateLimited {
                    rule: attempts_rule.name(),
                    retry_after_ms,
                })
            }
        }
    }

    fn audit_refusal(&self, info: &RequestInfo, refusal: &Refusal, shadow: bool) {
        let (decision, reason) = match refusal.retry_after_ms {
            Some(_) => (AuditDecision::Deny, "rate_limited"),
            None => (AuditDecision::Challenge, "captcha_required"),
        };
        let mut event = AuditEvent::new(Action::SmsSend, decision, reason, &refusal.subject)
            .rule(&refusal.rule, refusal.observed)
            .shadow(shadow);
        if let Some(ms) = refusal.retry_after_ms {
            event = event.retry_after_ms(ms);
        }
        self.ctx.audit(info, event);
    }
}

fn region_allowed(region: Option<&str>, allowed: &[String], denied: &[String]) -> bool {
    let listed =
        |list: &[String]| region.is_some_and(|r| list.iter().any(|l| l.eq_ignore_ascii_case(r)));
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
    }
}
