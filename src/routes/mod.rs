//! HTTP routes. Each module registers its own routes; handlers parse, call a
//! guard and map the outcome to a response.

pub mod admin;
mod api_key;
mod caller;
pub mod cors;
pub mod http_metrics;
mod json;
pub mod login;
pub mod openapi;
pub mod ops;
pub mod request_id;
mod schemas;
pub mod sms;
mod store_probe;
pub mod to_the_end;

use std::sync::Arc;

use actix_web::{web, HttpResponse};

pub use caller::Access;
use cors::CorsOrigins;
pub use store_probe::StoreProbe;

use crate::audit::{AuditDb, AuditSink};
use crate::error::ApiError;
use crate::guard::admin::SubjectAdmin;
use crate::guard::login::LoginGuard;
use crate::guard::sms::SmsGuard;

/// Body limit of the public JSON routes.
pub const BODY_LIMIT: usize = 16 * 1024;

/// What every handler shares: the guards, authentication, and what
/// `/readyz`, `/metrics` and the admin API read.
pub struct AppState {
    /// `/sms/*` decisions.
    pub sms: SmsGuard,
    /// `/login/*` decisions.
    pub login: LoginGuard,
    /// Subject state and unblock, for the admin API and console.
    pub admin: SubjectAdmin,
    /// API keys, admin tokens and the client IP.
    pub access: Access,
    /// Single sign-on for admins (`[admin.oidc]`); absent when off.
    pub oidc: Option<Arc<crate::oidc::Oidc>>,
    /// Failed admin authentications per address, and their throttle.
    pub admin_auth: crate::guard::admin_auth::AdminAuthGuard,
    /// `/readyz`'s write to the store, one a second for every probe.
    pub readiness: StoreProbe,
    /// The audit sink, whose health `/readyz` reads.
    pub audit: Arc<dyn AuditSink>,
    /// The allow and block lists, for the admin API and console.
    pub lists: Arc<crate::lists::Lists>,
    /// The audit database, for the admin API (absent when a test replaced the sink).
    pub audit_db: Option<AuditDb>,
    /// The trail as admins read it, with its bounds (absent with `audit_db`).
    pub audit_log: Option<crate::audit::AuditLog>,
    /// Renders `/metrics`; absent when no recorder could be installed.
    pub metrics: Option<metrics_exporter_prometheus::PrometheusHandle>,
    /// Decisions whose requests were dropped, finishing (a stop waits).
    pub detached: to_the_end::Detached,
}

impl AppState {
    /// What the admin operations work on.
    pub fn desk(&self) -> crate::admin::Desk<'_> {
        crate::admin::Desk {
            audit: self.audit.as_ref(),
            audit_log: self.audit_log.as_ref(),
            lists: &self.lists,
        }
    }
}

/// Register every route: one listener serves all.
pub fn configure(cfg: &mut web::ServiceConfig, cors: &CorsOrigins) {
    configure_public(cfg, cors);
    admin::configure(cfg);
    ops::configure_metrics(cfg);
}

/// The routes of the public listener when admin routes have their own
/// (`server.admin_bind`): the API, its document and the probes.
pub fn configure_public(cfg: &mut web::ServiceConfig, cors: &CorsOrigins) {
    sms::configure(cfg, cors);
    login::configure(cfg);
    ops::configure_probes(cfg, false);
    openapi::configure(cfg);
}

/// The routes of the admin listener (`server.admin_bind`): the admin API,
/// the console, `/metrics` and the probes.
pub fn configure_admin(cfg: &mut web::ServiceConfig, _cors: &CorsOrigins) {
    admin::configure(cfg);
    ops::configure_probes(cfg, true);
    ops::configure_metrics(cfg);
}

/// The JSON 404 for a path no route matches.
pub async fn not_found() -> Result<HttpResponse, ApiError> {
    Err(ApiError::NotFound)
}

/// A resource's answer to a method it does not take: the JSON 405 with
/// `Allow` (`"GET"`, `"POST"`, `"GET, POST"`).
pub(crate) fn other_methods(allow: &'static str) -> actix_web::Route {
    web::to(move || async move { Err::<HttpResponse, _>(ApiError::MethodNotAllowed(allow)) })
}

/// A POST-only resource whose other methods answer a JSON 405 with `Allow`.
/// A JSON body is read with [`json::Body`], which answers 415 to any other
/// content type (actix's `web::Json` alone would take `text/json`).
pub(crate) fn post<F, Args>(path: &str, handler: F) -> actix_web::Resource
where
    F: actix_web::Handler<Args>,
    Args: actix_web::FromRequest + 'static,
    F::Output: actix_web::Responder + 'static,
{
    web::resource(path)
        .route(web::post().to(handler))
        .default_service(other_methods("POST"))
}

/// A GET-only resource whose other methods answer a JSON 405 with `Allow`.
pub(crate) fn get<F, Args>(path: &str, handler: F) -> actix_web::Resource
where
    F: actix_web::Handler<Args>,
    Args: actix_web::FromRequest + 'static,
    F::Output: actix_web::Responder + 'static,
{
    web::resource(path)
        .route(web::get().to(handler))
        .default_service(other_methods("GET"))
}
