//! The lockout notice: one email to `notify_email` per lock, an address's
//! lock at most once an hour per recipient (`notice_gate`). The address
//! goes from the request to the mail queue and nowhere else.

use std::time::Duration;

use chrono::{SecondsFormat, Utc};
use lettre::message::Mailbox;
use serde::Serialize;

use super::mailer::{Mailer, Outgoing, Reach};
use super::notice_gate::NoticeGate;
use std::sync::Arc;

use crate::delivery::{EmailKind, TemplatesCell};
use crate::metrics::{self, EmailOutcome};

/// What the owner of a just-locked account is told.
#[derive(Debug, Clone)]
pub struct LockNotice {
    /// `notify_email` of the attempt that locked the account.
    pub to: String,
    /// The locked user's name.
    pub user: String,
    /// How long the lock lasts.
    pub locked_for: Duration,
    /// The whole account, or only sign-ins from `ip`.
    pub scope: LockedScope,
    /// The client IP of that attempt, when known.
    pub ip: Option<String>,
    /// Locale of the email, from the attempt; `en` when absent or unknown.
    pub locale: Option<String>,
}

/// What a lock shuts: `login.lock_scope = "user_ip"` locks the account
/// from one address first, and the whole account only later.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LockedScope {
    /// Every sign-in to the account.
    Account,
    /// Sign-ins from the attempt's address only.
    Address,
}

/// Tells an account's owner about a lock. Never waits.
pub trait LockNotifier: Send + Sync {
    /// Queue the notice; problems are logged, never returned.
    fn lock_notice(&self, notice: LockNotice);
}

/// Email is off (`email.smtp_url` empty): notices go nowhere.
#[derive(Debug, Default)]
pub struct NoNotices;

impl LockNotifier for NoNotices {
    fn lock_notice(&self, _notice: LockNotice) {}
}

/// Sends lock notices through the mailer, an address's lock at most once an
/// hour per recipient ([`NoticeGate`]).
pub struct EmailLockNotifier {
    mailer: Mailer,
    templates: Arc<TemplatesCell>,
    gate: Arc<parking_lot::Mutex<NoticeGate>>,
}

impl EmailLockNotifier {
    /// Notices through `mailer`, in the texts `templates` holds when each is sent.
    pub fn new(mailer: Mailer, templates: Arc<TemplatesCell>) -> Self {
        Self {
            mailer,
            templates,
            gate: Arc::new(parking_lot::Mutex::new(NoticeGate::default())),
        }
    }
}

/// The variables of `email/<locale>/lock_notice.txt`.
#[derive(Serialize)]
pub(crate) struct LockNoticeVars<'a> {
    pub user: &'a str,
    pub locked_minutes: u64,
    pub locked_until: String,
    pub ip: &'a str,
    /// Only sign-ins from `ip` are locked; the owner's other addresses work.
    pub address_only: bool,
}

impl LockNotifier for EmailLockNotifier {
    fn lock_notice(&self, notice: LockNotice) {
        let to: Mailbox = match notice.to.parse() {
            Ok(to) => to,
            Err(e) => {
                tracing::warn!(to = %mask_email(&notice.to), error = %e, "notify_email is not deliverable: no lock notice");
                metrics::emails(EmailKind::LockNotice.as_str(), EmailOutcome::Failed, 1);
                return;
            }
        };
        // Checked and counted under one lock: concurrent locks for one
        // recipient (a burst from many addresses) pass one at a time. Given
        // back below if the notice is not queued, or never arrives.
        let now = tokio::time::Instant::now();
        if !self.gate.lock().admit(&notice.to, notice.scope, now) {
            tracing::info!(to = %mask_email(&notice.to), "a notice went to this address within the hour: this address lock is not told");
            return;
        }
        let until = Utc::now()
            + chrono::Duration::from_std(notice.locked_for).unwrap_or(chrono::Duration::zero());
        // A name reaches the notice as the caller sent it: a line separator
        // (U+2028) or a bidirectional override passes the guards' control
        // check and would write lines, or reorder text, in the owner's mail.
        let user = crate::domain::text::undisguised(&notice.user);
        let vars = LockNoticeVars {
            user: &user,
            locked_minutes: notice.locked_for.as_secs().div_ceil(60),
            locked_until: until.to_rfc3339_opts(SecondsFormat::Secs, true),
            ip: notice.ip.as_deref().unwrap_or(""),
            address_only: notice.scope == LockedScope::Address,
        };
        let rendered = self.templates.current().render_email(
            EmailKind::LockNotice,
            notice.locale.as_deref(),
            vars,
        );
        match rendered {
            Ok(email) => {
                let (reached, told) = tokio::sync::oneshot::channel();
                let queued = self.mailer.enqueue(Outgoing {
                    kind: EmailKind::LockNotice,
                    to: vec![to],
                    email,
                    reached: Some(reached),
                    ahead: notice.scope == LockedScope::Account,
                });
                if !queued {
                    self.gate.lock().forget(&notice.to, now);
                    return;
                }
                // Given back when every try failed: a relay's outage of a
                // few seconds must not silence a recipient for the hour. Not
                // when the server refused it for good (a mailbox that does
                // not exist): each lock would cost a transaction again.
                let gate = self.gate.clone();
                let to = notice.to;
                let given_back = async move {
                    if matches!(told.await, Ok(Reach::Failed) | Err(_)) {
                        gate.lock().forget(&to, now);
                    }
                };
                if let Ok(runtime) = tokio::runtime::Handle::try_current() {
                    runtime.spawn(given_back);
                }
            }
            Err(e) => {
                self.gate.lock().forget(&notice.to, now);
                tracing::error!(error = %e, "cannot render the lock notice");
                metrics::emails(EmailKind::LockNotice.as_str(), EmailOutcome::Failed, 1);
            }
        }
    }
}

/// `alice@example.com` → `a***@example.com`, for logs.
pub fn mask_email(address: &str) -> String {
    match address.rsplit_once('@') {
        Some((local, domain)) => {
            let first: String = local.chars().take(1).collect();
            format!("{first}***@{domain}")
        }
        None => "***".to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::mask_email;

    #[test]
    fn logged_addresses_keep_only_the_first_letter_and_the_domain() {
        assert_eq!(mask_email("alice@example.com"), "a***@example.com");
        assert_eq!(mask_email("not-an-address"), "***");
    }
}
