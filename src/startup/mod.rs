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
use crate::delivery::email::{AlertsStop, Email};
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
use crate::routes::{Access, AppState, StoreProbe};
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
    /// The admin alert mails, told of the stop after the audit flush.
    alerts: Option<AlertsStop>,
    reloadable: Reloadable,
    background: Vec<tokio::task::JoinHandle<()>>,
    /// Decisions whose requests were dropped: a stop lets them end.
    detached: crate::routes::to_the_end::Detached,
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

/// The audit sink, with the alert mails watching it when `email` sends
/// them, and what ends those at shutdown.
fn with_alerts(
    audit: Arc<dyn AuditSink>,
    email: &Email,
) -> (Arc<dyn AuditSink>, Option<AlertsStop>) {
    match email.alerts() {
        Some((alerts, stop)) => (Arc::new(ObservedSink::new(audit, vec![alerts])), Some(stop)),
        None => (audit, None),
    }
}

/// How long the last admin alert digest may take at shutdown, after the
/// audit flush: within the 30 s a Kubernetes pod or a systemd unit waits
/// for the whole stop by default.
const LAST_DIGEST_BOUND: std::time::Duration = std::time::Duration::from_secs(5);

/// How long a stop waits for decisions whose clients went away (each ends
/// within `store.timeout`, or an SMS provider's timeout) before the
/// connections are drained: with the drain, the audit flush and the digest
/// (10 s, 11 s and 5 s by default), within those 30 s too.
const DETACHED_BOUND: std::time::Duration = std::time::Duration::from_secs(3);

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
        crate::settings::warnings::warn_of_risky_settings(&settings);
        crate::domain::PhoneNumber::warm_up();
        let clock: Arc<dyn Clock> = overrides.clock.unwrap_or_else(|| Arc::new(SystemClock));
        let mut background = Vec::new();
        let stores = store::open(&settings, clock, &mut background).await?;
        let (audit, audit_db) = open_audit(&settings, overrides.audit, &mut background).await?;
        let email =
            Email::start(&settings.email, templates.clone()).context("cannot set up email")?;
        let (audit, alerts) = with_alerts(audit, &email);
        let (sms_sender, sender_slot) = sms_sender(&settings, overrides.sms_sender)?;
        let policy = Policy::from_settings(&settings).context("cannot build the captcha client")?;
        let policy = Arc::new(PolicyCell::new(policy));
        let lists = open_lists(&settings, audit_db.clone(), &mut background).await;
        let keys = store::keys(&settings);
        let ctx = GuardContext::new(
            stores.store,
            keys,
            audit.clone(),
            policy.clone(),
            lists.clone(),
        );
        let detached = crate::routes::to_the_end::Detached::default();
        let state = web::Data::new(AppState {
            sms: SmsGuard::new(
                ctx.clone(),
                sms_sender,
                templates.clone(),
                settings.sms.code_secret.expose(),
            ),
            login: LoginGuard::new(ctx.clone(), email.lock_notifier()),
            admin_auth: AdminAuthGuard::new(ctx.clone(), &settings.server),
            readiness: StoreProbe::new(stores.primary, ctx.keys.readiness()),
            admin: SubjectAdmin::new(ctx),
            lists: lists.clone(),
            access: Access::new(&settings.server),
            oidc: crate::oidc::Oidc::new(&settings.admin.oidc)
                .context("cannot set up single sign-on (admin.oidc)")?
                .map(Arc::new),
            audit: audit.clone(),
            audit_log: audit_db
                .clone()
                .map(|db| AuditLog::new(db, settings.audit.read_timeout)),
            audit_db,
            metrics,
            detached: detached.clone(),
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
            alerts,
            reloadable: Reloadable {
                policy,
                lists,
                templates,
                sender: sender_slot,
            },
            background,
            detached,
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
    /// 3. the admin alert digest of what waits goes out (at most 5 s);
    /// 4. the background tasks stop.
    pub async fn run_until_stopped(self) -> std::io::Result<()> {
        let public_handle = self.server.handle();
        let mut public = tokio::spawn(self.server);
        let (admin_handle, mut admin) = match self.admin {
            Some((server, _)) => (Some(server.handle()), Some(tokio::spawn(server))),
            None => (None, None),
        };
        let admin_stopped = async {
            match admin.as_mut() {
                Some(task) => task.await,
                None => std::future::pending().await,
            }
        };
        // A task whose end was awaited here must not be awaited again.
        let (mut public_ended, mut admin_ended) = (None, None);
        tokio::select! {
            () = stop_signal() => {}
            ended = &mut public => public_ended = Some(ended),
            ended = admin_stopped => admin_ended = Some(ended),
        }

        // A decision whose client went away runs on its worker's runtime,
        // which stops as soon as the worker holds no connection: no new
        // connection is taken, and those decisions get a bound to end in.
        public_handle.pause().await;
        if let Some(handle) = &admin_handle {
            handle.pause().await;
        }
        if !self.detached.settled(DETACHED_BOUND).await {
            tracing::warn!(
                running = self.detached.running(),
                "stopping: decisions whose clients went away had not ended; dropped"
            );
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
        let admin_ended = match (admin_ended, admin) {
            (Some(ended), _) => Some(ended),
            (None, Some(task)) => Some(task.await),
            (None, None) => None,
        };
        // Either listener's failure fails the run (a panic in its task
        // included), so that the process exits with an error and systemd's
        // `Restart=on-failure` starts the next: the admin one's was dropped.
        let failed = |ended: Result<std::io::Result<()>, tokio::task::JoinError>| {
            ended.unwrap_or_else(|e| Err(std::io::Error::other(e)))
        };
        let result = failed(ended).and(admin_ended.map_or(Ok(()), failed));

        tracing::info!("connections closed; writing the audit queue");
        self.audit.flush().await;
        if let Some(alerts) = self.alerts {
            alerts.finish(LAST_DIGEST_BOUND).await;
        }
        for task in self.background {
            task.abort();
        }
        result
    }
}

/// The audit sink a test gave, or the one `[audit]` opens with its database.
async fn open_audit(
    settings: &Settings,
    given: Option<Arc<dyn AuditSink>>,
    background: &mut Vec<tokio::task::JoinHandle<()>>,
) -> anyhow::Result<(Arc<dyn AuditSink>, Option<AuditDb>)> {
    Ok(match given {
        Some(sink) => (sink, None),
        None => {
            let (sink, db) = audit::open(settings, background).await?;
            (sink, Some(db))
        }
    })
}

/// The allow and block lists: the config's entries and, with an audit
/// database, the stored ones, read now and refreshed by a task pushed to
/// `background`.
async fn open_lists(
    settings: &Settings,
    audit_db: Option<AuditDb>,
    background: &mut Vec<tokio::task::JoinHandle<()>>,
) -> Arc<Lists> {
    // Each read bounded: a database that takes the connection but not the
    // query (a table another instance's migration locks) held start-up, no
    // port bound, until liveness killed the pod. Until a read, `/readyz`
    // says the lists are not read.
    let lists = Lists::new(
        settings.lists.entries(),
        audit_db.map(|db| Arc::new(db) as Arc<dyn lists::ListStore>),
    )
    .reading_within(settings.audit.read_timeout);
    let lists = Arc::new(lists);
    if let Err(e) = lists.refresh().await {
        tracing::warn!(error = %e, "stored list entries not read yet; retried every lists.refresh_interval");
    }
    background.push(lists::spawn_refresh(
        lists.clone(),
        settings.lists.refresh_interval,
    ));
    lists
}

/// A stop asked by SIGTERM or SIGINT since [`watch_stop_signals`].
static STOP_REQUESTED: tokio::sync::Notify = tokio::sync::Notify::const_new();

/// Whether [`watch_stop_signals`] took the signals over.
static SIGNALS_WATCHED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Take SIGTERM and SIGINT over now, before the service is built (`serve`
/// does, first thing): until the handler is installed their default action
/// ends the process, a SIGTERM during start-up (the store's connect, the
/// migrations, seconds with a slow database) exiting 143 where a stop
/// exits 0. A stop asked during start-up is kept: the service stops as
/// soon as it runs. A second signal exits at once (130). Needs a Tokio
/// runtime.
pub fn watch_stop_signals() -> std::io::Result<()> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut terminate = signal(SignalKind::terminate())?;
    let mut interrupt = signal(SignalKind::interrupt())?;
    tokio::spawn(async move {
        for signals in 1.. {
            tokio::select! {
                _ = terminate.recv() => {}
                _ = interrupt.recv() => {}
            }
            if signals == 1 {
                STOP_REQUESTED.notify_one();
                continue;
            }
            // A second signal (an operator's second Ctrl-C) ends the process
            // at once, as the signal's default action did before the
            // handler: every answered event is in the journal already, and
            // the next process replays it.
            tracing::warn!("a second stop signal: exiting without waiting for the stop to finish");
            std::process::exit(130);
        }
    });
    SIGNALS_WATCHED.store(true, std::sync::atomic::Ordering::Release);
    Ok(())
}

/// SIGTERM or SIGINT (Ctrl-C), or an audit writer that panicked: each
/// stops gracefully. actix's own signal handling is off, so that one place
/// stops both listeners at once.
async fn stop_signal() {
    if SIGNALS_WATCHED.load(std::sync::atomic::Ordering::Acquire) {
        tokio::select! {
            () = STOP_REQUESTED.notified() => {}
            () = crate::audit::stop_asked() => {}
        }
        return;
    }
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
        () = crate::audit::stop_asked() => {}
    }
}
