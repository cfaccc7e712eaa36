//! The one SMTP client: a bounded queue and a background task that sends each
//! email, retrying transient failures with backoff. Callers never wait.

use std::time::Duration;

use lettre::message::header::ContentType;
use lettre::message::Mailbox;
use lettre::{AsyncSmtpTransport, AsyncTransport, Message, Tokio1Executor};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use super::super::{EmailKind, RenderedEmail, SetupError};
use crate::settings::EmailSettings;

/// How the background task treats a queue and a failing SMTP server.
#[derive(Debug, Clone, Copy)]
pub struct MailerConfig {
    /// Emails waiting to be sent; further ones are dropped (and logged).
    pub queue_capacity: usize,
    /// Tries per email, the first included.
    pub attempts: u32,
    /// Wait before the second try; doubled before each further one.
    pub first_backoff: Duration,
    /// Upper bound of one SMTP command.
    pub smtp_timeout: Duration,
}

impl Default for MailerConfig {
    fn default() -> Self {
        Self {
            queue_capacity: 256,
            attempts: 4,
            first_backoff: Duration::from_millis(500),
            smtp_timeout: Duration::from_secs(10),
        }
    }
}

/// One email to send.
#[derive(Debug)]
pub struct Outgoing {
    /// Which email, for log lines.
    pub kind: EmailKind,
    /// Its recipients.
    pub to: Vec<Mailbox>,
    /// Its subject and body.
    pub email: RenderedEmail,
}

/// Hands emails to the background task; cheap to clone.
#[derive(Clone)]
pub struct Mailer {
    tx: mpsc::Sender<Outgoing>,
}

impl Mailer {
    /// Builds the SMTP client from `email.smtp_url` (`smtp://host:port`,
    /// `smtp://user:password@host:port?tls=required`, `smtps://host:port`) and
    /// spawns the task on the current Tokio runtime. The task ends once every
    /// `Mailer` is dropped and the queue is empty.
    pub fn start(
        settings: &EmailSettings,
        config: MailerConfig,
    ) -> Result<(Self, JoinHandle<()>), SetupError> {
        let transport = AsyncSmtpTransport::<Tokio1Executor>::from_url(settings.smtp_url.expose())
            .map_err(|e| SetupError::invalid("email.smtp_url", e.to_string()))?
            .timeout(Some(config.smtp_timeout))
            .build();
        let from = settings.from.clone();
        let (tx, rx) = mpsc::channel(config.queue_capacity.max(1));
        let task = tokio::spawn(run(transport, from, rx, config));
        Ok((Self { tx }, task))
    }

    /// Queue one email; never waits. A full or closed queue drops it with a warning.
    pub fn enqueue(&self, outgoing: Outgoing) {
        let kind = outgoing.kind.as_str();
        match self.tx.try_send(outgoing) {
            Ok(()) => {}
            Err(mpsc::error::TrySendError::Full(_)) => {
                tracing::warn!(kind, "email queue full: email dropped");
            }
            Err(mpsc::error::TrySendError::Closed(_)) => {
                tracing::warn!(kind, "email sender stopped: email dropped");
            }
        }
    }
}

async fn run(
    transport: AsyncSmtpTransport<Tokio1Executor>,
    from: Mailbox,
    mut rx: mpsc::Receiver<Outgoing>,
    config: MailerConfig,
) {
    while let Some(outgoing) = rx.recv().await {
        let kind = outgoing.kind.as_str();
        let recipients = outgoing.to.len();
        let message = match build(&from, outgoing) {
            Ok(message) => message,
            Err(e) => {
                tracing::warn!(kind, error = %e, "cannot build the email: dropped");
                continue;
            }
        };
        send_with_retries(&transport, &message, kind, recipients, config).await;
    }
}

fn build(from: &Mailbox, outgoing: Outgoing) -> Result<Message, lettre::error::Error> {
    let mut builder = Message::builder()
        .from(from.clone())
        .subject(outgoing.email.subject)
        .header(ContentType::TEXT_PLAIN);
    for to in outgoing.to {
        builder = builder.to(to);
    }
    builder.body(outgoing.email.body)
}

async fn send_with_retries(
    transport: &AsyncSmtpTransport<Tokio1Executor>,
    message: &Message,
    kind: &'static str,
    recipients: usize,
    config: MailerConfig,
) {
    let attempts = config.attempts.max(1);
    let mut backoff = config.first_backoff;
    for attempt in 1..=attempts {
        match transport.send(message.clone()).await {
            Ok(_) => {
                tracing::info!(kind, recipients, attempt, "email sent");
                return;
            }
            Err(e) if e.is_permanent() => {
                tracing::warn!(kind, attempt, error = %e, "the SMTP server refused the email: not retried");
                return;
            }
            Err(e) if attempt == attempts => {
                tracing::warn!(kind, attempt, error = %e, "email not sent: giving up");
                return;
            }
            Err(e) => {
                tracing::warn!(kind, attempt, error = %e, retry_in_ms = backoff.as_millis() as u64, "email not sent: retrying");
                tokio::time::sleep(backoff).await;
                backoff = backoff.saturating_mul(2);
            }
        }
    }
}
