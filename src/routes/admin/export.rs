//! The CSV export, for the JSON API and the console alike: the auditor role
//! only; `admin::Desk::export` streams the rows and audits the export.

use actix_web::http::header;
use actix_web::HttpResponse;

use super::gate::Admin;
use super::request::EventsQuery;
use crate::admin::trail::export_subject;
use crate::audit::query::Empty;
use crate::domain::admin_role::Permission;
use crate::error::ApiError;
use crate::routes::AppState;

/// The events `query` filters as a CSV attachment (`empty` says how an
/// empty parameter reads); 403 to a role that may not export.
pub fn csv(
    state: &AppState,
    admin: &Admin,
    query: &EventsQuery,
    empty: Empty,
) -> Result<HttpResponse, ApiError> {
    super::roles::require(state, admin, Permission::ExportCsv, &export_subject())?;
    let body = state
        .desk()
        .export(&admin.actor, &admin.info, query.parse(empty)?)?;
    Ok(HttpResponse::Ok()
        .insert_header((header::CONTENT_TYPE, "text/csv; charset=utf-8"))
        .insert_header((
            header::CONTENT_DISPOSITION,
            "attachment; filename=\"audit-events.csv\"",
        ))
        .streaming(body))
}
