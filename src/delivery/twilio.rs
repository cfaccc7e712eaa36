//! `sms.provider.kind = "twilio"`: the form `To`, `From`, `Body` POSTed with
//! HTTP Basic `account_sid:auth_token` to
//! `{url}/2010-04-01/Accounts/{account_sid}/Messages.json`.

use async_trait::async_trait;
use reqwest::header::HeaderMap;
use serde::Deserialize;

use super::{http_client, DeliveryError, SetupError, SmsMessage, SmsSender};
use crate::settings::SmsProviderSettings;

/// Used when `sms.provider.url` is empty.
pub const TWILIO_API: &str = "https://api.twilio.com";

/// Sends through Twilio's Messages API.
pub struct TwilioSender {
    http: reqwest::Client,
    messages_url: String,
    account_sid: String,
    auth_token: String,
    from: String,
}

/// The part of Twilio's error answer worth logging (its `message` may quote
/// the phone number, so it is left out).
#[derive(Deserialize)]
struct TwilioError {
    code: Option<u64>,
}

impl TwilioSender {
    /// Builds the Messages URL from `sms.provider.url` (or `TWILIO_API`) and
    /// the account SID.
    pub fn new(settings: &SmsProviderSettings) -> Result<Self, SetupError> {
        let base = if settings.url.is_empty() {
            TWILIO_API
        } else {
            settings.url.expose().trim_end_matches('/')
        };
        Ok(Self {
            http: http_client(settings.timeout, HeaderMap::new())?,
            messages_url: format!(
                "{base}/2010-04-01/Accounts/{}/Messages.json",
                settings.account_sid
            ),
            account_sid: settings.account_sid.clone(),
            auth_token: settings.auth_token.expose().to_string(),
            from: settings.from.clone(),
        })
    }
}

#[async_trait]
impl SmsSender for TwilioSender {
    async fn send(&self, message: &SmsMessage) -> Result<(), DeliveryError> {
        let form = [
            ("To", message.to.as_str()),
            ("From", self.from.as_str()),
            ("Body", message.body.as_str()),
        ];
        let response = self
            .http
            .post(&self.messages_url)
            .basic_auth(&self.account_sid, Some(&self.auth_token))
            .form(&form)
            .send()
            .await
            .map_err(DeliveryError::from_reqwest)?;
        let status = response.status();
        if status.is_success() {
            return Ok(());
        }
        let code = crate::answer_body::json::<TwilioError>(response)
            .await
            .ok()
            .and_then(|e| e.code);
        Err(DeliveryError::Rejected(match code {
            Some(code) => format!("twilio answered {status}, error code {code}"),
            None => format!("twilio answered {status}"),
        }))
    }
}
