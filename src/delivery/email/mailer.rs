//! The one SMTP client: a bounded queue and a background task that sends each
//! email, retrying transient failures with backoff. Callers never wait.

use std::time::Duration;

use lettre::message::header::{ContentType, Header, HeaderName, HeaderValue};
use lettre::message::Mailbox;
use lettre::{AsyncSmtpTransport, AsyncTransport, Message, Tokio1Executor};
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;

use super::super::{EmailKind, RenderedEmail, SetupError};
use crate::metrics::{self, EmailOutcome};
use crate::settings::EmailSettings;
use crate::telemetry::log_budget::LogBudget;

/// How the background task treats a queue and a failing SMTP server.
#[derive(Debug, Clone, Copy)]
pub struct MailerConfig {
    /// Emails waiting to be sent; further ones are dropped (and logged).
    pub queue_capacity: usize,
    /// Tries per email, the first included.
    pub attempts: u32,
    /// Wait before the second try; doubled before each further one.
    pub first_backoff: Duration,
    /// Upper bound of connecting; a whole send (greeting, TLS, every
    /// command, the body) is bounded at [`COMMANDS_PER_SEND`] times it.
    pub smtp_timeout: Duration,
}

/// A send's bound, in `smtp_timeout`s. lettre bounds only the connect:
/// a server that takes the connection and then says nothing (hung, a
/// tarpit, a half-open pooled connection) would hold the one mail task,
/// and every later email would be dropped as the queue filled.
pub const COMMANDS_PER_SEND: u32 = 3;

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
    /// Its recipients, each sent a copy of their own.
    pub to: Vec<Mailbox>,
    /// Its subject and body.
    pub email: RenderedEmail,
    /// Told once every copy was tried.
    pub reached: Option<oneshot::Sender<Reach>>,
    /// Queued apart and sent before the other notices: a whole account's
    /// lock, which a wave of address locks (anyone with a few hundred
    /// addresses) must not drop from a full queue.
    pub ahead: bool,
}

/// What became of an email's copies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reach {
    /// At least one recipient got it.
    Reached,
    /// None did, and the server refused every copy for good (a `5xx`):
    /// its text may be what it refuses. One address refused (an admin who
    /// left) beside others that failed for now is `Failed`.
    Refused,
    /// None did, for failures a later try may pass (no connection, `4xx`).
    Failed,
}

/// Admin digests queued apart from the lock notices, and sent first: a
/// wave of locks (an attack) fills the notices' queue, and the digest that
/// tells the admins of it must not be the email dropped.
const DIGEST_QUEUE: usize = 4;

/// Notices of a whole account's lock queued apart ([`Outgoing::ahead`]).
const AHEAD_QUEUE: usize = 64;

static DROPPED_LINES: LogBudget = LogBudget::new(Duration::from_secs(10));

/// Hands emails to the background task; cheap to clone.
#[derive(Clone)]
pub struct Mailer {
    notices: mpsc::Sender<Outgoing>,
    ahead: mpsc::Sender<Outgoing>,
    digests: mpsc::Sender<Outgoing>,
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
        // No connection pool (lettre's `pool` feature is off): emails are
        // few, and a pooled connection cut off mid-reply would be used
        // again half-read, or held by the pool's own QUIT. Each send
        // connects; a send cut off at its bound closes its connection.
        let transport = AsyncSmtpTransport::<Tokio1Executor>::from_url(settings.smtp_url.expose())
            .map_err(|e| SetupError::invalid("email.smtp_url", e.to_string()))?
            .timeout(Some(config.smtp_timeout))
            .build();
        let from = settings.from.clone();
        let (notices, notices_rx) = mpsc::channel(config.queue_capacity.max(1));
        let (ahead, ahead_rx) = mpsc::channel(AHEAD_QUEUE);
        let (digests, digests_rx) = mpsc::channel(DIGEST_QUEUE);
        let queues = Queues {
            notices: notices_rx,
            ahead: ahead_rx,
            digests: digests_rx,
        };
        for kind in EmailKind::ALL {
            metrics::emails_from_zero(kind.as_str());
        }
        let task = tokio::spawn(run(transport, from, queues, config));
        Ok((
            Self {
                notices,
                ahead,
                digests,
            },
            task,
        ))
    }

    /// Queue one email; never waits. A full or closed queue drops it with a
    /// warning; whether it was queued.
    pub fn enqueue(&self, outgoing: Outgoing) -> bool {
        let kind = outgoing.kind.as_str();
        let queue = match (outgoing.kind, outgoing.ahead) {
            (EmailKind::AlertDigest, _) => &self.digests,
            (EmailKind::LockNotice, true) => &self.ahead,
            (EmailKind::LockNotice, false) => &self.notices,
        };
        let (why, dropped) = match queue.try_send(outgoing) {
            Ok(()) => return true,
            Err(mpsc::error::TrySendError::Full(dropped)) => ("email queue full", dropped),
            Err(mpsc::error::TrySendError::Closed(dropped)) => ("email sender stopped", dropped),
        };
        metrics::emails(kind, EmailOutcome::Dropped, dropped.to.len());
        // A wave of locks with `notify_email` drops notices by the
        // thousand: one line per interval, with how many went unsaid.
        if let Some(held_back) = DROPPED_LINES.admit() {
            tracing::warn!(kind, held_back, "{why}: email dropped");
        }
        false
    }
}

/// The task's queues.
struct Queues {
    notices: mpsc::Receiver<Outgoing>,
    ahead: mpsc::Receiver<Outgoing>,
    digests: mpsc::Receiver<Outgoing>,
}

impl Queues {
    /// The next email, a digest before any notice, an account's lock
    /// before an address's; `None` once every queue is closed and empty.
    async fn next(&mut self) -> Option<Outgoing> {
        tokio::select! {
            biased;
            Some(digest) = self.digests.recv() => Some(digest),
            Some(notice) = self.ahead.recv() => Some(notice),
            Some(notice) = self.notices.recv() => Some(notice),
            else => None,
        }
    }
}

async fn run(
    transport: AsyncSmtpTransport<Tokio1Executor>,
    from: Mailbox,
    mut queues: Queues,
    configured: MailerConfig,
) {
    while let Some(outgoing) = queues.next().await {
        let mut config = configured;
        let Outgoing {
            kind,
            to,
            email,
            reached,
            ahead: _,
        } = outgoing;
        let kind = kind.as_str();
        // A copy each, not one envelope: a server refuses a whole message
        // when it refuses one of its recipients (a mistyped or left admin's
        // `550`), and every other admin would lose the digest with it.
        let copies = to.len();
        let mut sents = Vec::with_capacity(copies);
        for (recipient, to) in to.into_iter().enumerate() {
            let message = match build(&from, to, &email) {
                Ok(message) => message,
                Err(e) => {
                    tracing::warn!(kind, recipient, error = %e, "cannot build the email: dropped");
                    metrics::emails(kind, EmailOutcome::Failed, 1);
                    sents.push(Sent::No);
                    continue;
                }
            };
            let sent = send_with_retries(&transport, &message, kind, recipient, config).await;
            metrics::emails(kind, sent.outcome(), 1);
            sents.push(sent);
            // A server that did not answer on any try (down, hung, a
            // tarpit) would hold the one mail task as long again for each
            // further copy, the lock notices queued behind them: the
            // others get one try each (a slow check of one address may be
            // all that failed).
            if sent == Sent::NoServer && config.attempts > 1 && recipient + 1 < copies {
                tracing::warn!(
                    kind,
                    left = copies - recipient - 1,
                    "the SMTP server is not answering: one try for each other copy"
                );
                config.attempts = 1;
            }
        }
        if let Some(reached) = reached {
            // The alert task may have stopped (a shutdown): nothing to tell.
            let _ = reached.send(reach_of(&sents));
        }
    }
}

fn build(
    from: &Mailbox,
    to: Mailbox,
    email: &RenderedEmail,
) -> Result<Message, lettre::error::Error> {
    Message::builder()
        .from(from.clone())
        .to(to)
        .subject(email.subject.clone())
        .header(ContentType::TEXT_PLAIN)
        .header(AutoSubmitted)
        .body(email.body.clone())
}

/// `Auto-Submitted: auto-generated` (RFC 3834): an owner's vacation
/// auto-reply or an admin's mail filter does not answer a lock notice or a
/// digest, whose sender (`email.from`) may be a real mailbox.
#[derive(Debug, Clone, Copy)]
struct AutoSubmitted;

impl Header for AutoSubmitted {
    fn name() -> HeaderName {
        HeaderName::new_from_ascii_str("Auto-Submitted")
    }

    fn parse(_: &str) -> Result<Self, Box<dyn std::error::Error + Send + Sync>> {
        Ok(Self)
    }

    fn display(&self) -> HeaderValue {
        HeaderValue::new(Self::name(), "auto-generated".to_owned())
    }
}

/// Why a try failed, as logged: lettre's own text quotes the server's
/// reply, which names the recipient (`550 5.1.1 <bob@example.com>: …`),
/// an address the logs show only masked.
#[derive(Debug)]
struct Failure {
    /// The SMTP reply code, when the server answered.
    code: Option<String>,
    /// What kind of failure: `response`, `timeout` (a send past its bound too),
    /// `tls`, `client`, `connection`.
    what: &'static str,
    permanent: bool,
}

impl Failure {
    fn of(e: &lettre::transport::smtp::Error) -> Self {
        let what = if e.is_timeout() {
            "timeout"
        } else if e.is_tls() {
            "tls"
        } else if e.is_permanent() || e.is_transient() {
            "response"
        } else if e.is_client() {
            "client"
        } else {
            "connection"
        };
        Self {
            code: e.status().map(|code| code.to_string()),
            what,
            permanent: e.is_permanent(),
        }
    }

    fn cut_off() -> Self {
        Self {
            code: None,
            // lettre's own word for a bounded wait, so that one filter
            // finds both.
            what: "timeout",
            permanent: false,
        }
    }
}

/// What became of one copy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Sent {
    Yes,
    /// Refused for good (`5xx`): not tried again.
    Refused,
    /// Every try failed for a passing reason the server answered (`4xx`).
    No,
    /// Every try failed, the last without an answer from the server (no
    /// connection, a timeout, TLS).
    NoServer,
}

impl Sent {
    fn outcome(self) -> EmailOutcome {
        match self {
            Sent::Yes => EmailOutcome::Sent,
            Sent::Refused => EmailOutcome::Refused,
            Sent::No | Sent::NoServer => EmailOutcome::Failed,
        }
    }
}

/// What became of an email whose copies went as `sents`.
fn reach_of(sents: &[Sent]) -> Reach {
    if sents.contains(&Sent::Yes) {
        Reach::Reached
    } else if !sents.is_empty() && sents.iter().all(|sent| *sent == Sent::Refused) {
        Reach::Refused
    } else {
        Reach::Failed
    }
}

/// Whether the server took `message`; `recipient` is its place in the
/// email's list, for log lines (the address itself is not logged).
async fn send_with_retries(
    transport: &AsyncSmtpTransport<Tokio1Executor>,
    message: &Message,
    kind: &'static str,
    recipient: usize,
    config: MailerConfig,
) -> Sent {
    let attempts = config.attempts.max(1);
    let bound = config.smtp_timeout.saturating_mul(COMMANDS_PER_SEND);
    let mut backoff = config.first_backoff;
    for attempt in 1..=attempts {
        let sent = tokio::time::timeout(bound, transport.send(message.clone())).await;
        let failure = match sent {
            Ok(Ok(_)) => {
                tracing::info!(kind, recipient, attempt, "email sent");
                return Sent::Yes;
            }
            Ok(Err(e)) => Failure::of(&e),
            Err(_) => Failure::cut_off(),
        };
        let Failure {
            code,
            what,
            permanent,
        } = failure;
        let answered = code.is_some();
        if permanent {
            tracing::warn!(
                kind,
                recipient,
                attempt,
                smtp_code = code,
                error = what,
                "the SMTP server refused the email: not retried"
            );
            return Sent::Refused;
        }
        if attempt == attempts {
            tracing::warn!(
                kind,
                recipient,
                attempt,
                smtp_code = code,
                error = what,
                "email not sent: giving up"
            );
            return if answered { Sent::No } else { Sent::NoServer };
        }
        tracing::warn!(
            kind,
            recipient,
            attempt,
            smtp_code = code,
            error = what,
            retry_in_ms = backoff.as_millis() as u64,
            "email not sent: retrying"
        );
        tokio::time::sleep(backoff).await;
        backoff = backoff.saturating_mul(2);
    }
    Sent::No
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::settings::{SecretUrl, Settings};
    use std::sync::Arc;

    #[test]
    fn an_email_is_refused_only_when_every_copy_is() {
        assert_eq!(reach_of(&[Sent::Refused, Sent::Yes]), Reach::Reached);
        assert_eq!(reach_of(&[Sent::Refused, Sent::Refused]), Reach::Refused);
        // One admin's address gone, the others' server busy for now.
        assert_eq!(reach_of(&[Sent::Refused, Sent::No]), Reach::Failed);
        assert_eq!(reach_of(&[Sent::NoServer, Sent::Refused]), Reach::Failed);
        assert_eq!(reach_of(&[]), Reach::Failed);
    }

    fn notice() -> Outgoing {
        email(EmailKind::LockNotice)
    }

    /// A whole account's lock notice, queued ahead of the others.
    fn account_notice() -> Outgoing {
        Outgoing {
            ahead: true,
            ..notice()
        }
    }

    fn email(kind: EmailKind) -> Outgoing {
        Outgoing {
            kind,
            to: vec!["bob@example.com".parse().expect("a mailbox")],
            email: RenderedEmail {
                subject: "locked".into(),
                body: "locked\n".into(),
            },
            reached: None,
            ahead: false,
        }
    }

    /// A mailer sending to a server that takes connections (the kernel
    /// does) and never says a word; the listener lives as long as it is held.
    fn to_a_silent_server(config: MailerConfig) -> (Mailer, JoinHandle<()>, std::net::TcpListener) {
        let silent = std::net::TcpListener::bind("127.0.0.1:0").expect("a port");
        let port = silent.local_addr().expect("an address").port();
        let mut settings = Settings::defaults().expect("defaults").email;
        settings.smtp_url = SecretUrl::new(format!("smtp://127.0.0.1:{port}"));
        let (mailer, task) = Mailer::start(&settings, config).expect("a mailer");
        (mailer, task, silent)
    }

    /// `tollgate_emails_total{kind, outcome}` as `/metrics` shows it now.
    fn emails_counted(kind: EmailKind, outcome: EmailOutcome) -> f64 {
        let text = metrics::install().expect("the recorder installs").render();
        let series = format!(
            "{}{{kind=\"{}\",outcome=\"{}\"}} ",
            metrics::EMAILS,
            kind.as_str(),
            outcome.as_str()
        );
        text.lines()
            .find_map(|l| l.strip_prefix(&series))
            .and_then(|value| value.parse().ok())
            .unwrap_or_else(|| panic!("{series} missing from\n{text}"))
    }

    /// An email a full queue drops is counted, a copy per recipient (other
    /// tests here drop notices too: at least this test's).
    #[tokio::test]
    async fn a_dropped_email_is_counted_a_copy_per_recipient() {
        let config = MailerConfig {
            queue_capacity: 1,
            attempts: 1,
            first_backoff: Duration::from_millis(10),
            smtp_timeout: Duration::from_secs(30),
        };
        // Before the mailer exports its series at 0.
        metrics::install().expect("the recorder installs");
        let (mailer, _task, _silent) = to_a_silent_server(config);
        let before = emails_counted(EmailKind::LockNotice, EmailOutcome::Dropped);
        let mut dropped = 0;
        for _ in 0..6 {
            let mut twice = notice();
            twice.to.push("eve@example.com".parse().expect("a mailbox"));
            if !mailer.enqueue(twice) {
                dropped += 2;
            }
        }
        assert!(dropped >= 8, "{dropped} copies dropped");
        let after = emails_counted(EmailKind::LockNotice, EmailOutcome::Dropped);
        assert!(
            after >= before + f64::from(dropped),
            "{before} then {after}"
        );
    }

    /// A wave of address locks fills the notices' queue; an account's
    /// lock is queued apart (and goes before them: the next test).
    #[tokio::test]
    async fn an_accounts_lock_is_queued_when_address_locks_fill_the_queue() {
        let config = MailerConfig {
            queue_capacity: 2,
            attempts: 1,
            first_backoff: Duration::from_millis(10),
            smtp_timeout: Duration::from_secs(30),
        };
        let (mailer, _task, _silent) = to_a_silent_server(config);
        let mut queued = 0;
        while mailer.enqueue(notice()) {
            queued += 1;
            assert!(queued < 10, "the notices' queue never fills");
        }
        assert!(
            mailer.enqueue(account_notice()),
            "dropped with the address notices"
        );
    }

    #[tokio::test]
    async fn an_accounts_lock_goes_before_the_address_locks_queued_earlier() {
        let (notices, notices_rx) = mpsc::channel(4);
        let (ahead, ahead_rx) = mpsc::channel(4);
        let (_digests, digests_rx) = mpsc::channel(4);
        let mut queues = Queues {
            notices: notices_rx,
            ahead: ahead_rx,
            digests: digests_rx,
        };
        assert!(notices.try_send(notice()).is_ok());
        assert!(ahead.try_send(account_notice()).is_ok());
        assert!(queues.next().await.is_some_and(|first| first.ahead));
        assert!(queues.next().await.is_some_and(|second| !second.ahead));
    }

    /// A server that takes the connection and never says a word (lettre
    /// bounds only the connect) gives each send up at its bound, and the
    /// emails queued behind it are tried in turn rather than held forever.
    #[tokio::test]
    async fn a_server_that_never_answers_holds_no_send_past_its_bound() {
        let config = MailerConfig {
            queue_capacity: 8,
            attempts: 2,
            first_backoff: Duration::from_millis(10),
            smtp_timeout: Duration::from_millis(100),
        };
        let (mailer, task, silent) = to_a_silent_server(config);
        for _ in 0..3 {
            assert!(mailer.enqueue(notice()));
        }
        // The task ends once the queue is empty and no Mailer is left.
        drop(mailer);
        // Three emails, two tries each, 0.3 s a try, and the backoffs.
        let ended = tokio::time::timeout(Duration::from_secs(10), task).await;
        assert!(ended.is_ok(), "the mail task is stuck on a silent server");
        drop(silent);
    }

    /// A server that answers no try of the first copy gets one try for
    /// each other copy, not every try (each would hold the mail task as
    /// long again): the email's sender hears that no one got it.
    #[tokio::test]
    async fn a_silent_server_is_not_tried_for_every_copy() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let accepted = Arc::new(std::sync::atomic::AtomicU32::new(0));
        let counted = accepted.clone();
        let silent = tokio::spawn(async move {
            let mut held = Vec::new();
            while let Ok((socket, _)) = listener.accept().await {
                counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                held.push(socket); // never a word
            }
        });
        let mut settings = Settings::defaults().expect("defaults").email;
        settings.smtp_url = SecretUrl::new(format!("smtp://127.0.0.1:{port}"));
        let config = MailerConfig {
            queue_capacity: 8,
            attempts: 2,
            first_backoff: Duration::from_millis(10),
            smtp_timeout: Duration::from_millis(100),
        };
        let (mailer, task) = Mailer::start(&settings, config).expect("a mailer");
        let (reached, told) = oneshot::channel();
        let mut digest = email(EmailKind::AlertDigest);
        digest.to = ["ops@example.com", "sec@example.com", "cto@example.com"]
            .iter()
            .map(|to| to.parse().expect("a mailbox"))
            .collect();
        digest.reached = Some(reached);
        assert!(mailer.enqueue(digest));
        assert_eq!(told.await.expect("told"), Reach::Failed);
        drop(mailer);
        task.await.expect("the task ends");
        assert_eq!(
            accepted.load(std::sync::atomic::Ordering::SeqCst),
            4,
            "two tries of the first copy, one of each other"
        );
        silent.abort();
    }

    /// A wave of lock notices fills their queue; the digest that tells the
    /// admins of it is queued all the same (in a queue of its own, which the
    /// task reads first).
    #[tokio::test]
    async fn a_full_queue_of_notices_leaves_room_for_the_digest() {
        let (mailer, _task, silent) = to_a_silent_server(MailerConfig {
            queue_capacity: 2,
            ..MailerConfig::default()
        });
        let queued = (0..10).filter(|_| mailer.enqueue(notice())).count();
        // Two in the queue, and perhaps one the task took to send.
        assert!((2..=3).contains(&queued), "{queued} queued");
        assert!(!mailer.enqueue(notice()), "the notices' queue is full");
        assert!(mailer.enqueue(email(EmailKind::AlertDigest)));
        drop(silent);
    }
}
