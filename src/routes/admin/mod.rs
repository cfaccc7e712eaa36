//! The admin API (`/admin/api/...`): audit events as JSON and CSV, a subject's
//! live state, unblock. Every route needs an admin token.

mod console;
mod csv;
pub(crate) mod events;
pub(crate) mod lists;
pub(crate) mod subjects;

use actix_web::web;

use crate::error::ApiError;

/// Register the admin API under `/admin/api`, where bad queries and paths
/// answer JSON 400s and unknown paths JSON 404s, and the HTML console.
pub fn configure(cfg: &mut web::ServiceConfig) {
    let api = web::scope("/admin/api");
    cfg.service(
        lists::configure(api)
            .app_data(web::QueryConfig::default().error_handler(|err, _req| {
                ApiError::InvalidRequest(format!("invalid query: {err}")).into()
            }))
            .app_data(web::PathConfig::default().error_handler(|err, _req| {
                ApiError::InvalidRequest(format!("invalid path: {err}")).into()
            }))
            .service(super::get("/events", events::list))
            .service(super::get("/events.csv", events::csv))
            .service(super::post(
                "/subjects/{kind}/{id:.+}/unblock",
                subjects::unblock,
            ))
            .service(super::get("/subjects/{kind}/{id:.+}", subjects::state))
            .default_service(web::to(super::not_found)),
    );
    console::configure(cfg);
}
