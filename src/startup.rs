//! The one place that builds the application from settings: store, audit sink,
//! providers, HTTP server; and that owns shutdown.

use std::net::TcpListener;
use std::sync::Arc;
use std::time::Duration;

use actix_web::dev::{Server, ServerHandle};
use actix_web::middleware::from_fn;
use actix_web::{web, App, HttpServer};
use anyhow::Context;
use tracing_actix_web::TracingLogger;

use crate::audit::{retention, AuditDb, AuditSink, DbSink, Journal, ObservedSink, SinkConfig};
use crate::connections::per_ip::PerIp;
use crate::connections::{ConnectionPlan, DescriptorLimit, Listener, ListenerCap, ListenerHook};
use crate::delivery::email::Email;
use crate::delivery::{build_sender, SmsSender, TemplateDirs, Templates, TemplatesCell};
use crate::guard::admin::SubjectAdmin;
use crate::guard::admin_auth::AdminAuthGuard;
use crate::guard::login::LoginGuard;
use crate::guard::sms::SmsGuard;
use crate::guard::{GuardContext, Policy, PolicyCell};
use crate::lists::{self, Lists};
use crate::reload::Reloadable;
use crate::routes::cors::CorsOrigins;
use crate::routes::request_id::RequestSpan;
use crate::routes::{self, Access, AppState};
use crate::settings::{OnStoreError, Settings, StoreBackend};
use crate::store::memory::MemoryStore;
use crate::store::redis::RedisStore;
use crate::store::resilient::{Fallback, ResilientStore};
use crate::store::{Clock, Keys, SystemClock, WindowStore};

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

/// The key namer `[store]` asks for: ids in clear, or hashed.
fn keys(settings: &Settings) -> Keys {
    let prefix = settings.store.key_prefix.clone();
    if settings.store.hash_subject_ids {
        Keys::hashed(
            prefix,
            &settings.store.subject_hash_key(&settings.sms.code_secret),
        )
    } else {
        Keys::new(prefix)
    }
}

const SWEEP_EVERY: Duration = Duration::from_secs(30);
const MIGRATE_WAIT: Duration = Duration::from_secs(5);

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
        crate::domain::PhoneNumber::warm_up();
        let clock: Arc<dyn Clock> = overrides.clock.unwrap_or_else(|| Arc::new(SystemClock));
        let mut background = Vec::new();
        let mut sweep = |store: Arc<MemoryStore>| {
            background.push(tokio::spawn(async move {
                let mut tick = tokio::time::interval(SWEEP_EVERY);
                loop {
                    tick.tick().await;
                    store.sweep();
                }
            }));
        };

        // Checked at start-up to fit in a usize (`settings::validate`).
        let memory_limit = usize::try_from(settings.store.memory_limit).unwrap_or(usize::MAX);
        let in_process = || Arc::new(MemoryStore::with_limit(clock.clone(), memory_limit));
        let mut redis = None;
        let primary: Arc<dyn WindowStore> = match settings.store.backend {
            StoreBackend::Memory => {
                let memory = in_process();
                sweep(memory.clone());
                memory
            }
            StoreBackend::Redis => {
                let store = Arc::new(
                    RedisStore::connect(settings.store.redis_url.expose(), settings.store.timeout)
                        .await
                        .context("cannot set up the Redis client")?,
                );
                redis = Some(store.clone());
                store
            }
        };
        let fallback = match settings.store.on_error {
            OnStoreError::Deny => Fallback::Deny,
            OnStoreError::Allow => {
                let codes = in_process();
                sweep(codes.clone());
                Fallback::Allow(codes)
            }
            OnStoreError::Local => {
                let local = in_process();
                sweep(local.clone());
                Fallback::Local(local)
            }
        };
        let store: Arc<dyn WindowStore> = Arc::new(ResilientStore::new(primary.clone(), fallback));

        let (audit, audit_db): (Arc<dyn AuditSink>, Option<AuditDb>) = match overrides.audit {
            Some(sink) => (sink, None),
            None => {
                let config = &settings.audit;
                let db = AuditDb::connect_lazy(config.database_url.expose())
                    .context("cannot set up the audit database")?;
                // The journal first: an unusable spool directory is a
                // start-up error, not something found when the database fails.
                let journal = Journal::open(&config.spool_dir, config.journal_max_bytes)
                    .with_context(|| {
                        format!(
                            "audit.spool_dir {:?} is not usable (it must be a writable directory)",
                            config.spool_dir
                        )
                    })?;
                // Migrate before serving when the database answers; when it is
                // down the writer migrates once it is back, and events wait in
                // the journal meanwhile.
                let database_ready = match tokio::time::timeout(MIGRATE_WAIT, db.migrate()).await {
                    Ok(Ok(())) => true,
                    Ok(Err(e)) => {
                        tracing::warn!(error = %e, "audit database not migrated yet; events spool until it is (they wait in the journal)");
                        false
                    }
                    Err(_) => {
                        tracing::warn!("audit database did not answer; events spool until it does (they wait in the journal)");
                        false
                    }
                };
                let sink = DbSink::start(
                    db.clone(),
                    journal,
                    SinkConfig {
                        batch_size: config.batch_size,
                        flush_interval: config.flush_interval,
                        queue_capacity: config.queue_capacity,
                        journal_sync_interval: config.journal_sync_interval,
                    },
                    database_ready,
                )
                .context("cannot start the audit journal thread")?;
                background.push(retention::spawn(db.clone(), config.retention));
                (sink, Some(db))
            }
        };
        let email =
            Email::start(&settings.email, templates.clone()).context("cannot set up email")?;
        let audit: Arc<dyn AuditSink> = match email.alerts() {
            Some(alerts) => Arc::new(ObservedSink::new(audit, vec![alerts])),
            None => audit,
        };
        let sms_sender: Arc<dyn SmsSender> = match overrides.sms_sender {
            Some(sender) => sender,
            None => {
                build_sender(&settings.sms.provider).context("cannot set up the SMS provider")?
            }
        };
        let policy = Policy::from_settings(&settings).context("cannot build the captcha client")?;
        let policy = Arc::new(PolicyCell::new(policy));
        let lists = Arc::new(Lists::new(
            settings.lists.entries(),
            audit_db
                .clone()
                .map(|db| Arc::new(db) as Arc<dyn lists::ListStore>),
        ));
        if let Err(e) = lists.refresh().await {
            tracing::warn!(error = %e, "stored list entries not read yet; retried every lists.refresh_interval");
        }
        background.push(lists::spawn_refresh(
            lists.clone(),
            settings.lists.refresh_interval,
        ));
        let ctx = GuardContext {
            store,
            keys: keys(&settings),
            audit: audit.clone(),
            policy: policy.clone(),
            lists: lists.clone(),
        };
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
            readiness_store: primary,
            audit: audit.clone(),
            audit_db,
            metrics,
        });

        let plan = connection_plan(&settings)?;
        let (public_routes, admin_routes): (Routes, Option<Routes>) =
            match settings.server.admin_bind {
                Some(_) => (routes::configure_public, Some(routes::configure_admin)),
                None => (routes::configure, None),
            };
        let listener = TcpListener::bind(settings.server.bind)
            .with_context(|| format!("cannot listen on {}", settings.server.bind))?;
        let port = listener.local_addr()?.port();
        let shared = Shared {
            state,
            redis,
            cors: Arc::new(CorsOrigins::new(&settings.server.cors_origins)),
            request_timeout: settings.server.request_timeout,
            shutdown_timeout: settings.server.shutdown_timeout,
        };
        let per_ip = PerIp::new(
            u32::try_from(plan.per_ip).unwrap_or(u32::MAX),
            settings.server.trusted_proxies.clone(),
        );
        let server = http_server(
            Serve {
                listener,
                routes: public_routes,
                name: Listener::Public,
                cap: plan.public,
                per_ip: Some(per_ip),
            },
            &shared,
        )?;
        let admin = match (settings.server.admin_bind, admin_routes, plan.admin) {
            (Some(bind), Some(routes), Some(cap)) => {
                let listener = TcpListener::bind(bind)
                    .with_context(|| format!("cannot listen on {bind} (server.admin_bind)"))?;
                let admin_port = listener.local_addr()?.port();
                let admin_server = http_server(
                    Serve {
                        listener,
                        routes,
                        name: Listener::Admin,
                        cap,
                        per_ip: None,
                    },
                    &shared,
                )?;
                tracing::info!(address = %format!("{}:{admin_port}", bind.ip()), "tollgate admin listening");
                Some((admin_server, admin_port))
            }
            _ => None,
        };
        tracing::info!(address = %format!("{}:{port}", settings.server.bind.ip()), "tollgate listening");
        Ok(Self {
            server,
            port,
            admin,
            audit,
            reloadable: Reloadable {
                policy,
                lists,
                templates,
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

/// Raise the descriptor limit, then derive the connection caps from it.
fn connection_plan(settings: &Settings) -> anyhow::Result<ConnectionPlan> {
    let limit = DescriptorLimit::raise().context("cannot read the descriptor limit")?;
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    let plan = ConnectionPlan::derive(settings, limit.soft, cpus)?;
    tracing::info!(
        nofile_started = limit.started,
        nofile_soft = limit.soft,
        nofile_hard = limit.hard,
        reserved = plan.reserved,
        max_connections = plan.public.total(),
        admin_max_connections = plan.admin.map(|cap| cap.total()),
        max_connections_per_ip = plan.per_ip,
        "connection caps"
    );
    Ok(plan)
}

/// Which routes a listener serves.
type Routes = fn(&mut web::ServiceConfig, &CorsOrigins);

/// What every listener shares.
struct Shared {
    state: web::Data<AppState>,
    redis: Option<Arc<RedisStore>>,
    cors: Arc<CorsOrigins>,
    request_timeout: Duration,
    shutdown_timeout: Duration,
}

/// One listener: its socket, routes and connection bounds.
struct Serve {
    listener: TcpListener,
    routes: Routes,
    name: Listener,
    cap: ListenerCap,
    /// The per-address count (public listener only).
    per_ip: Option<Arc<PerIp>>,
}

/// An HTTP/1 server on `serve.listener` serving its routes over the shared
/// state. (`listen` serves HTTP/1 only: no h2c, and no TLS is configured.)
fn http_server(serve: Serve, shared: &Shared) -> std::io::Result<Server> {
    let Serve {
        listener,
        routes,
        name,
        cap,
        per_ip,
    } = serve;
    let (state, redis, cors) = (
        shared.state.clone(),
        shared.redis.clone(),
        shared.cors.clone(),
    );
    let hook = Arc::new(ListenerHook::new(name, shared.request_timeout, per_ip));
    // actix's whole-seconds granularity, rounded up.
    let drain =
        shared.shutdown_timeout.as_secs() + u64::from(shared.shutdown_timeout.subsec_nanos() > 0);
    Ok(HttpServer::new(move || {
        // Runs on each worker thread, inside its runtime: the worker's
        // requests then talk to Redis without leaving the thread.
        if let Some(redis) = &redis {
            redis.connect_this_thread();
        }
        // The last `wrap` runs first: the request id, then its span, then
        // the timing inside the span, then the body deadline.
        App::new()
            .wrap(from_fn(crate::connections::deadline::middleware))
            .wrap(from_fn(routes::http_metrics::middleware))
            .wrap(TracingLogger::<RequestSpan>::new())
            .wrap(from_fn(routes::request_id::middleware))
            .app_data(state.clone())
            .configure(|cfg| routes(cfg, &cors))
            .default_service(web::to(routes::not_found))
    })
    .workers(cap.workers)
    .max_connections(cap.per_worker)
    // The watchdog closes a connection without a whole head at
    // `request_timeout`; actix's own head timer (a bare 408) stays only as
    // a backstop behind it.
    .client_request_timeout(shared.request_timeout.saturating_mul(2))
    .on_connect(move |io, extensions| hook.on_connect(io, extensions))
    .listen(listener)?
    .disable_signals()
    .shutdown_timeout(drain)
    .run())
}
