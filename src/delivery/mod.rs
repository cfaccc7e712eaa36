//! Getting a code to a phone, and a notice or an alert to a mailbox.
//!
//! SMS providers sit behind [`SmsSender`]; [`build_sender`] picks the one
//! `[sms.provider]` names. Email (`[email]`) is in [`email`].

pub mod email;
mod log;
mod templates;
mod twilio;
mod webhook;

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;

pub use self::log::LogSender;
pub(crate) use templates::skipped_template_name;
pub use templates::{
    EmailKind, RenderedEmail, TemplateDirs, TemplateError, TemplateLoadError, Templates,
    TemplatesCell,
};
pub use twilio::{TwilioSender, TWILIO_API};
pub use webhook::WebhookSender;

use crate::settings::{SmsProviderKind, SmsProviderSettings};

/// One SMS, already rendered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SmsMessage {
    /// E.164.
    pub to: String,
    /// `to` masked, for anything that logs the message.
    pub to_masked: String,
    /// The rendered text, code included.
    pub body: String,
    /// The locale the body was rendered in.
    pub locale: String,
    /// Id of the request that asked for the code; webhooks get it too.
    pub request_id: String,
}

/// Why an SMS was not delivered.
#[derive(Debug, thiserror::Error)]
pub enum DeliveryError {
    /// The provider answered with an error status (the text names the
    /// provider and the status, never the phone).
    #[error("{0}")]
    Rejected(String),
    /// The call failed before an answer came; the text leaves out the URL, which
    /// may carry a token.
    #[error("provider unreachable: {0}")]
    Unreachable(String),
    /// No answer within `sms.provider.timeout` once connected: the provider
    /// may have taken the message all the same.
    #[error("provider did not answer in time")]
    TimedOut,
    /// The connection failed once open, before an answer (closed or reset
    /// by the provider or a proxy): the message may have gone out and been
    /// taken all the same.
    #[error("provider gave no answer: {0}")]
    Unanswered(String),
    /// The text could not be rendered (a bug: the templates are tested).
    #[error(transparent)]
    Template(#[from] TemplateError),
}

impl DeliveryError {
    /// Whether the message may have reached the phone although the call
    /// failed: the provider may have been sent it, and did not answer in
    /// time or at all. A late delivery is common with a slow gateway.
    pub fn may_have_been_delivered(&self) -> bool {
        matches!(self, DeliveryError::TimedOut | DeliveryError::Unanswered(_))
    }

    fn from_reqwest(e: reqwest::Error) -> Self {
        // A connect that failed or timed out sent nothing: unreachable.
        let unreachable = e.is_connect() || e.is_builder();
        if e.is_timeout() && !unreachable {
            return DeliveryError::TimedOut;
        }
        // The connection was open and failed before an answer: whether the
        // request went out is unknown, and counting it is the safe side (a
        // gateway that delivers, then drops the connection, would otherwise
        // text a phone without limit).
        let unanswered = e.is_request() && !unreachable;
        // Without the URL: a webhook URL may carry a token.
        let text = e.without_url().to_string();
        if unanswered {
            DeliveryError::Unanswered(text)
        } else {
            DeliveryError::Unreachable(text)
        }
    }
}

/// An SMS provider.
#[async_trait]
pub trait SmsSender: Send + Sync {
    /// Deliver once; never retried, so a phone never gets two different codes.
    async fn send(&self, message: &SmsMessage) -> Result<(), DeliveryError>;
}

/// The SMS provider in force: a reload that changes `[sms.provider]` puts a
/// new one in; a send under way finishes with the one it took.
pub type SenderCell = crate::in_force::InForce<Arc<dyn SmsSender>>;

/// A provider or mailer that cannot be set up from its settings.
#[derive(Debug, thiserror::Error)]
pub enum SetupError {
    /// A setting the provider cannot use.
    #[error("invalid setting `{key}`: {message}")]
    Invalid {
        /// The setting, as a config file spells it (`email.smtp_url`).
        key: String,
        /// What is wrong with its value.
        message: String,
    },
    /// The HTTP client could not be built (its TLS set-up, say).
    #[error("cannot build the HTTP client: {0}")]
    Http(#[from] reqwest::Error),
}

impl SetupError {
    pub(crate) fn invalid(key: &str, message: impl Into<String>) -> Self {
        Self::Invalid {
            key: key.to_string(),
            message: message.into(),
        }
    }
}

/// The SMS provider `[sms.provider]` names.
pub fn build_sender(settings: &SmsProviderSettings) -> Result<Arc<dyn SmsSender>, SetupError> {
    Ok(match settings.kind {
        SmsProviderKind::Log => Arc::new(LogSender),
        SmsProviderKind::Webhook => Arc::new(WebhookSender::new(settings)?),
        SmsProviderKind::Twilio => Arc::new(TwilioSender::new(settings)?),
    })
}

/// The longest a provider's connection (DNS, TCP and TLS) may take: half
/// the call's `timeout`, at most this. Shorter than the call's own
/// deadline, so that a connection that hangs (a dropped SYN, a stalled
/// handshake) ends as a connect error, nothing sent, and not as a call
/// that timed out after its message went out.
const MAX_CONNECT_TIMEOUT: Duration = Duration::from_secs(3);

/// The HTTP client of the SMS providers: one `timeout` for the whole call,
/// a shorter one to connect, no retries (a retried send could text a phone
/// twice), no redirects (a POST must not turn into a GET elsewhere).
fn http_client(
    timeout: Duration,
    headers: reqwest::header::HeaderMap,
) -> Result<reqwest::Client, reqwest::Error> {
    reqwest::Client::builder()
        .timeout(timeout)
        .connect_timeout((timeout / 2).min(MAX_CONNECT_TIMEOUT))
        .retry(reqwest::retry::never())
        .redirect(reqwest::redirect::Policy::none())
        .default_headers(headers)
        .user_agent(concat!("tollgate/", env!("CARGO_PKG_VERSION")))
        .build()
}
