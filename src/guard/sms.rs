//! `POST /sms/send` and `POST /sms/verify` decisions.

mod decision;
mod failed_deliveries;
mod refusal;
mod send;
mod verify;

pub use failed_deliveries::FAILED as FAILED_DELIVERIES;
pub use refusal::SmsRefusal;

use std::sync::Arc;

use tokio::sync::OnceCell;

use super::{code, pumping, GuardContext, Policy, RequestInfo};
use crate::captcha::CaptchaProof;
use crate::delivery::{SenderCell, TemplatesCell};
use crate::domain::{Action, Locale, PhoneNumber, Subject};
use crate::guard::reserve::SubjectHit;
use crate::store::StoreError;
use decision::{Answer, Decision, Settled};

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
    /// Wrong, or there is no code to check (a stand-in counts the tries
    /// then, so that the two read alike).
    Invalid {
        /// The wrong tries left.
        attempts_left: u32,
    },
}

/// The SMS decisions: sends codes through the provider and checks them.
pub struct SmsGuard {
    ctx: GuardContext,
    sender: Arc<SenderCell>,
    templates: Arc<TemplatesCell>,
    configured_secret: Option<Vec<u8>>,
    shared_secret: OnceCell<Vec<u8>>,
}

impl SmsGuard {
    /// Codes go out through the provider `sender` holds, in the texts
    /// `templates` holds, at the time. `code_secret` empty: a random key is
    /// created once in the store and shared by every instance.
    pub fn new(
        ctx: GuardContext,
        sender: Arc<SenderCell>,
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

    /// How a code names the address that asks for it or tries it: its IP
    /// subject's id as `Keys::code_asker` keeps it; `""` without an IP.
    /// A send and a verify must name one address alike, or the asker would
    /// be a stranger to its own code. A backend that names no client is
    /// its codes' asker (`info.ip`, not `client_ip`): with no asker, every
    /// try would count in the strangers' share, and five wrong tries from
    /// anyone would refuse the backend's own verify of the user's code.
    fn code_client(&self, info: &RequestInfo) -> String {
        info.ip
            .map(|ip| self.ctx.keys.code_asker(ip.subject_id()))
            .unwrap_or_default()
    }

    /// `subject`'s counted windows for `action` as a reservation hit; none
    /// when the rulebook gives its kind no windows, unless `keep_empty`
    /// (a send's phone, which carries the code).
    fn hit<'p>(
        &self,
        policy: &'p Policy,
        action: Action,
        subject: Subject,
        keep_empty: bool,
    ) -> Option<SubjectHit<'p>> {
        let rules = policy.rules_for(action, subject.kind)?.counted()?;
        (keep_empty || !rules.windows().is_empty()).then(|| SubjectHit {
            key: self.ctx.keys.subject_window(&subject, action),
            subject,
            rules,
        })
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

    /// Apply a decision: in shadow mode (`sms.shadow` or `shadow.enabled`)
    /// after its one `shadowed` step; the rows written, the pumping blocks
    /// listed, then the answer.
    async fn apply<A: Answer>(
        &self,
        decided: Decision<A>,
        policy: &Policy,
        info: &RequestInfo,
    ) -> Result<A, SmsRefusal> {
        let decided = if policy.sms.shadow {
            decided.shadowed()
        } else {
            decided
        };
        let Settled {
            answer,
            rows,
            new_blocks,
        } = decided.settle();
        for row in rows {
            self.ctx.audit(info, row);
        }
        for (subject, block_ms) in &new_blocks {
            pumping::list_block(&self.ctx, subject, *block_ms).await;
        }
        answer
    }
}
