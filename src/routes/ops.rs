//! Operations: liveness (`/healthz`), readiness (`/readyz`) and Prometheus
//! metrics (`/metrics`).

use actix_web::{web, HttpResponse};
use serde::Serialize;
use utoipa::ToSchema;

use super::AppState;
use crate::error::{ErrorBody, ErrorCode};

/// Register `/healthz` and `/readyz`. `detailed`: `/readyz` names what is
/// not ready (the admin listener); otherwise it says only whether (a public
/// listener: an attacker learns nothing of the audit database or the disk).
pub fn configure_probes(cfg: &mut web::ServiceConfig, detailed: bool) {
    cfg.service(get_or_head("/healthz", healthz));
    if detailed {
        cfg.service(get_or_head("/readyz", readyz_detailed));
    } else {
        cfg.service(get_or_head("/readyz", readyz));
    }
}

/// `/metrics`: on the admin listener when there is one.
pub fn configure_metrics(cfg: &mut web::ServiceConfig) {
    cfg.service(get_or_head("/metrics", metrics));
}

/// A resource answering GET, and HEAD alike without the body (RFC 9110
/// §9.1: uptime monitors and load balancers probe with HEAD); other
/// methods answer the JSON 405.
fn get_or_head<F, Args>(path: &str, handler: F) -> actix_web::Resource
where
    F: actix_web::Handler<Args> + Clone,
    Args: actix_web::FromRequest + 'static,
    F::Output: actix_web::Responder + 'static,
{
    web::resource(path)
        .route(web::get().to(handler.clone()))
        .route(web::head().to(handler))
        .default_service(super::other_methods("GET, HEAD"))
}

/// `/healthz` and `/readyz` 200.
#[derive(Serialize, ToSchema)]
pub struct OpsStatus {
    /// `ok` (`/healthz`) or `ready` (`/readyz`).
    #[schema(example = "ok")]
    status: &'static str,
}

/// Liveness: the process is up
#[utoipa::path(
    get,
    path = "/healthz",
    operation_id = "healthz",
    tag = "operations",
    responses((status = 200, description = "`{\"status\": \"ok\"}`", body = OpsStatus)),
)]
async fn healthz() -> HttpResponse {
    HttpResponse::Ok().json(OpsStatus { status: "ok" })
}

/// Readiness: the store answers, and the audit trail is healthy
#[utoipa::path(
    get,
    path = "/readyz",
    operation_id = "readyz",
    tag = "operations",
    responses(
        (status = 200, description = "`{\"status\": \"ready\"}`", body = OpsStatus),
        (status = 503, description = "`not_ready`: the store, the audit database, the audit journal or the stored list entries (not read since the start) are not ready; only the admin listener's `/readyz` says which", body = ErrorBody),
    ),
)]
async fn readyz(state: web::Data<AppState>) -> HttpResponse {
    if readiness(&state).await.ready() {
        HttpResponse::Ok().json(OpsStatus { status: "ready" })
    } else {
        HttpResponse::ServiceUnavailable().json(ErrorBody::new(ErrorCode::NotReady, "not ready"))
    }
}

/// `/readyz` on the admin listener: the same answer, plus which part is
/// not ready.
async fn readyz_detailed(state: web::Data<AppState>) -> HttpResponse {
    let r = readiness(&state).await;
    let word = |ok: bool, bad: &'static str| if ok { "ok" } else { bad };
    let parts = serde_json::json!({
        "store": word(r.store, "unavailable"),
        "audit_database": word(r.audit.database, "unavailable"),
        "audit_journal": word(r.audit.journal, "unwritable"),
        "lists": word(r.lists, "not_read"),
    });
    let mut body = if r.ready() {
        serde_json::json!({ "status": "ready" })
    } else {
        serde_json::json!({ "error": ErrorCode::NotReady, "message": "not ready" })
    };
    if let (Some(body), Some(parts)) = (body.as_object_mut(), parts.as_object()) {
        body.extend(parts.clone());
    }
    if r.ready() {
        HttpResponse::Ok().json(body)
    } else {
        HttpResponse::ServiceUnavailable().json(body)
    }
}

/// What `/readyz` looks at: one store write a second, shared by every probe
/// (`StoreProbe`, bounded by `store.timeout`), and the audit trail's state
/// as its writer and journal last saw it (no database round trip on the
/// probe's path).
struct Readiness {
    store: bool,
    audit: crate::audit::AuditHealth,
    /// The admins' stored list entries were read since the start: until
    /// then their block entries are not in force here.
    lists: bool,
}

impl Readiness {
    fn ready(&self) -> bool {
        self.store && self.audit.ready() && self.lists
    }
}

async fn readiness(state: &AppState) -> Readiness {
    Readiness {
        store: state.readiness.writable().await,
        audit: state.audit.health(),
        lists: state.lists.read_once(),
    }
}

/// Prometheus metrics
#[utoipa::path(
    get,
    path = "/metrics",
    operation_id = "metrics",
    tag = "operations",
    responses(
        (status = 200, description = "Prometheus text exposition format", body = String,
            content_type = "text/plain; version=0.0.4"),
        (status = 503, description = "`metrics_unavailable`: no metrics recorder could be installed", body = ErrorBody),
    ),
)]
async fn metrics(state: web::Data<AppState>) -> HttpResponse {
    match &state.metrics {
        Some(handle) => HttpResponse::Ok()
            .content_type("text/plain; version=0.0.4")
            .body(handle.render()),
        None => HttpResponse::ServiceUnavailable().json(ErrorBody::new(
            ErrorCode::MetricsUnavailable,
            "the metrics recorder could not be installed",
        )),
    }
}
