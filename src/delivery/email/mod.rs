//! Email through lettre (async SMTP): the lockout notice to an account's owner
//! and the admin alert digest. `email.smtp_url` empty turns both off.
//!
//! Nothing here sits on a request's path: notices and digests go to a bounded
//! queue served by one background task (`mailer`), which retries transient
//! SMTP failures with backoff and logs what it could not send.

mod alerts;
mod mailer;
mod notice;
mod notice_gate;

use std::sync::Arc;

pub use alerts::{AdminAlerts, AlertSettings, AlertsStop};
pub(crate) use alerts::{Digest, LockSeen, RuleOverThreshold};
pub use mailer::{Mailer, MailerConfig, Outgoing, Reach};
pub(crate) use notice::LockNoticeVars;
pub use notice::{mask_email, EmailLockNotifier, LockNotice, LockNotifier, LockedScope, NoNotices};

use super::{SetupError, TemplatesCell};
use crate::audit::AuditObserver;
use crate::settings::EmailSettings;

/// Email as `[email]` configures it.
pub struct Email {
    mailer: Option<Mailer>,
    alerts: Option<AlertSettings>,
    templates: Arc<TemplatesCell>,
}

impl Email {
    /// Checks the addresses and, unless `smtp_url` is empty, starts the mail
    /// task on the current Tokio runtime.
    pub fn start(
        settings: &EmailSettings,
        templates: Arc<TemplatesCell>,
    ) -> Result<Self, SetupError> {
        Self::start_with(settings, templates, MailerConfig::default())
    }

    /// `start`, with the mail task's queue and retries given (tests).
    pub fn start_with(
        settings: &EmailSettings,
        templates: Arc<TemplatesCell>,
        config: MailerConfig,
    ) -> Result<Self, SetupError> {
        if settings.smtp_url.expose().is_empty() {
            return Ok(Self {
                mailer: None,
                alerts: None,
                templates,
            });
        }
        let to = settings.admin_alerts_to.clone();
        // The task ends by itself once every `Mailer` is dropped and its queue is empty.
        let (mailer, _task) = Mailer::start(settings, config)?;
        let alerts = (!to.is_empty()).then(|| AlertSettings {
            to,
            threshold: settings.alert_threshold,
            window: settings.alert_window,
            interval: settings.alert_interval,
            locale: settings.admin_locale.clone(),
        });
        Ok(Self {
            mailer: Some(mailer),
            alerts,
            templates,
        })
    }

    /// Whether emails go out (`email.smtp_url` is set).
    pub fn enabled(&self) -> bool {
        self.mailer.is_some()
    }

    /// Where `LoginGuard` sends lockout notices.
    pub fn lock_notifier(&self) -> Arc<dyn LockNotifier> {
        match &self.mailer {
            Some(mailer) => Arc::new(EmailLockNotifier::new(
                mailer.clone(),
                self.templates.clone(),
            )),
            None => Arc::new(NoNotices),
        }
    }

    /// The admin alerts' watch on the audit trail, when they are on, and
    /// what ends them at shutdown (this starts the alert task, which ends
    /// there or once the watch is dropped).
    pub fn alerts(&self) -> Option<(Arc<dyn AuditObserver>, AlertsStop)> {
        match (&self.mailer, &self.alerts) {
            (Some(mailer), Some(alerts)) => {
                let (watch, stop) =
                    AdminAlerts::start(alerts.clone(), mailer.clone(), self.templates.clone());
                Some((Arc::new(watch), stop))
            }
            _ => None,
        }
    }
}
