//! Operations: liveness (`/healthz`), readiness (`/readyz`) and Prometheus
//! metrics (`/metrics`).

use actix_web::{web, HttpResponse};
use serde::Serialize;
use utoipa::ToSchema;

use super::AppState;
use crate::error::{ApiError, ErrorBody, ErrorCode};

/// Register `/healthz`, `/readyz` and `/metrics`.
pub fn configure_probes(cfg: &mut web::ServiceConfig) {
    cfg.service(super::get("/healthz", healthz))
        .service(super::get("/readyz", readyz));
}

/// `/metrics`: on the admin listener when there is one.
pub fn configure_metrics(cfg: &mut web::ServiceConfig) {
    cfg.service(super::get("/metrics", metrics));
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

/// Readiness: the store and the audit database are reachable
#[utoipa::path(
    get,
    path = "/readyz",
    operation_id = "readyz",
    tag = "operations",
    responses(
        (status = 200, description = "`{\"status\": \"ready\"}`", body = OpsStatus),
        (status = 503, description = "`store_unavailable` or `audit_unavailable`", body = ErrorBody),
    ),
)]
async fn readyz(state: web::Data<AppState>) -> Result<HttpResponse, ApiError> {
    state.readiness_store.ping().await?;
    if !state.audit.ready().await {
        return Err(ApiError::AuditUnavailable);
    }
    Ok(HttpResponse::Ok().json(OpsStatus { status: "ready" }))
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
