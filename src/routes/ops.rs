use actix_web::{web, HttpResponse};
use serde_json::json;

use super::AppState;
use crate::error::ApiError;

pub fn configure(cfg: &mut web::ServiceConfig) {
    cfg.route("/healthz", web::get().to(healthz))
        .route("/readyz", web::get().to(readyz))
        .route("/metrics", web::get().to(metrics));
}

async fn healthz() -> HttpResponse {
    HttpResponse::Ok().json(json!({ "status": "ok" }))
}

async fn readyz(state: web::Data<AppState>) -> Result<HttpResponse, ApiError> {
    state.readiness_store.ping().await?;
    if !state.audit.ready().await {
        return Err(ApiError::AuditUnavailable);
    }
    Ok(HttpResponse::Ok().json(json!({ "status": "ready" })))
}

async fn metrics(state: web::Data<AppState>) -> HttpResponse {
    match &state.metrics {
        Some(handle) => HttpResponse::Ok()
            .content_type("text/plain; version=0.0.4")
            .body(handle.render()),
        None => HttpResponse::ServiceUnavailable().json(json!({
            "error": "metrics_unavailable",
            "message": "the metrics recorder could not be installed"
        })),
    }
}
