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
pub(crate) use templates::{skipped_template_name, MAX_TEMPLATE_BYTES};
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
    /// The provider answered with an error status that is its own or the
    /// account's (a wrong token or sender, its throttling, its outage): no
    /// fault of this request's, and every send meets it alike. The text
    /// names the provider and the status, never the phone.
    #[error("{0}")]
    Rejected(String),
    /// The provider would not take this request, for a reason the request
    /// carries and a retry meets again, though the number itself is not
    /// refused: the account may not text its region (Twilio's 21408,
    /// 21612), a webhook's 400. The caller picks the number, so
    /// such failures are budgeted per client address and IPv6 network
    /// (`sms.failed_delivery_limit`, `sms.failed_delivery_network_limit`).
    #[error("{0}")]
    Declined(String),
    /// The provider refused to text this number, as it will each time it
    /// is asked (an invalid number, not a mobile, opted out): the text names
    /// the provider, the status and its error code, never the phone.
    #[error("{0}")]
    Refused(String),
    /// The call failed before an answer came; the text leaves out the URL, which
    /// may carry a token.
    #[error("provider unreachable: {0}")]
    Unreachable(String),
    /// The connection closed or was reset once the request was on its
    /// way, before a whole answer, or what came back was no HTTP: the
    /// provider may have read the message, or a proxy in TCP mode before a
    /// provider that is down closed it unread; no one can tell which. The
    /// text leaves out the URL.
    #[error("no whole answer from the provider: {0}")]
    Dropped(String),
    /// No answer within `sms.provider.timeout` once connected: the provider
    /// may have taken the message all the same.
    #[error("provider did not answer in time")]
    TimedOut,
    /// The text could not be rendered (a bug: the templates are tested).
    #[error(transparent)]
    Template(#[from] TemplateError),
}

/// Whose fault a provider's error answer is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Blame {
    /// The number's: the provider will never text it (`Refused`).
    Number,
    /// The request's: this number, not the provider's state (`Declined`).
    Request,
    /// The provider's or the account's (`Rejected`).
    Provider,
}

impl DeliveryError {
    /// Whether the message may have reached the phone although the call
    /// failed: the provider was sent it and did not answer in time. A late
    /// delivery is common with a slow gateway.
    pub fn may_have_been_delivered(&self) -> bool {
        matches!(self, DeliveryError::TimedOut)
    }

    /// Whether the provider refused to text this number: asking again is
    /// refused again. Any other failure (a wrong token or URL, the
    /// provider's own throttling or outage, no answer) may pass on a retry.
    pub fn refused_the_number(&self) -> bool {
        matches!(self, DeliveryError::Refused(_))
    }

    /// Whether the request picked this failure, and another number might
    /// pass: an address may cost only so many (`Declined`). A refused
    /// number counts in the address's windows at once; an outage, a
    /// wrong set-up or the provider's throttling is no one's pick, and
    /// costs no user anything.
    pub fn the_requests_own(&self) -> bool {
        matches!(self, DeliveryError::Declined(_))
    }

    /// Whether a retry of this failure is given back only within the
    /// asking address's budget of failed deliveries: one the request picked
    /// (`Declined`), or a connection dropped after the message went out
    /// (`Dropped`), which a provider that takes a message and then drops
    /// the connection answers to every send while it texts the phone. Given
    /// back whole without end, one address could text a phone through it
    /// without limit; counted at once, a proxy's dropped connections during
    /// an outage would fill every user's windows.
    pub fn spends_the_failure_budget(&self) -> bool {
        matches!(self, DeliveryError::Declined(_) | DeliveryError::Dropped(_))
    }

    /// Whether the connection closed or was reset once the request went
    /// out (`Dropped`): every send meets that alike while a proxy before a
    /// provider that is down drops them, whoever asks.
    pub fn dropped_the_connection(&self) -> bool {
        matches!(self, DeliveryError::Dropped(_))
    }

    /// A provider's error answer, `text` naming the provider and the status,
    /// as `blame` reads it.
    fn answered(blame: Blame, text: String) -> Self {
        match blame {
            Blame::Number => DeliveryError::Refused(text),
            Blame::Request => DeliveryError::Declined(text),
            Blame::Provider => DeliveryError::Rejected(text),
        }
    }

    fn from_reqwest(e: reqwest::Error) -> Self {
        // A connect that timed out sent nothing: unreachable, not unanswered.
        if e.is_timeout() && !e.is_connect() {
            return DeliveryError::TimedOut;
        }
        let cut = if e.is_connect() {
            Cut::NothingSent
        } else {
            cut_of(&e)
        };
        // Without the URL: a webhook URL may carry a token. With its
        // causes: "error sending request" alone does not tell a refused
        // connection from one closed or reset.
        let text = with_causes(&e.without_url());
        match cut {
            Cut::NothingSent => DeliveryError::Unreachable(text),
            Cut::AfterSending => DeliveryError::Dropped(text),
        }
    }
}

/// Where a call that got no answer broke off.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Cut {
    /// Before the request went out: no connection, or hyper handed the
    /// request back unsent (`Canceled`), or a cause not known here.
    NothingSent,
    /// Once the request was on its way: the connection closed before a
    /// whole answer (hyper's `IncompleteMessage`) or was reset, or what
    /// came back was no HTTP. A gateway that took the message may answer
    /// a broken head as well as drop the connection; an `http://` URL at a
    /// TLS port answers so too, and costs a budget like any other cut.
    AfterSending,
}

/// Where `error`'s call broke off, from hyper's and the system's causes
/// in its chain.
fn cut_of(error: &(dyn std::error::Error + 'static)) -> Cut {
    let mut source = Some(error);
    while let Some(cause) = source {
        if let Some(hyper) = cause.downcast_ref::<hyper::Error>() {
            if hyper.is_incomplete_message() {
                return Cut::AfterSending;
            }
            if hyper.is_canceled() {
                return Cut::NothingSent;
            }
            if hyper.is_parse() || hyper.is_parse_status() {
                return Cut::AfterSending;
            }
        }
        if let Some(io) = cause.downcast_ref::<std::io::Error>() {
            use std::io::ErrorKind::{
                BrokenPipe, ConnectionAborted, ConnectionReset, UnexpectedEof,
            };
            if matches!(
                io.kind(),
                ConnectionReset | BrokenPipe | ConnectionAborted | UnexpectedEof
            ) {
                return Cut::AfterSending;
            }
        }
        source = cause.source();
    }
    Cut::NothingSent
}

/// An error's text followed by its sources', joined by ": ".
fn with_causes(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
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

/// How long an idle connection to a provider is kept for the next send.
const POOL_IDLE_TIMEOUT: Duration = Duration::from_secs(4);

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
        // Shorter than the idle timeouts of common servers (Node's 5 s): a
        // request sent on a connection the server is closing meets a cut
        // answer, which a send may pay for (`Dropped`).
        .pool_idle_timeout(POOL_IDLE_TIMEOUT)
        .retry(reqwest::retry::never())
        .redirect(reqwest::redirect::Policy::none())
        .default_headers(headers)
        .user_agent(concat!("tollgate/", env!("CARGO_PKG_VERSION")))
        .build()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn an_unreachable_provider_is_named_with_the_cause_and_without_the_url() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        drop(listener); // nothing listens there now
        let error = reqwest::Client::builder()
            .no_proxy()
            .build()
            .unwrap()
            .post(format!("http://127.0.0.1:{port}/hook?token=secret-token"))
            .send()
            .await
            .unwrap_err();
        let DeliveryError::Unreachable(text) = DeliveryError::from_reqwest(error) else {
            panic!("a refused connection is unreachable");
        };
        assert!(text.contains("error sending request"), "{text}");
        assert!(
            text.to_ascii_lowercase().contains("refused"),
            "the cause is named: {text}"
        );
        assert!(!text.contains("secret-token"), "{text}");
    }

    /// What a provider call to a server that reads the request, then
    /// writes `answer` (raw bytes, perhaps none) and closes, fails with.
    async fn failure_of_a_call_answered(answer: &'static [u8]) -> DeliveryError {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let server = tokio::spawn(async move {
            let (mut socket, _) = listener.accept().await.unwrap();
            let mut chunk = [0u8; 4096];
            let _ = socket.read(&mut chunk).await;
            let _ = socket.write_all(answer).await;
        });
        let error = reqwest::Client::builder()
            .no_proxy()
            .build()
            .unwrap()
            .post(format!("http://127.0.0.1:{port}/hook?token=secret-token"))
            .body("{}")
            .send()
            .await
            .unwrap_err();
        server.await.unwrap();
        DeliveryError::from_reqwest(error)
    }

    /// An answer that is no HTTP came after the request: a gateway that
    /// took the message may answer a broken head, so it is budgeted as a
    /// cut connection is, not given back whole (a TLS port's alert record
    /// too: no one can tell the two apart for sure).
    #[tokio::test]
    async fn an_answer_that_is_no_http_spends_the_failure_budget() {
        for answer in [
            &b"HTTP/1.1 200 OK\r\nBad Header\r\nContent-Length: 2\r\n\r\nok"[..],
            b"HTTP/1.1 2000 OK\r\n\r\n",
            b"\x15\x03\x01\x00\x02\x02\x46",
        ] {
            let failed = failure_of_a_call_answered(answer).await;
            assert!(failed.spends_the_failure_budget(), "{failed:?}");
            assert!(matches!(failed, DeliveryError::Dropped(_)), "{failed:?}");
        }
    }

    /// A connection that took the request and closed without an answer
    /// is no unreachable host: the message may have gone out.
    #[tokio::test]
    async fn a_connection_closed_after_the_request_is_dropped_not_unreachable() {
        let dropped = failure_of_a_call_answered(b"").await;
        assert!(dropped.spends_the_failure_budget(), "{dropped:?}");
        let DeliveryError::Dropped(text) = dropped else {
            panic!("a connection closed after the request is dropped: {dropped:?}");
        };
        assert!(!text.contains("secret-token"), "{text}");
    }
}
