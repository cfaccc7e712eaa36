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

use crate::audit::{retention, AuditDb, AuditSink, DbSink, ObservedSink, SinkConfig};
use crate::delivery::email::Email;
use crate::delivery::{build_sender, SmsSender, TemplateDirs, Templates, TemplatesCell};
use crate::guard::admin::SubjectAdmin;
use crate::guard::login::LoginGuard;
use crate::guard::sms::SmsGuard;
use crate::guard::{GuardContext, Policy, PolicyCell};
use crate::lists::{self, Lists};
use crate::reload::Reloadable;
use crate::routes::cors::CorsOrigins;
use crate::routes::{self, Access, AppState};
use crate::settings::{OnStoreError, Settings, StoreBackend};
use crate::store::memory::MemoryStore;
use crate::store::redis::RedisStore;
use crate::store::resilient::{Fallback, ResilientStore};
use crate::store::{Clock, Keys, SystemClock, WindowStore};
use crate::telemetry::RequestSpan;

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

        let mut redis = None;
        let primary: Arc<dyn WindowStore> = match settings.store.backend {
            StoreBackend::Memory => {
                let memory = Arc::new(MemoryStore::new(clock.clone()));
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
                let codes = Arc::new(MemoryStore::new(clock.clone()));
                sweep(codes.clone());
                Fallback::Allow(codes)
            }
            OnStoreError::Local => {
                let local = Arc::new(MemoryStore::new(clock.clone()));
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
                // Migrate before serving when the database answers; when it is
                // down the writer migrates once it is back, and spools meanwhile.
                match tokio::time::timeout(MIGRATE_WAIT, db.migrate()).await {
                    Ok(Ok(())) => {}
                    Ok(Err(e)) => {
                        tracing::warn!(error = %e, "audit database not migrated yet; events spool until it is")
                    }
                    Err(_) => {
                        tracing::warn!("audit database did not answer; events spool until it does")
                    }
                }
                let sink = DbSink::start(
                    db.clone(),
                    SinkConfig {
                        batch_size: config.batch_size,
                        flush_interval: config.flush_interval,
                        queue_capacity: config.queue_capacity,
                        spool_dir: config.spool_dir.clone().into(),
                    },
                );
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
        let lists = Arc::new(Lists::new(&settings.lists, audit_db.clone()));
        if let Err(e) = lists.refresh().await {
            tracing::warn!(error = %e, "stored list entries not read yet; retried every lists.refresh_interval");
        }
        background.push(lists::spawn_refresh(
            lists.clone(),
            settings.lists.refresh_interval,
        ));
        let ctx = GuardContext {
            store,
            keys: Keys::new(settings.store.key_prefix.clone()),
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
            admin: SubjectAdmin::new(ctx),
            lists: lists.clone(),
            access: Access::new(&settings.server),
            readiness_store: primary,
            audit: audit.clone(),
            audit_db,
            metrics,
        });

        let (public_routes, admin_routes): (Routes, Option<Routes>) =
            match settings.server.admin_bind {
                Some(_) => (routes::configure_public, Some(routes::configure_admin)),
                None => (routes::configure, None),
            };
        let listener = TcpListener::bind(settings.server.bind)
            .with_context(|| format!("cannot listen on {}", settings.server.bind))?;
        let port = listener.local_addr()?.port();
        let cors = Arc::new(CorsOrigins::new(&settings.server.cors_origins));
        let server = http_server(
            listener,
            state.clone(),
            redis.clone(),
            public_routes,
            cors.clone(),
        )?;
        let admin = match (settings.server.admin_bind, admin_routes) {
            (Some(bind), Some(routes)) => {
                let listener = TcpListener::bind(bind)
                    .with_context(|| format!("cannot listen on {bind} (server.admin_bind)"))?;
                let admin_port = listener.local_addr()?.port();
                let admin_server = http_server(listener, state, redis, routes, cors)?;
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

    /// Serve until SIGTERM / Ctrl-C (or [`ServerHandle::stop`]): in-flight
    /// requests finish, then the audit queue is drained.
    pub async fn run_until_stopped(self) -> std::io::Result<()> {
        // The admin listener lives as long as the public one.
        let admin = self.admin.map(|(server, _)| {
            let handle = server.handle();
            (tokio::spawn(server), handle)
        });
        let result = self.server.await;
        if let Some((task, handle)) = admin {
            handle.stop(true).await;
            let _ = task.await;
        }
        self.audit.flush().await;
        for task in self.background {
            task.abort();
        }
        result
    }
}

/// Which routes a listener serves.
type Routes = fn(&mut web::ServiceConfig, &CorsOrigins);

/// An HTTP server on `listener` serving `routes` over the shared state.
fn http_server(
    listener: TcpListener,
    state: web::Data<AppState>,
    redis: Option<Arc<RedisStore>>,
    routes: Routes,
    cors: Arc<CorsOrigins>,
) -> std::io::Result<Server> {
    Ok(HttpServer::new(move || {
        // Runs on each worker thread, inside its runtime: the worker's
        // requests then talk to Redis without leaving the thread.
        if let Some(redis) = &redis {
            redis.connect_this_thread();
        }
        // The last `wrap` runs first: the request id, then its span, then
        // the timing inside the span.
        App::new()
            .wrap(from_fn(routes::http_metrics::middleware))
            .wrap(TracingLogger::<RequestSpan>::new())
            .wrap(from_fn(routes::request_id::middleware))
            .app_data(state.clone())
            .configure(|cfg| routes(cfg, &cors))
            .default_service(web::to(routes::not_found))
    })
    .listen(listener)?
    .shutdown_timeout(30)
    .run())
}
