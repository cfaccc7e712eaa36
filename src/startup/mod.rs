//! The one place that builds the application from settings, in steps: the
//! store (`store`), the audit sink (`audit`), providers, lists and guards,
//! then the listeners (`listeners`); and that owns shutdown.

mod audit;
mod listeners;
mod store;

use std::sync::Arc;

use actix_web::dev::{Server, ServerHandle};
use actix_web::web;
use anyhow::Context;

use crate::audit::{AuditDb, AuditLog, AuditSink, ObservedSink};
use crate::delivery::email::Email;
use crate::delivery::{
    build_sender, SenderCell, SmsSender, TemplateDirs, Templates, TemplatesCell,
};
use crate::guard::admin::SubjectAdmin;
use crate::guard::admin_auth::AdminAuthGuard;
use crate::guard::login::LoginGuard;
use crate::guard::sms::SmsGuard;
use crate::guard::{GuardContext, Policy, PolicyCell};
use crate::lists::{self, Lists};
use crate::reload::{Reloadable, SenderSlot};
use crate::routes::{Access, AppState};
use crate::settings::Settings;
use crate::store::{Clock, SystemClock};

/// Parts a test may substitute; production uses none.
#[derive(Default)]
pub struct Overrides {
    /// Replaces the provider `[sms.provider]` names.
    pub sms_sender: Option<Arc<dyn SmsSender>>,
    /// Replaces the audit database and its sink; no database is opened.
    pub audit: Option<Arc<dyn AuditSink>>,
    /// The in-process stores' clock, instead of the system's.
    pub clock: Option<Arc<dyn Clock>>,
}

/// The running service: its bound listener, HTTP server and background tasks.
pub struct Application {
    server: Server,
    port: u16,
    /// The admin listener (`server.admin_bind`) and its port.
    admin: Option<(Server, u16)>,
    audit: Arc<dyn AuditSink>,
    reloadable: Reloadable,
    background: Vec<tokio::task::JoinHandle<()>>,
}

/// The SMS provider in force, and what a reload makes it again through: a
/// sender given (tests) stays; one made from `[sms.provider]` is remade.
fn sms_sender(
    settings: &Settings,
    given: Option<Arc<dyn SmsSender>>,
) -> anyhow::Result<(Arc<SenderCell>, Option<SenderSlot>)> {
    Ok(match given {
        Some(sender) => (Arc::new(SenderCell::new(sender)), None),
        None => {
            let sender =
                build_sender(&settings.sms.provider).context("cannot set up the SMS provider")?;
            let cell = Arc::new(SenderCell::new(sender));
            let slot = SenderSlot::new(cell.clone(), settings.sms.provider.clone());
            (cell, Some(slot))
        }
    })
}

/// The audit sink, with the alert mails watching it when `email` sends them.
fn with_alerts(audit: Arc<dyn AuditSink>, email: &Email) -> Arc<dyn AuditSink> {
    match email.alerts() {
        Some(alerts) => Arc::new(ObservedSink::new(audit, vec![alerts])),
        None => audit,
    }
}

/// Without API keys a login backend names no client's address (DESIGN.md
/// §3: only a key's caller may), so every login it reports counts under its
/// own loopback address, and the per-IP windows add up every user's
/// failures: a hundred wrong passwords, anyone's, block every login.
fn warn_without_api_keys(settings: &Settings) {
    if settings.server.api_keys.is_empty() {
        tracing::warn!(
            ip_block_after = settings.login.ip_block_after,
            "server.api_keys is empty: a login backend on loopback cannot name its clients' addresses, \
             so every login counts under its own and login.ip_block_after failures of all users together \
             block every login; set server.api_keys in production (docs/security.md)"
        );
    }
}

/// Without `server.admin_bind` the console, the admin API and `/metrics`
/// answer on `server.bind`: on an address others reach, `/metrics` (no
/// credential) tells anyone how near each rule is to its limit and whether
/// the store fails open, and the console's sign-in is one more door.
fn warn_of_admin_routes_on_a_public_bind(settings: &Settings) {
    let server = &settings.server;
    if server.admin_bind.is_none() && !server.bind.ip().to_canonical().is_loopback() {
        tracing::warn!(
            bind = %server.bind,
            "server.admin_bind is unset, so the console, the admin API and /metrics answer on \
             server.bind, which is not loopback; set server.admin_bind to an address only \
             operators reach (docs/connections.md)"
        );
    }
}

/// The `log` SMS provider writes every code to the log, which is right on
/// a laptop; beside a shared Redis store it is a production set-up left
/// half done, where whoever reads the logs can verify any phone.
fn warn_of_codes_in_the_log(settings: &Settings) {
    use crate::settings::{SmsProviderKind, StoreBackend};
    if settings.sms.provider.kind == SmsProviderKind::Log
        && settings.store.backend == StoreBackend::Redis
    {
        tracing::warn!(
            "sms.provider is \"log\" with a Redis store: every code is written to the log, \
             where whoever reads it can verify any phone; set sms.provider (docs/delivery.md)"
        );
    }
}

/// With `captcha.kind = "none"` only the backend can say a captcha was
/// passed (`captcha_passed`). Where browsers call `/sms/*` themselves
/// (`server.keyless_sms`, or no keys on an address others reach) no
/// caller of theirs can pass one, so every captcha tier refuses them as a
/// limit would, and a few unverified sends put a victim's phone, an IPv6
/// network, or a surging country, out of reach for its window.
fn warn_of_captchas_no_browser_can_pass(settings: &Settings) {
    use crate::settings::CaptchaKind;
    let server = &settings.server;
    let browsers = server.keyless_sms
        || (server.api_keys.is_empty() && !server.bind.ip().to_canonical().is_loopback());
    if browsers && settings.captcha.kind == CaptchaKind::None {
        tracing::warn!(
            "browsers call /sms/* and captcha.kind is \"none\": no browser can pass a captcha, \
             so every captcha tier (sms.captcha_after, sms.network_captcha_after, the pumping \
             guard's challenges) refuses them like a limit; set [captcha] (docs/integration.md)"
        );
    }
}

/// `captcha.hostnames` and `captcha.actions` are read from a provider's
/// answers: with `kind = "none"` there are none, and the lists do nothing.
/// reCAPTCHA scores keys outside Enterprise in steps up to 0.9, so a
/// `min_score` above it refuses everyone.
fn warn_of_answer_checks_without_a_provider(settings: &Settings) {
    use crate::settings::CaptchaKind;
    let captcha = &settings.captcha;
    if captcha.kind == CaptchaKind::None
        && !(captcha.hostnames.is_empty() && captcha.actions.is_empty())
    {
        tracing::warn!(
            "captcha.hostnames or captcha.actions is set with captcha.kind = \"none\": \
             no provider answers, so nothing is checked against them (docs/delivery.md)"
        );
    }
    if captcha.kind == CaptchaKind::Recaptcha && captcha.min_score.get() > 0.9 {
        tracing::warn!(
            "captcha.min_score is above 0.9: reCAPTCHA keys outside Enterprise score at most \
             0.9, so every token is refused (docs/delivery.md)"
        );
    }
}

/// Settings that work but leave a production service open to misuse.
fn warn_of_risky_settings(settings: &Settings) {
    warn_without_api_keys(settings);
    warn_of_admin_routes_on_a_public_bind(settings);
    warn_of_codes_in_the_log(settings);
    warn_of_captchas_no_browser_can_pass(settings);
    warn_of_answer_checks_without_a_provider(settings);
}

impl Application {
    /// Build everything `settings` configures and bind `server.bind`.
    pub async fn build(settings: Settings) -> anyhow::Result<Self> {
        Self::build_with(settings, Overrides::default()).await
    }

    /// `build`, with the parts `overrides` names put in place of the configured
    /// ones.
    pub async fn build_with(settings: Settings, overrides: Overrides) -> anyhow::Result<Self> {
        // First: a broken template stops start-up before anything is opened.
        let templates = Templates::load(&TemplateDirs::of(&settings))
            .context("cannot load the SMS and email templates")?;
        let templates = Arc::new(TemplatesCell::new(templates));
        let metrics = crate::metrics::install();
        warn_of_risky_settings(&settings);
        crate::domain::PhoneNumber::warm_up();
        let clock: Arc<dyn Clock> = overrides.clock.unwrap_or_else(|| Arc::new(SystemClock));
        let mut background = Vec::new();
        let stores = store::open(&settings, clock, &mut background).await?;
        let (audit, audit_db) = match overrides.audit {
            Some(sink) => (sink, None),
            None => {
                let (sink, db) = audit::open(&settings, &mut background).await?;
                (sink, Some(db))
            }
        };
        let email =
            Email::start(&settings.email, templates.clone()).context("cannot set up email")?;
        let audit = with_alerts(audit, &email);
        let (sms_sender, sender_slot) = sms_sender(&settings, overrides.sms_sender)?;
        let policy = Policy::from_settings(&settings).context("cannot build the captcha client")?;
        let policy = Arc::new(PolicyCell::new(policy));
        let lists = open_lists(&settings, audit_db.clone(), &mut background).await;
        let keys = store::keys(&settings);
        let readiness_key = keys.readiness();
        let ctx = GuardContext::new(
            stores.store,
            keys,
            audit.clone(),
            policy.clone(),
            lists.clone(),
        );
        let state = web::Data::new(AppState {
            sms: SmsGuard::new(
                ctx.clone(),
                sms_sender,
                templates.clone(),
                settings.sms.code_secret.expose(),
            ),
            login: LoginGuard::new(ctx.clone(), email.lock_notifier()),
            admin_auth: AdminAuthGuard::new(ctx.clone(), &settings.server.admin_auth_limit),
            admin: SubjectAdmin::new(ctx),
            lists: lists.clone(),
            access: Access::new(&settings.server),
            oidc: crate::oidc::Oidc::new(&settings.admin.oidc)
                .context("cannot set up single sign-on (admin.oidc)")?
                .map(Arc::new),
            readiness_store: stores.primary,
            readiness_key,
            audit: audit.clone(),
            audit_log: audit_db
                .clone()
                .map(|db| AuditLog::new(db, settings.audit.read_timeout)),
            audit_db,
            metrics,
        });

        let listeners::Listening {
            server,
            port,
            admin,
        } = listeners::bind(
            &settings,
            &listeners::Shared::new(&settings, state, stores.redis),
        )?;
        Ok(Self {
            server,
            port,
            admin,
            audit,
            reloadable: Reloadable {
                policy,
                lists,
                templates,
                sender: sender_slot,
            },
            background,
        })
    }

    /// The port actually bound, for a `server.bind` of port 0.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The admin listener's port, when `server.admin_bind` is set.
    pub fn admin_port(&self) -> Option<u16> {
        self.admin.as_ref().map(|(_, port)| *port)
    }

    /// The sink every audit event goes to (tests flush it).
    pub fn audit_sink(&self) -> Arc<dyn AuditSink> {
        self.audit.clone()
    }

    /// A handle to stop the server from another task.
    pub fn handle(&self) -> ServerHandle {
        self.server.handle()
    }

    /// What a reload (SIGHUP, a changed file) swaps in: the decision
    /// settings, the config's list entries and the templates.
    pub fn reloadable(&self) -> Reloadable {
        self.reloadable.clone()
    }

    /// Serve until SIGTERM / Ctrl-C (or [`ServerHandle::stop`]), then stop
    /// in this order, so that the audit drain always gets its time within
    /// the unit's `TimeoutStopSec`:
    ///
    /// 1. both listeners stop accepting and finish their connections, for
    ///    at most `server.shutdown_timeout` (actix closes what is left);
    /// 2. the audit queue is written out: every answered request's events
    ///    are in it by then;
    /// 3. the background tasks stop.
    pub async fn run_until_stopped(self) -> std::io::Result<()> {
        let public_handle = self.server.handle();
        let mut public = tokio::spawn(self.server);
        let (admin_handle, mut admin) = match self.admin {
            Some((server, _)) => (Some(server.handle()), Some(tokio::spawn(server))),
            None => (None, None),
        };
        let admin_stopped = async {
            match admin.as_mut() {
                Some(task) => {
                    let _ = task.await;
                }
                None => std::future::pending().await,
            }
        };
        // A task whose end was awaited here must not be awaited again.
        let (mut public_ended, mut admin_ended) = (None, false);
        tokio::select! {
            () = stop_signal() => {}
            ended = &mut public => public_ended = Some(ended),
            () = admin_stopped => admin_ended = true,
        }

        tracing::info!("stopping: finishing open connections");
        let drain_admin = async {
            if let Some(handle) = &admin_handle {
                handle.stop(true).await;
            }
        };
        futures::join!(public_handle.stop(true), drain_admin);
        let ended = match public_ended {
            Some(ended) => ended,
            None => public.await,
        };
        let result = ended.unwrap_or_else(|e| Err(std::io::Error::other(e)));
        if let Some(task) = admin.filter(|_| !admin_ended) {
            let _ = task.await;
        }

        tracing::info!("connections closed; writing the audit queue");
        self.audit.flush().await;
        for task in self.background {
            task.abort();
        }
        result
    }
}

/// The allow and block lists: the config's entries and, with an audit
/// database, the stored ones, read now and refreshed by a task pushed to
/// `background`.
async fn open_lists(
    settings: &Settings,
    audit_db: Option<AuditDb>,
    background: &mut Vec<tokio::task::JoinHandle<()>>,
) -> Arc<Lists> {
    let lists = Arc::new(Lists::new(
        settings.lists.entries(),
        audit_db.map(|db| Arc::new(db) as Arc<dyn lists::ListStore>),
    ));
    if let Err(e) = lists.refresh().await {
        tracing::warn!(error = %e, "stored list entries not read yet; retried every lists.refresh_interval");
    }
    background.push(lists::spawn_refresh(
        lists.clone(),
        settings.lists.refresh_interval,
    ));
    lists
}

/// SIGTERM or SIGINT (Ctrl-C): both stop gracefully. actix's own signal
/// handling is off, so that one place stops both listeners at once.
async fn stop_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    let terminate = async {
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                term.recv().await;
            }
            Err(e) => {
                tracing::warn!(error = %e, "SIGTERM cannot be handled; Ctrl-C still stops");
                std::future::pending::<()>().await;
            }
        }
    };
    tokio::select! {
        () = terminate => {}
        _ = tokio::signal::ctrl_c() => {}
    }
}
