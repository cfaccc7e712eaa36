//! Admin alerts. [`AdminAlerts`] watches the audit trail (an
//! `AuditObserver`); locks and SMS denials are copied to a background task that decides when the admins
//! get a digest: when a subject is locked, or an SMS rule denies more than
//! `email.alert_threshold` requests within `email.alert_window`; at most one
//! email per `email.alert_interval`, telling what happened since the last one.

use std::sync::Arc;
use std::time::Duration;

use chrono::Utc;
use lettre::message::Mailbox;
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;
use tokio::time::Instant;

mod digest;

use super::mailer::{Mailer, Outgoing, Reach};
use crate::audit::{AuditEvent, AuditObserver};
use crate::delivery::{EmailKind, TemplatesCell};
use crate::metrics::{self, EmailOutcome};
use crate::telemetry::log_budget::LogBudget;
use digest::{alert_worthy, Watch};
pub(crate) use digest::{Digest, LockSeen, RuleOverThreshold};

/// Events waiting for the alert task; more are dropped (alerts only, the
/// audit trail itself is not affected).
const ALERT_QUEUE: usize = 4096;

/// `[email]` keys of the alerts.
#[derive(Debug, Clone)]
pub struct AlertSettings {
    /// The admins' addresses (`email.admin_alerts_to`).
    pub to: Vec<Mailbox>,
    /// Denials of one rule within `window` above which a digest is due
    /// (`email.alert_threshold`).
    pub threshold: u32,
    /// `email.alert_window`.
    pub window: Duration,
    /// Least time between two digests (`email.alert_interval`).
    pub interval: Duration,
    /// Locale of the digests (`email.admin_locale`).
    pub locale: String,
}

/// Copies the alert-worthy events to the alert task. Never waits.
pub struct AdminAlerts {
    tx: mpsc::Sender<AuditEvent>,
}

impl AdminAlerts {
    /// Spawns the alert task on the current Tokio runtime; it ends once the
    /// observer is dropped, or at [`AlertsStop::finish`].
    pub fn start(
        settings: AlertSettings,
        mailer: Mailer,
        templates: Arc<TemplatesCell>,
    ) -> (Self, AlertsStop) {
        let (tx, rx) = mpsc::channel(ALERT_QUEUE);
        let (stop, stopped) = oneshot::channel();
        let task = tokio::spawn(run(rx, stopped, settings, mailer, templates));
        (Self { tx }, AlertsStop { stop, task })
    }
}

/// Ends the alert task at shutdown. Between two digests, locks wait up to
/// `email.alert_interval` for the next one: a stop (a deploy, an eviction)
/// that dropped the task lost them, with no digest and no log line.
pub struct AlertsStop {
    stop: oneshot::Sender<()>,
    task: JoinHandle<()>,
}

impl AlertsStop {
    /// Send the digest of what waits at once, and wait for the mail server's
    /// word on it, for at most `bound`.
    pub async fn finish(self, bound: Duration) {
        let _ = self.stop.send(());
        if tokio::time::timeout(bound, self.task).await.is_err() {
            tracing::warn!(
                ?bound,
                "the last admin alert digest was not sent in time at shutdown: its locks are \
                 in the audit trail"
            );
        }
    }
}

/// A flood fills the alert queue by the thousand a second: one line per
/// interval says so, with how many went unsaid.
static DROPPED_LINES: LogBudget = LogBudget::new(Duration::from_secs(10));

impl AuditObserver for AdminAlerts {
    fn observe(&self, event: &AuditEvent) {
        if !alert_worthy(event) {
            return;
        }
        let why = match self.tx.try_send(event.clone()) {
            Ok(()) => return,
            Err(mpsc::error::TrySendError::Full(_)) => "admin alert queue full",
            Err(mpsc::error::TrySendError::Closed(_)) => "admin alert task stopped",
        };
        if let Some(held_back) = DROPPED_LINES.admit() {
            tracing::warn!(held_back, "{why}: event not counted for alerts");
        }
    }
}

async fn run(
    mut rx: mpsc::Receiver<AuditEvent>,
    mut stopped: oneshot::Receiver<()>,
    settings: AlertSettings,
    mailer: Mailer,
    templates: Arc<TemplatesCell>,
) {
    let mut watch = Watch::new(
        settings.threshold,
        settings.window,
        settings.interval,
        Utc::now(),
    );
    // The digest the mailer is sending, and how it will tell whether any
    // admin got it; the next one waits for that word.
    let mut in_flight: Option<(Digest, oneshot::Receiver<Reach>)> = None;
    loop {
        let next = watch.next_send().filter(|_| in_flight.is_none());
        // A disabled branch's future is still built: give it some instant.
        let sleep =
            tokio::time::sleep_until(next.unwrap_or_else(|| Instant::now() + settings.interval));
        tokio::select! {
            // Asked to stop, or the one asking gone.
            _ = &mut stopped => break,
            event = rx.recv() => match event {
                Some(event) => watch.observe(&event, Instant::now()),
                None => break,
            },
            reach = async {
                match in_flight.as_mut() {
                    Some((_, reached)) => reached.await.unwrap_or(Reach::Failed),
                    None => std::future::pending().await,
                }
            } => {
                if let Some((digest, _)) = in_flight.take() {
                    took_back(&mut watch, digest, reach);
                }
            }
            _ = sleep, if next.is_some() => {
                if let Some(digest) = watch.take_digest(Instant::now(), Utc::now()) {
                    in_flight = send_digest(&mailer, &settings, &templates, digest, &mut watch);
                }
            }
        }
    }
    // Stopping: the digest in flight first, then what waits goes now, the
    // events already queued counted (the caller bounds how long this takes).
    if let Some((digest, reached)) = in_flight.take() {
        let reach = reached.await.unwrap_or(Reach::Failed);
        took_back(&mut watch, digest, reach);
    }
    while let Ok(event) = rx.try_recv() {
        watch.observe(&event, Instant::now());
    }
    if let Some(digest) = watch.take_pending(Instant::now(), Utc::now()) {
        if let Some((_, reached)) = send_digest(&mailer, &settings, &templates, digest, &mut watch)
        {
            if reached.await.unwrap_or(Reach::Failed) != Reach::Reached {
                tracing::warn!("no admin got the last alert digest at shutdown: its locks are in the audit trail");
            }
        }
    }
}

/// Give `watch` back what of a sent `digest` no admin got. A digest the
/// server refused for good may be refused for its text (a content filter's
/// `554` at a user name a caller chose): its locks come back as a count
/// only, or that name would be in every digest after it, each refused.
fn took_back(watch: &mut Watch, digest: Digest, reach: Reach) {
    let keep_locks = match reach {
        Reach::Reached => return,
        Reach::Failed => true,
        Reach::Refused => false,
    };
    tracing::warn!(
        ?reach,
        "no admin got the alert digest: the next one tells it"
    );
    watch.restore(digest, keep_locks, Instant::now());
}

/// Queue `digest` to every admin: what to wait for, or `None` when it
/// could not be queued (then `watch` has it back) or rendered (a bug:
/// the templates are checked at start-up and on reload).
fn send_digest(
    mailer: &Mailer,
    settings: &AlertSettings,
    templates: &TemplatesCell,
    digest: Digest,
    watch: &mut Watch,
) -> Option<(Digest, oneshot::Receiver<Reach>)> {
    let rendered =
        templates
            .current()
            .render_email(EmailKind::AlertDigest, Some(&settings.locale), &digest);
    let email = match rendered {
        Ok(email) => email,
        Err(e) => {
            tracing::error!(error = %e, "cannot render the admin alert digest");
            let kind = EmailKind::AlertDigest.as_str();
            metrics::emails(kind, EmailOutcome::Failed, settings.to.len());
            return None;
        }
    };
    let (reached, told) = oneshot::channel();
    let queued = mailer.enqueue(Outgoing {
        kind: EmailKind::AlertDigest,
        to: settings.to.clone(),
        email,
        reached: Some(reached),
        ahead: false,
    });
    if queued {
        Some((digest, told))
    } else {
        watch.restore(digest, true, Instant::now());
        None
    }
}

#[cfg(test)]
mod tests {
    use super::digest::*;
    use super::*;
    use crate::audit::AuditDecision;
    use crate::domain::Action;
    use crate::domain::{Rule, Subject, SubjectKind};

    const MIN: Duration = Duration::from_secs(60);

    fn watch(threshold: u32) -> Watch {
        Watch::new(threshold, 5 * MIN, 60 * MIN, Utc::now())
    }

    fn lock(user: &str) -> AuditEvent {
        let rule = Rule::new(SubjectKind::User, 10, 60 * MIN);
        AuditEvent::new(
            Action::LoginAttempt,
            AuditDecision::Lock,
            "too_many_failures",
            &Subject::new(SubjectKind::User, user),
        )
        .rule(&rule, 10)
        .retry_after_ms(15 * 60_000)
    }

    fn sms_denial(phone: &str) -> AuditEvent {
        let rule = Rule::new(SubjectKind::Phone, 5, 60 * MIN);
        AuditEvent::new(
            Action::SmsSend,
            AuditDecision::Deny,
            "rate_limited",
            &Subject::new(SubjectKind::Phone, phone),
        )
        .rule(&rule, 5)
    }

    #[test]
    fn a_lock_makes_a_digest_due_at_once() {
        let mut w = watch(100);
        let t0 = Instant::now();
        assert_eq!(w.next_send(), None);
        w.observe(&lock("alice"), t0);
        assert_eq!(w.next_send(), Some(t0));
        let digest = w.take_digest(t0, Utc::now()).expect("due");
        assert_eq!(digest.locks.len(), 1);
        assert_eq!(digest.locks[0].subject, "alice");
        assert_eq!(digest.locks[0].minutes, 15);
        assert!(digest.rules.is_empty());
        assert_eq!(w.next_send(), None, "nothing waits after a digest");
    }

    /// A user name a caller chose is no link in the admin's mail client;
    /// tollgate's own formatting (an address) is shown as it is.
    #[test]
    fn a_user_name_is_defanged_and_an_address_is_not() {
        let mut w = watch(100);
        let t0 = Instant::now();
        w.observe(&lock("https://evil.example/reset?token=1"), t0);
        w.observe(&lock("mallory@evil.example"), t0);
        w.observe(&lock("evil\u{3002}example\u{FF61}com"), t0);
        w.observe(
            &lock("x\u{2028}\u{2028}No further locks\u{2029}\u{202e}"),
            t0,
        );
        let mut blocked = lock("unused");
        blocked.subject_kind = SubjectKind::Ip;
        blocked.subject = "203.0.113.9".to_string();
        w.observe(&blocked, t0);
        let digest = w.take_digest(t0, Utc::now()).expect("due");
        let shown: Vec<&str> = digest.locks.iter().map(|l| l.subject.as_str()).collect();
        assert_eq!(
            shown,
            [
                "https[:]//evil[.]example/reset?token=1",
                "mallory@evil[.]example",
                "evil[.]example[.]com",
                "x\u{FFFD}\u{FFFD}No further locks\u{FFFD}\u{FFFD}",
                "203.0.113.9"
            ]
        );
    }

    #[test]
    fn the_next_digest_waits_for_the_interval_and_holds_what_happened_since() {
        let mut w = watch(100);
        let t0 = Instant::now();
        w.observe(&lock("alice"), t0);
        w.take_digest(t0, Utc::now()).expect("first digest");

        w.observe(&lock("bob"), t0 + MIN);
        w.observe(&lock("carol"), t0 + 2 * MIN);
        assert_eq!(w.next_send(), Some(t0 + 60 * MIN));
        assert!(
            w.take_digest(t0 + 59 * MIN, Utc::now()).is_none(),
            "not before the interval"
        );
        let digest = w
            .take_digest(t0 + 60 * MIN, Utc::now())
            .expect("due after the interval");
        let users: Vec<&str> = digest.locks.iter().map(|l| l.subject.as_str()).collect();
        assert_eq!(users, ["bob", "carol"]);
    }

    #[test]
    fn an_sms_rule_alerts_only_above_the_threshold_within_the_window() {
        let mut w = watch(3);
        let t0 = Instant::now();
        let secs = Duration::from_secs;
        for i in 0..3 {
            w.observe(&sms_denial("+8613800138000"), t0 + secs(i));
        }
        assert_eq!(w.next_send(), None, "3 denials are not more than 3");

        // Three more, but the first ones have left the 5-minute window.
        let later = t0 + 5 * MIN + secs(10);
        for i in 0..3 {
            w.observe(&sms_denial("+8613800138000"), later + secs(i));
        }
        assert_eq!(w.next_send(), None, "3 within the window");

        w.observe(&sms_denial("+8613900139000"), later + secs(3));
        assert_eq!(
            w.next_send(),
            Some(later + secs(3)),
            "4 denials within 5 minutes"
        );
        let digest = w.take_digest(later + secs(3), Utc::now()).unwrap();
        assert_eq!(
            digest.rules,
            vec![RuleOverThreshold {
                action: "sms_send".into(),
                rule: "phone 5/1h".into(),
                denials: 7,
                threshold: 3,
                window: "5m".into(),
            }]
        );
        assert!(digest.locks.is_empty());
    }

    #[test]
    fn challenges_and_login_denials_do_not_alert() {
        let mut w = watch(1);
        let subject = Subject::new(SubjectKind::User, "alice");
        let t0 = Instant::now();
        for _ in 0..5 {
            w.observe(
                &AuditEvent::new(
                    Action::LoginAttempt,
                    AuditDecision::Deny,
                    "user_locked",
                    &subject,
                ),
                t0,
            );
            w.observe(
                &AuditEvent::new(
                    Action::SmsSend,
                    AuditDecision::Challenge,
                    "captcha_required",
                    &subject,
                ),
                t0,
            );
        }
        assert_eq!(w.next_send(), None);
        assert!(!alert_worthy(&AuditEvent::new(
            Action::LoginAttempt,
            AuditDecision::Deny,
            "ip_blocked",
            &subject
        )));
        assert!(alert_worthy(&lock("alice")));
        assert!(alert_worthy(&sms_denial("+8613800138000")));
    }

    fn ip_block(ip: &str) -> AuditEvent {
        let mut blocked = lock("unused");
        blocked.subject_kind = SubjectKind::Ip;
        blocked.subject = ip.to_string();
        blocked
    }

    /// Made-up names locked by the dozen must not push a lock of another
    /// kind out of the listing: it takes the place of the latest user lock.
    #[test]
    fn a_flood_of_one_kind_leaves_room_for_a_lock_of_another() {
        let mut w = watch(100);
        let t0 = Instant::now();
        for i in 0..(LISTED_LOCKS + 20) {
            w.observe(&lock(&format!("junk{i}")), t0);
        }
        w.observe(&ip_block("203.0.113.9"), t0);
        w.observe(&ip_block("203.0.113.10"), t0);
        for i in 0..5 {
            w.observe(&lock(&format!("more{i}")), t0);
        }
        let digest = w.take_digest(t0, Utc::now()).unwrap();
        assert_eq!(digest.locks.len(), LISTED_LOCKS);
        assert_eq!(digest.more_locks, 27, "every lock is told");
        let ips: Vec<&str> = digest
            .locks
            .iter()
            .filter(|l| l.kind == "ip")
            .map(|l| l.subject.as_str())
            .collect();
        assert_eq!(ips, ["203.0.113.9", "203.0.113.10"]);
        // The user locks listed are the first ones, in their order.
        assert_eq!(digest.locks[0].subject, "junk0");
        assert_eq!(digest.locks[47].subject, "junk47");
    }

    /// A digest no admin got is told by the next one: its period, its
    /// locks first, its rules' denials added to the ones since.
    #[test]
    fn a_digest_no_admin_got_is_told_by_the_next() {
        let mut w = watch(2);
        let t0 = Instant::now();
        let started = Utc::now();
        w.observe(&lock("alice"), t0);
        for _ in 0..3 {
            w.observe(&sms_denial("+8613800138000"), t0);
        }
        let lost = w.take_digest(t0, started).expect("due");
        assert_eq!(lost.rules.len(), 1);
        w.observe(&lock("bob"), t0 + MIN);
        w.observe(&sms_denial("+8613800138000"), t0 + MIN);
        w.restore(lost.clone(), true, t0 + 2 * MIN);
        assert_eq!(
            w.next_send(),
            Some(t0 + 60 * MIN),
            "it waits for the interval, as any second digest does"
        );
        let next = w
            .take_digest(t0 + 60 * MIN, Utc::now())
            .expect("due after the interval");
        assert_eq!(next.since, lost.since);
        let users: Vec<&str> = next.locks.iter().map(|l| l.subject.as_str()).collect();
        assert_eq!(users, ["alice", "bob"]);
        assert_eq!(next.rules.len(), 1, "{:?}", next.rules);
        assert_eq!(next.rules[0].denials, 4);

        // Refused for good, perhaps for a name in it: its locks come back
        // as a count, not as text.
        w.observe(&lock("poison"), t0 + 61 * MIN);
        let refused = w.take_digest(t0 + 120 * MIN, Utc::now()).expect("due");
        w.restore(refused, false, t0 + 121 * MIN);
        w.observe(&lock("carol"), t0 + 122 * MIN);
        let after = w.take_digest(t0 + 180 * MIN, Utc::now()).expect("due");
        let users: Vec<&str> = after.locks.iter().map(|l| l.subject.as_str()).collect();
        assert_eq!(users, ["carol"]);
        assert_eq!(after.more_locks, 1);
    }

    #[test]
    fn a_flood_of_locks_lists_the_first_ones_and_counts_the_rest() {
        let mut w = watch(100);
        let t0 = Instant::now();
        for i in 0..(LISTED_LOCKS + 7) {
            w.observe(&lock(&format!("user{i}")), t0);
        }
        let digest = w.take_digest(t0, Utc::now()).unwrap();
        assert_eq!(digest.locks.len(), LISTED_LOCKS);
        assert_eq!(digest.more_locks, 7);
    }
}
