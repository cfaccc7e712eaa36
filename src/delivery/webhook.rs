//! `sms.provider.kind = "webhook"`: POST `{"to", "body", "locale", "request_id"}`
//! as JSON to `sms.provider.url` with the configured headers; any 2xx is
//! success, a 422 refuses the number.

use async_trait::async_trait;
use reqwest::StatusCode;
use serde::Serialize;

use super::{http_client, Blame, DeliveryError, SetupError, SmsMessage, SmsSender};
use crate::settings::SmsProviderSettings;

/// POSTs each message as JSON to `sms.provider.url`.
pub struct WebhookSender {
    http: reqwest::Client,
    url: String,
}

#[derive(Serialize)]
struct Payload<'a> {
    to: &'a str,
    body: &'a str,
    locale: &'a str,
    request_id: &'a str,
}

impl WebhookSender {
    /// Checks the configured headers and builds the HTTP client.
    pub fn new(settings: &SmsProviderSettings) -> Result<Self, SetupError> {
        let headers = settings
            .header_map()
            .map_err(|(key, why)| SetupError::invalid(&key, why))?;
        Ok(Self {
            http: http_client(settings.timeout, headers)?,
            url: settings.url.expose().to_string(),
        })
    }
}

#[async_trait]
impl SmsSender for WebhookSender {
    async fn send(&self, message: &SmsMessage) -> Result<(), DeliveryError> {
        let payload = Payload {
            to: &message.to,
            body: &message.body,
            locale: &message.locale,
            request_id: &message.request_id,
        };
        let response = self
            .http
            .post(&self.url)
            .json(&payload)
            .send()
            .await
            .map_err(DeliveryError::from_reqwest)?;
        let status = response.status();
        if status.is_success() {
            Ok(())
        } else {
            Err(failure(status))
        }
    }
}

/// What a webhook's error status means: a 422 refuses the number
/// (docs/delivery.md asks gateways to answer so for a message they will
/// never deliver), a 400 declines this request (a number the gateway will
/// not take now): counted in the address's budget of failures, not at
/// once, since proxies, auth layers and gateways answer 400 for their own
/// faults too (a plain-HTTP request to a TLS port, a header too large).
/// Anything else (a 404 of a wrong URL, a 413 of a text too long, a
/// 5xx) is the set-up's or the gateway's, and costs no user anything.
fn failure(status: StatusCode) -> DeliveryError {
    let blame = match status {
        StatusCode::UNPROCESSABLE_ENTITY => Blame::Number,
        StatusCode::BAD_REQUEST => Blame::Request,
        _ => Blame::Provider,
    };
    DeliveryError::answered(blame, format!("webhook answered {status}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_422_refuses_the_number() {
        assert!(failure(StatusCode::UNPROCESSABLE_ENTITY).refused_the_number());
        for status in [302, 400, 401, 403, 404, 408, 409, 429, 500, 502, 503] {
            let error = failure(StatusCode::from_u16(status).unwrap());
            assert!(!error.refused_the_number(), "{status}");
        }
    }

    #[test]
    fn only_a_400_is_the_requests_own() {
        assert!(failure(StatusCode::BAD_REQUEST).the_requests_own());
        for status in [
            302, 401, 403, 404, 405, 407, 408, 409, 413, 415, 422, 429, 431, 500, 502, 503,
        ] {
            let error = failure(StatusCode::from_u16(status).unwrap());
            assert!(!error.the_requests_own(), "{status}");
        }
    }
}
