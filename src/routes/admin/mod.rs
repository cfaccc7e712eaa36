//! The admin API (`/admin/api/...`): audit events as JSON and CSV, a subject's
//! live state, unblock. Every route needs an admin token.

mod console;
pub(crate) mod events;
pub(crate) mod subjects;

use actix_web::web;

use crate::error::ApiError;

pub fn configure(cfg: &mut web::ServiceConfig) {
    cfg.service(
        web::scope("/admin/api")
            .app_data(web::QueryConfig::default().error_handler(|err, _req| {
                ApiError::InvalidRequest(format!("invalid query: {err}")).into()
            }))
            .app_data(web::PathConfig::default().error_handler(|err, _req| {
                ApiError::InvalidRequest(format!("invalid path: {err}")).into()
            }))
            .route("/events", web::get().to(events::list))
            .route("/events.csv", web::get().to(events::csv))
            .route(
                "/subjects/{kind}/{id:.+}/unblock",
                web::post().to(subjects::unblock),
            )
            .route("/subjects/{kind}/{id:.+}", web::get().to(subjects::state))
            .default_service(web::to(super::not_found)),
    );
    console::configure(cfg);
}
