//! The listeners: the public one (`server.bind`) and, with
//! `server.admin_bind`, the admin one, each an actix server with its
//! connection caps, deadlines and middleware.

use std::net::TcpListener;
use std::sync::Arc;
use std::time::Duration;

use actix_web::dev::Server;
use actix_web::{web, App, HttpServer};
use anyhow::Context;

use crate::connections::per_ip::PerIp;
use crate::connections::{ConnectionPlan, DescriptorLimit, Listener, ListenerCap, ListenerHook};
use crate::routes::cors::CorsOrigins;
use crate::routes::{self, AppState};
use crate::settings::Settings;
use crate::store::redis::RedisStore;

/// The bound listeners, not yet running.
pub(super) struct Listening {
    pub server: Server,
    pub port: u16,
    /// The admin listener and its port.
    pub admin: Option<(Server, u16)>,
}

/// Bind `server.bind` (and `server.admin_bind`) with the connection caps
/// the descriptor limit allows.
pub(super) fn bind(settings: &Settings, shared: &Shared) -> anyhow::Result<Listening> {
    let plan = connection_plan(settings)?;
    let (public_routes, admin_routes): (Routes, Option<Routes>) = match settings.server.admin_bind {
        Some(_) => (routes::configure_public, Some(routes::configure_admin)),
        None => (routes::configure, None),
    };
    let listener = TcpListener::bind(settings.server.bind)
        .with_context(|| format!("cannot listen on {}", settings.server.bind))?;
    let port = listener.local_addr()?.port();
    // With `trusted_proxy_hops` every peer is a proxy by its position (the
    // balancers' addresses are not listed): counting them per address
    // would let one busy client fill its balancer's slots for everyone.
    // An IPv6 /48 gets twice an address's connections on the public
    // listener, once its on the admin one: neither is filled by one
    // customer's /64s.
    let per_ip_of = |cap: u64, per_network: u32| {
        (settings.server.trusted_proxy_hops == 0).then(|| {
            let cap = u32::try_from(cap).unwrap_or(u32::MAX);
            PerIp::new(
                cap,
                cap.saturating_mul(per_network),
                settings.server.trusted_proxies.clone(),
            )
        })
    };
    let per_ip = per_ip_of(plan.per_ip, 2);
    let server = http_server(
        Serve {
            listener,
            routes: public_routes,
            name: Listener::Public,
            cap: plan.public,
            per_ip,
        },
        shared,
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
                    per_ip: plan.admin_per_ip.and_then(|cap| per_ip_of(cap, 1)),
                },
                shared,
            )?;
            tracing::info!(address = %format!("{}:{admin_port}", bind.ip()), "tollgate admin listening");
            Some((admin_server, admin_port))
        }
        _ => None,
    };
    tracing::info!(address = %format!("{}:{port}", settings.server.bind.ip()), "tollgate listening");
    Ok(Listening {
        server,
        port,
        admin,
    })
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
        workers = plan.public.workers,
        max_connections = plan.public.total(),
        admin_max_connections = plan.admin.map(|cap| cap.total()),
        max_connections_per_ip = plan.per_ip,
        admin_max_connections_per_ip = plan.admin_per_ip,
        "connection caps"
    );
    Ok(plan)
}

/// Which routes a listener serves.
type Routes = fn(&mut web::ServiceConfig, &CorsOrigins);

/// What every listener shares.
pub(super) struct Shared {
    pub state: web::Data<AppState>,
    pub redis: Option<Arc<RedisStore>>,
    pub cors: Arc<CorsOrigins>,
    pub request_timeout: Duration,
    pub shutdown_timeout: Duration,
}

impl Shared {
    /// What every listener's workers share, with the timeouts and CORS
    /// origins `settings` names.
    pub fn new(
        settings: &Settings,
        state: web::Data<AppState>,
        redis: Option<Arc<RedisStore>>,
    ) -> Self {
        Shared {
            state,
            redis,
            cors: Arc::new(CorsOrigins::new(&settings.server.cors_origins)),
            request_timeout: settings.server.request_timeout,
            shutdown_timeout: settings.server.shutdown_timeout,
        }
    }
}

/// One listener: its socket, routes and connection bounds.
struct Serve {
    listener: TcpListener,
    routes: Routes,
    name: Listener,
    cap: ListenerCap,
    /// The per-address count (none when every peer is a proxy,
    /// `server.trusted_proxy_hops`).
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
        // One layer for the request id, its span, its timing and its body
        // deadline.
        App::new()
            .wrap(routes::request_id::RequestIdLayer)
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
