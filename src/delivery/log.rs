//! `sms.provider.kind = "log"`: messages go to the log instead of a phone.

use async_trait::async_trait;

use super::{DeliveryError, SmsMessage, SmsSender};

/// Development provider: prints the message, code included, to the log.
#[derive(Debug, Default)]
pub struct LogSender;

#[async_trait]
impl SmsSender for LogSender {
    async fn send(&self, message: &SmsMessage) -> Result<(), DeliveryError> {
        tracing::warn!(
            target: "tollgate::sms",
            request_id = %message.request_id,
            to = %message.to_masked,
            locale = %message.locale,
            body = %message.body,
            "sms.provider.kind = \"log\": not delivered, printed here (development only)"
        );
        Ok(())
    }
}
