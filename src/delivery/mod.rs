//! Getting a code to a phone.

mod log;
mod template;

pub use self::log::LogSender;
pub use template::render_sms;

use async_trait::async_trait;

/// One SMS, already rendered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SmsMessage {
    /// E.164.
    pub to: String,
    pub body: String,
    pub locale: String,
    pub request_id: String,
}

#[derive(Debug, thiserror::Error)]
pub enum DeliveryError {
    #[error("provider answered {0}")]
    Rejected(String),
    #[error("provider unreachable: {0}")]
    Unreachable(String),
}

#[async_trait]
pub trait SmsSender: Send + Sync {
    /// Deliver once; never retried, so a phone never gets two different codes.
    async fn send(&self, message: &SmsMessage) -> Result<(), DeliveryError>;
}
