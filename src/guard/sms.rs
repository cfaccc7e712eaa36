//! `POST /sms/send` and `POST /sms/verify` decisions.

mod refusal;

pub use refusal::SmsRefusal;
use refusal::{refusal_row, region_allowed};

use std::sync::Arc;

use tokio::sync::OnceCell;

use super::reserve::{reserve, Offer, Reservation, SubjectHit};
use super::{ceil_secs, code, pumping, GuardContext, Policy, RequestInfo};
use crate::audit::{AuditDecision, AuditEvent};
use crate::captcha::CaptchaProof;
use crate::delivery::{DeliveryError, SmsMessage, SmsSender, TemplatesCell};
use crate::domain::{Action, Locale, PhoneNumber, Reason, Subject, SubjectKind};
use crate::lists::Listed;
use crate::store::{CodeToStore, OtpOutcome, StoreError};

/// A parsed `/sms/send`.
pub struct SendRequest {
    /// Where the code goes.
    pub phone: PhoneNumber,
    /// The language of the text; `en` when absent or without texts.
    pub locale: Option<Locale>,
    /// The captcha proof the request carries, if any.
    pub captcha: CaptchaProof,
}

/// A code that was sent, as the caller hears of it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sent {
    /// The phone as answers and logs show it (`+86138****8000`).
    pub masked_phone: String,
    /// How long the code stays valid, in seconds.
    pub code_ttl_secs: u64,
    /// When this phone's next send would pass the phone windows (0: at once).
    pub resend_after_secs: u64,
    /// Whether the next send will need a captcha.
    pub captcha_required: bool,
    /// The phone's enforced window with the fewest sends left, after this
    /// one (none in shadow mode or for an allow-listed send).
    pub quota: Option<Quota>,
}

/// One window's quota, as the `RateLimit` headers tell it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Quota {
    /// Sends the window allows.
    pub limit: u32,
    /// Its length, in seconds.
    pub window_secs: u64,
    /// Sends it still allows now.
    pub remaining: u32,
}

/// A verify's answer when it is not refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verified {
    /// The code was right, and is used up.
    Valid,
    /// Wrong, or there is no code to check; `attempts_left` counts the wrong
    /// tries left (0 when there is no code).
    Invalid { attempts_left: u32 },
}

/// The SMS decisions: sends codes through the provider and checks them.
pub struct SmsGuard {
    ctx: GuardContext,
    sender: Arc<dyn SmsSender>,
    templates: Arc<TemplatesCell>,
    configured_secret: Option<Vec<u8>>,
    shared_secret: OnceCell<Vec<u8>>,
}

impl SmsGuard {
    /// Codes go out through `sender`, in the texts `templates` holds at the
    /// time. `code_secret` empty: a random key is created once in the store
    /// and shared by every instance.
    pub fn new(
        ctx: GuardContext,
        sender: Arc<dyn SmsSender>,
        templates: Arc<TemplatesCell>,
        code_secret: &str,
    ) -> Self {
        Self {
            ctx,
            sender,
            templates,
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

    /// Send a code (DESIGN.md §3, in order): the region, then the pumping
    /// guard, every subject's windows and the code in one reservation, then
    /// delivery, which gives the reservation back when it fails.
    pub async fn send(&self, req: SendRequest, info: &RequestInfo) -> Result<Sent, SmsRefusal> {
        let policy = self.ctx.policy.current();
        let sms = &policy.sms;
        let phone = Subject::new(SubjectKind::Phone, req.phone.e164());
        let listed = self.ctx.listed(
            Action::SmsSend,
            info,
            (SubjectKind::Phone, req.phone.e164()),
            policy.sms_shadow,
            false,
        );
        if let (Listed::Blocked(kind), false) = (listed, policy.sms_shadow) {
            return Err(SmsRefusal::Blocklisted(kind));
        }
        // The region rule is policy, not a limit: an allow entry does not lift it.
        let region = req.phone.region();
        if !region_allowed(region, &sms.allowed_regions, &sms.denied_regions) {
            let row = AuditEvent::new(
                Action::SmsSend,
                AuditDecision::Deny,
                Reason::RegionBlocked,
                &phone,
            );
            self.ctx.audit(info, row.shadow(policy.sms_shadow));
            if !policy.sms_shadow {
                let region = region.map(str::to_string);
                return Err(SmsRefusal::RegionBlocked { region });
            }
        }
        if let Listed::Allowed(_) = listed {
            return self.send_exempt(&req, &phone, info).await;
        }
        let remote_ip = info.ip.map(|ip| ip.to_string());
        let captcha_passed = policy
            .captcha
            .passed(&req.captcha, remote_ip.as_deref())
            .await;
        let otp_key = self.ctx.keys.subject_code(&phone);
        let hits = self.subject_hits(&policy, &req.phone, phone, info);
        let ip_index = info
            .ip
            .and_then(|_| hits.iter().position(|h| h.subject.kind == SubjectKind::Ip));

        // The code is drawn and sealed before the store call, so that it is
        // stored in the same round trip as the reservation.
        let code = code::generate(sms.code_length);
        let mac = code::mac(self.secret().await?, req.phone.e164(), &code);
        let code_to_store = CodeToStore {
            key: &otp_key,
            mac: &mac,
            attempts: sms.max_verify_attempts,
            ttl_ms: sms.code_ttl.as_millis() as u64,
        };
        let store = self.ctx.store.as_ref();
        let offer = Offer {
            hits,
            conversions: pumping::subjects(&policy, &self.ctx.keys, &req.phone),
            member: super::event_member(),
            gate_open: captcha_passed,
            force: policy.sms_shadow,
            code: Some(code_to_store),
        };
        let reservation = reserve(store, offer).await?;
        reservation.count_rule_hits(policy.sms_shadow);
        // The pumping guard was asked first: its block answers before any window.
        if self
            .pumping_refuses(&reservation, policy.sms_shadow, info)
            .await
        {
            return Err(SmsRefusal::PumpingSuspected);
        }
        if let Some(refusal) = &reservation.refusal {
            self.ctx
                .audit(info, refusal_row(refusal).shadow(policy.sms_shadow));
            if !policy.sms_shadow {
                return Err(SmsRefusal::from(refusal));
            }
        }
        // Rules on trial: what they would have refused, audited, not enforced.
        for observed in reservation.observed_refusals() {
            self.ctx.audit(info, refusal_row(&observed).shadow(true));
        }
        if let Err(error) = self
            .deliver(&req, &code, sms.code_ttl.as_secs(), info)
            .await
        {
            reservation.roll_back(store).await;
            if let Err(e) = store.delete(std::slice::from_ref(&otp_key)).await {
                tracing::warn!(request_id = %crate::telemetry::request_id(), error = %e, "could not delete the code of a failed send");
            }
            return Err(error.into());
        }
        // In shadow mode nothing was refused, so nothing is said to wait for.
        let enforced = !policy.sms_shadow;
        let resend_after_ms = reservation
            .outcome_of(0)
            .map_or(0, |o| o.next_retry_after_ms);
        let captcha_required = reservation.gate_reached_after(0)
            || ip_index.is_some_and(|i| reservation.gate_reached_after(i));
        // The enforced rules come first among the phone's windows.
        let quota = reservation
            .outcome_of(0)
            .filter(|_| enforced)
            .and_then(|o| {
                let rules = policy.sms_phone.rules.iter().zip(&o.counts);
                rules
                    .filter(|(rule, _)| !rule.shadow)
                    .map(|(rule, count)| Quota {
                        limit: rule.limit,
                        window_secs: rule.window.as_secs(),
                        remaining: rule.limit.saturating_sub(count + 1),
                    })
                    .min_by_key(|q| q.remaining)
            });
        Ok(Sent {
            masked_phone: req.phone.masked(),
            code_ttl_secs: sms.code_ttl.as_secs(),
            resend_after_secs: if enforced {
                ceil_secs(resend_after_ms)
            } else {
                0
            },
            captcha_required: enforced && captcha_required,
            quota,
        })
    }

    /// A send for an allow-listed IP or phone (its region allowed): no
    /// window, captcha tier or pumping block applies and nothing is counted; the code is stored, then sent
    /// (and deleted again when delivery fails).
    async fn send_exempt(
        &self,
        req: &SendRequest,
        phone: &Subject,
        info: &RequestInfo,
    ) -> Result<Sent, SmsRefusal> {
        let policy = self.ctx.policy.current();
        let sms = &policy.sms;
        let otp_key = self.ctx.keys.subject_code(phone);
        let code = code::generate(sms.code_length);
        let mac = code::mac(self.secret().await?, req.phone.e164(), &code);
        let ttl_ms = sms.code_ttl.as_millis() as u64;
        self.ctx
            .store
            .otp_put(&otp_key, &mac, sms.max_verify_attempts, ttl_ms)
            .await?;
        if let Err(error) = self.deliver(req, &code, sms.code_ttl.as_secs(), info).await {
            if let Err(e) = self.ctx.store.delete(std::slice::from_ref(&otp_key)).await {
                tracing::warn!(request_id = %crate::telemetry::request_id(), error = %e, "could not delete the code of a failed send");
            }
            return Err(error.into());
        }
        Ok(Sent {
            masked_phone: req.phone.masked(),
            code_ttl_secs: sms.code_ttl.as_secs(),
            resend_after_secs: 0,
            captcha_required: false,
            quota: None,
        })
    }

    /// Audit what the pumping guard found, and list the blocks this send
    /// made; whether that refuses the send (never in shadow mode, where the
    /// rows are marked and the block is the store's shadow one).
    async fn pumping_refuses(
        &self,
        reservation: &Reservation<'_>,
        shadow: bool,
        info: &RequestInfo,
    ) -> bool {
        let findings = pumping::findings(reservation);
        for finding in &findings {
            self.ctx.audit(info, finding.row.clone().shadow(shadow));
            if finding.decision == AuditDecision::Lock && !shadow {
                pumping::list_block(&self.ctx, finding.subject, finding.lasts_ms).await;
            }
        }
        !findings.is_empty() && !shadow
    }

    /// The subjects a send counts against, the phone first: its IP, its
    /// number prefix and the global count, each where it has windows.
    fn subject_hits<'p>(
        &self,
        policy: &'p Policy,
        number: &PhoneNumber,
        phone: Subject,
        info: &RequestInfo,
    ) -> Vec<SubjectHit<'p>> {
        let hit = |subject: Subject, rules| SubjectHit {
            key: self.ctx.keys.subject_window(&subject, Action::SmsSend),
            subject,
            rules,
        };
        let others = [
            (
                SubjectKind::Ip,
                info.ip.map(|ip| ip.subject_id()),
                &policy.sms_ip,
            ),
            (
                SubjectKind::Prefix,
                Some(number.prefix(policy.sms.prefix_digits as usize)),
                &policy.sms_prefix,
            ),
            (
                SubjectKind::Global,
                Some(Action::SmsSend.as_str().to_string()),
                &policy.sms_global,
            ),
        ];
        let mut hits = vec![hit(phone, &policy.sms_phone)];
        for (kind, id, rules) in others {
            if let (Some(id), false) = (id, rules.windows().is_empty()) {
                hits.push(hit(Subject::new(kind, id), rules));
            }
        }
        hits
    }

    /// Render the code's text in the asked locale and hand it to the provider.
    async fn deliver(
        &self,
        req: &SendRequest,
        code: &str,
        ttl_secs: u64,
        info: &RequestInfo,
    ) -> Result<(), DeliveryError> {
        let (locale, body) = self.templates.current().render_sms(
            req.locale.as_ref().map(Locale::as_str),
            code,
            ttl_secs,
        )?;
        let message = SmsMessage {
            to: req.phone.e164().to_string(),
            to_masked: req.phone.masked(),
            body,
            locale,
            request_id: info.request_id.clone(),
        };
        self.sender.send(&message).await
    }

    /// Check `code` against the phone's pending code. The wrong try that burns
    /// it is audited; after that, tries are refused as rate limited until a new
    /// send replaces it or it expires.
    pub async fn verify(
        &self,
        phone: &PhoneNumber,
        code: &str,
        info: &RequestInfo,
    ) -> Result<Verified, SmsRefusal> {
        let policy = self.ctx.policy.current();
        let sms = &policy.sms;
        let subject = Subject::new(SubjectKind::Phone, phone.e164());
        let listed = self.ctx.listed(
            Action::SmsVerify,
            info,
            (SubjectKind::Phone, phone.e164()),
            policy.sms_shadow,
            false,
        );
        if let (Listed::Blocked(kind), false) = (listed, policy.sms_shadow) {
            return Err(SmsRefusal::Blocklisted(kind));
        }
        let attempts_rule = policy.verify_attempts;
        let mac = code::mac(self.secret().await?, phone.e164(), code.trim());
        let otp_key = self.ctx.keys.subject_code(&subject);
        let checked = self.ctx.store.otp_check(&otp_key, &mac).await?;
        count_verify_hit(&policy, checked);
        match checked {
            OtpOutcome::Valid { .. } => {
                pumping::count_verified(&self.ctx, &policy, phone).await;
                Ok(Verified::Valid)
            }
            OtpOutcome::Missing => Ok(Verified::Invalid { attempts_left: 0 }),
            OtpOutcome::Wrong { attempts_left } => {
                if attempts_left == 0 {
                    let event = AuditEvent::new(
                        Action::SmsVerify,
                        AuditDecision::Deny,
                        Reason::VerifyAttemptsExhausted,
                        &subject,
                    )
                    .rule(&attempts_rule, sms.max_verify_attempts);
                    self.ctx.audit(info, event);
                }
                Ok(Verified::Invalid { attempts_left })
            }
            OtpOutcome::Burnt { retry_after_ms } => {
                let event = AuditEvent::new(
                    Action::SmsVerify,
                    AuditDecision::Deny,
                    Reason::RateLimited,
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
}

/// One hit on the verify rule (`phone 5/5m`: wrong tries per code) for a
/// try on a code; a verify that found no code hits nothing. The count is
/// the wrong tries the code had taken before this one; a burnt code is over
/// the limit. Verify is never relaxed by shadow mode.
fn count_verify_hit(policy: &Policy, checked: OtpOutcome) {
    let max = policy.verify_attempts.limit;
    let (count, over) = match checked {
        OtpOutcome::Valid { attempts_left } => (max.saturating_sub(attempts_left), false),
        OtpOutcome::Wrong { attempts_left } => (max.saturating_sub(attempts_left + 1), false),
        OtpOutcome::Burnt { .. } => (max, true),
        OtpOutcome::Missing => return,
    };
    policy.verify_counters.hit_with(count, over, false);
}
