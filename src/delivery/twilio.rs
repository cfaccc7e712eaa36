//! `sms.provider.kind = "twilio"`: the form `To`, `From`, `Body` POSTed with
//! HTTP Basic `account_sid:auth_token` to
//! `{url}/2010-04-01/Accounts/{account_sid}/Messages.json`.

use async_trait::async_trait;
use reqwest::header::HeaderMap;
use reqwest::StatusCode;
use serde::Deserialize;

use super::{http_client, Blame, DeliveryError, SetupError, SmsMessage, SmsSender};
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
        Err(failure(status, code))
    }
}

/// Twilio's error codes for a `To` number it will not text, whoever sends,
/// answered with a 400 (its error dictionary): invalid (21211, 21217),
/// unreachable (21214), a short code (21265), the account's own `From`
/// (21266), premium rate (21268), opted out (21610), not a mobile (21614),
/// a landline (21635). The caller picks each of these numbers: left
/// unlisted they were the provider's failures, given back whole, so one
/// address could loop a landline's number, one Twilio call a request that
/// no window saw, into the account's throttling. Not 21408 (the account
/// may not text the number's region) nor 21612 (this sender cannot reach
/// it now): those are the account's set-up, which a misconfiguration must
/// not charge to users.
const NUMBER_REFUSED: [u64; 9] = [
    21211, 21214, 21217, 21265, 21266, 21268, 21610, 21614, 21635,
];

/// Twilio's error codes for a `To` number this account may not text now,
/// answered with a 400: its region is not enabled (21408), this sender
/// cannot reach it (21612). The caller picks the number, so each address
/// has a budget of them; they are not the number's fault.
const NUMBER_DECLINED: [u64; 2] = [21408, 21612];

/// What Twilio's error answer means. Only the codes of `NUMBER_REFUSED`
/// refuse the number, and only those of `NUMBER_DECLINED` are the
/// request's own: any other (a wrong account, token or `From`, its
/// throttling, its outage) is a failure a retry may mend, and so is a code
/// Twilio adds later, until it is listed here.
fn failure(status: StatusCode, code: Option<u64>) -> DeliveryError {
    let Some(code) = code else {
        return DeliveryError::Rejected(format!("twilio answered {status}"));
    };
    let blame = match status {
        StatusCode::BAD_REQUEST if NUMBER_REFUSED.contains(&code) => Blame::Number,
        StatusCode::BAD_REQUEST if NUMBER_DECLINED.contains(&code) => Blame::Request,
        _ => Blame::Provider,
    };
    DeliveryError::answered(
        blame,
        format!("twilio answered {status}, error code {code}"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_400_naming_the_to_number_refuses_it() {
        for code in NUMBER_REFUSED {
            assert!(failure(StatusCode::BAD_REQUEST, Some(code)).refused_the_number());
        }
        // Numbers a caller picks that Twilio will not text: a landline, a
        // short code, the account's own `From`.
        for code in [21635, 21265, 21266] {
            assert!(
                failure(StatusCode::BAD_REQUEST, Some(code)).refused_the_number(),
                "{code}"
            );
        }
        let failures = [
            (StatusCode::BAD_REQUEST, Some(21606)), // `From` not an SMS-capable number
            (StatusCode::BAD_REQUEST, Some(21408)), // the account's region permissions
            (StatusCode::BAD_REQUEST, Some(21612)), // this sender cannot reach it now
            (StatusCode::BAD_REQUEST, None),
            (StatusCode::UNAUTHORIZED, Some(20003)),
            (StatusCode::NOT_FOUND, Some(20404)),
            (StatusCode::TOO_MANY_REQUESTS, Some(20429)),
            (StatusCode::INTERNAL_SERVER_ERROR, Some(21211)),
        ];
        for (status, code) in failures {
            assert!(
                !failure(status, code).refused_the_number(),
                "{status} {code:?}"
            );
        }
    }

    #[test]
    fn only_a_region_or_route_the_account_lacks_is_the_requests_own() {
        for code in NUMBER_DECLINED {
            assert!(failure(StatusCode::BAD_REQUEST, Some(code)).the_requests_own());
        }
        let failures = [
            (StatusCode::BAD_REQUEST, Some(21211)), // refused, not declined
            (StatusCode::BAD_REQUEST, Some(21606)), // the account's `From`
            (StatusCode::BAD_REQUEST, None),
            (StatusCode::UNAUTHORIZED, Some(20003)),
            (StatusCode::TOO_MANY_REQUESTS, Some(20429)),
            (StatusCode::SERVICE_UNAVAILABLE, Some(21408)),
        ];
        for (status, code) in failures {
            assert!(
                !failure(status, code).the_requests_own(),
                "{status} {code:?}"
            );
        }
    }
}
