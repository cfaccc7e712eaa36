//! Operations: liveness (`/healthz`), readiness (`/readyz`) and Prometheus
//! metrics (`/metrics`).

use actix_web::{web, HttpRequest, HttpResponse};
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
    params(
        ("exclude" = Option<String>, Query, description = "A part of readiness this probe leaves out, as kube-apiserver's `/readyz?exclude=`: here `audit_database` alone (the admin listener's `/readyz` takes `store`, `audit_database`, `audit_journal` and `lists`, comma-separated or the parameter repeated). The shipped Kubernetes probe leaves out `audit_database`, so that pods journal the audit trail through a database outage instead of leaving the Service.", example = "audit_database", pattern = "^audit_database(,audit_database)*$"),
    ),
    responses(
        (status = 200, description = "`{\"status\": \"ready\"}`", body = OpsStatus),
        (status = 400, description = "`invalid_request`: `exclude` names anything but `audit_database`", body = ErrorBody),
        (status = 503, description = "`not_ready`: the store, the audit database, the audit journal or the stored list entries (not read since the start) are not ready, of the parts not excluded; only the admin listener's `/readyz` says which", body = ErrorBody),
    ),
)]
async fn readyz(req: HttpRequest, state: web::Data<AppState>) -> HttpResponse {
    // Outside, only the database: a caller comparing answers learns no
    // more than whether the audit database alone is down, and a flood of
    // probes excluding every part cannot answer 200 for a pod that is not
    // ready (TollgateNotReady reads the share of 503s).
    let Some(excluded) = excluded(req.query_string(), &[ReadyPart::AuditDatabase]) else {
        return no_such_part("audit_database (the admin listener's /readyz takes every part)");
    };
    if readiness(&state).await.ready(&excluded) {
        HttpResponse::Ok().json(OpsStatus { status: "ready" })
    } else {
        HttpResponse::ServiceUnavailable().json(ErrorBody::new(ErrorCode::NotReady, "not ready"))
    }
}

/// `/readyz` on the admin listener: the same answer, plus which part is
/// not ready (every part, excluded or not).
async fn readyz_detailed(req: HttpRequest, state: web::Data<AppState>) -> HttpResponse {
    let Some(excluded) = excluded(req.query_string(), &ReadyPart::ALL) else {
        return no_such_part("store, audit_database, audit_journal or lists");
    };
    let r = readiness(&state).await;
    let ready = r.ready(&excluded);
    let word = |part: ReadyPart, bad: &'static str| if r.part(part) { "ok" } else { bad };
    let parts = serde_json::json!({
        "store": word(ReadyPart::Store, "unavailable"),
        "audit_database": word(ReadyPart::AuditDatabase, "unavailable"),
        "audit_journal": word(ReadyPart::AuditJournal, "unwritable"),
        "lists": word(ReadyPart::Lists, "not_read"),
    });
    let mut body = if ready {
        serde_json::json!({ "status": "ready" })
    } else {
        serde_json::json!({ "error": ErrorCode::NotReady, "message": "not ready" })
    };
    if let (Some(body), Some(parts)) = (body.as_object_mut(), parts.as_object()) {
        body.extend(parts.clone());
    }
    if ready {
        HttpResponse::Ok().json(body)
    } else {
        HttpResponse::ServiceUnavailable().json(body)
    }
}

/// A part of readiness, by the name the admin listener's `/readyz` gives it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ReadyPart {
    Store,
    AuditDatabase,
    AuditJournal,
    Lists,
}

impl ReadyPart {
    const ALL: [ReadyPart; 4] = [
        ReadyPart::Store,
        ReadyPart::AuditDatabase,
        ReadyPart::AuditJournal,
        ReadyPart::Lists,
    ];

    fn name(self) -> &'static str {
        match self {
            ReadyPart::Store => "store",
            ReadyPart::AuditDatabase => "audit_database",
            ReadyPart::AuditJournal => "audit_journal",
            ReadyPart::Lists => "lists",
        }
    }
}

/// The parts a probe's query leaves out: each `exclude` parameter, a part's
/// name or several comma-separated, exactly; `None` when one is anything
/// else. Other parameters are ignored, as they always were; a name that is
/// no part is refused (400), not ignored, so that a misspelt probe does not
/// wait on the part it meant to leave out.
fn excluded(query: &str, parts_here: &[ReadyPart]) -> Option<Vec<ReadyPart>> {
    let mut parts = Vec::new();
    for (key, value) in form_urlencoded::parse(query.as_bytes()) {
        if key != "exclude" {
            continue;
        }
        for name in value.split(',') {
            let part = parts_here.iter().find(|part| part.name() == name)?;
            parts.push(*part);
        }
    }
    Some(parts)
}

/// 400 for an `exclude` that names no part this listener leaves out.
fn no_such_part(parts_here: &str) -> HttpResponse {
    HttpResponse::BadRequest().json(ErrorBody::new(
        ErrorCode::InvalidRequest,
        format!("exclude takes {parts_here}"),
    ))
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
    /// Every part but the `excluded` is ready.
    fn ready(&self, excluded: &[ReadyPart]) -> bool {
        ReadyPart::ALL
            .into_iter()
            .all(|part| excluded.contains(&part) || self.part(part))
    }

    fn part(&self, part: ReadyPart) -> bool {
        match part {
            ReadyPart::Store => self.store,
            ReadyPart::AuditDatabase => self.audit.database,
            ReadyPart::AuditJournal => self.audit.journal,
            ReadyPart::Lists => self.lists,
        }
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
