//! `GET /admin/api/events` and `/admin/api/events.csv`: the audit trail
//! filtered, as JSON pages or streamed CSV, read through `admin::Desk`.

use actix_web::{web, HttpResponse};
use serde::Serialize;
use utoipa::ToSchema;

use super::gate::Admin;
use super::request::EventsQuery;
use crate::audit::query::Empty;
use crate::audit::AuditEvent;
use crate::error::{ApiError, ErrorBody};
use crate::routes::AppState;

const DEFAULT_LIMIT: usize = 100;

/// `GET /admin/api/events` 200.
#[derive(Serialize, ToSchema)]
pub struct EventsPage {
    /// Newest first.
    events: Vec<AuditEvent>,
    /// Pass as `cursor` for the next page; null on the last page.
    #[schema(required = true)]
    next_cursor: Option<String>,
}

/// Audit events, newest first, one page at a time
///
/// Unknown or empty parameters answer 400.
#[utoipa::path(
    get,
    path = "/admin/api/events",
    operation_id = "list_events",
    tag = "admin",
    params(EventsQuery),
    responses(
        (status = 200, description = "One page of events", body = EventsPage),
        (status = 400, description = "`invalid_request`: a bad filter, `limit` or `cursor`, or an unknown parameter", body = ErrorBody),
        (status = 401, description = "`unauthorized`: no valid admin token", body = ErrorBody),
        (status = 429, description = "`rate_limited`: this address failed admin authentication `server.admin_auth_limit` times (or its IPv6 /48 `server.admin_auth_network_limit` times); every admin route refuses it, token or not, until `Retry-After`", body = crate::routes::schemas::RateLimitedError,
            headers(("Retry-After" = u64, description = "Whole seconds until the oldest counted failure leaves the window"))),
        (status = 503, description = "`audit_unavailable`: the audit database is unreachable", body = ErrorBody),
    ),
    security(("admin_token" = []), ("oidc_jwt" = [])),
)]
pub async fn list(
    state: web::Data<AppState>,
    admin: Admin,
    query: web::Query<EventsQuery>,
) -> Result<HttpResponse, ApiError> {
    let page = state
        .desk()
        .page(&admin.actor, &query.parse(Empty::Refused)?, DEFAULT_LIMIT)
        .await?;
    Ok(HttpResponse::Ok().json(EventsPage {
        events: page.events,
        next_cursor: page.next_cursor,
    }))
}

/// The same filters as the JSON list, streamed page by page; `limit`, when
/// given, caps the rows.
#[utoipa::path(
    get,
    path = "/admin/api/events.csv",
    operation_id = "export_events_csv",
    tag = "admin",
    params(EventsQuery),
    summary = "Audit events as streamed CSV",
    description = "The same filters as `/admin/api/events`; `limit`, when given, caps the rows. \
        A header row with the audit columns (DESIGN.md's order, then `actor`), then one row per event, newest first, times in RFC 3339. \
        Personal data in bulk: allowed to the auditor role, and audited as `admin` / `export` with the filter in `rule`.",
    responses(
        (status = 200, description = "CSV with a header row", body = String, content_type = "text/csv; charset=utf-8"),
        (status = 400, description = "`invalid_request`: a bad filter, `limit` or `cursor`, or an unknown parameter", body = ErrorBody),
        (status = 401, description = "`unauthorized`: no valid admin token", body = ErrorBody),
        (status = 403, description = "`forbidden`: the admin's role may not export (the auditor role may); audited", body = ErrorBody),
        (status = 429, description = "`rate_limited`: this address failed admin authentication `server.admin_auth_limit` times (or its IPv6 /48 `server.admin_auth_network_limit` times); every admin route refuses it, token or not, until `Retry-After`", body = crate::routes::schemas::RateLimitedError,
            headers(("Retry-After" = u64, description = "Whole seconds until the oldest counted failure leaves the window"))),
        (status = 503, description = "`audit_unavailable`: the audit database is unreachable", body = ErrorBody),
    ),
    security(("admin_token" = []), ("oidc_jwt" = [])),
)]
pub async fn csv(
    state: web::Data<AppState>,
    admin: Admin,
    query: web::Query<EventsQuery>,
) -> Result<HttpResponse, ApiError> {
    super::export::csv(&state, &admin, &query, Empty::Refused)
}
