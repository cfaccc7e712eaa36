//! The admin API (`/admin/api/...`): audit events as JSON and CSV, a subject's
//! live state, unblock, the lists; the HTML console; single sign-on. Every
//! route but the sign-in's own needs an admin credential, and each action
//! the admin's role allows (`roles`).

mod admitted;
mod console;
mod csrf;
pub(crate) mod events;
mod export;
mod gate;
pub(crate) mod lists;
mod pages;
mod request;
mod roles;
mod sso;
pub(crate) mod stats;
pub(crate) mod subjects;

use actix_web::web;

use crate::error::ApiError;

pub use admitted::Admin;

/// Register the admin API under `/admin/api`, behind its door (`gate`),
/// where bad queries and paths answer JSON 400s and unknown paths JSON 404s
/// to an admin, the sign-in's routes, which have no door, and the HTML
/// console's scope behind its own door: the API's scope and the sign-in are
/// registered first, as the console's scope takes every other `/admin` path.
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
            .service(super::get("/stats", stats::stats))
            .service(super::post(
                "/subjects/{kind}/{id:.+}/unblock",
                subjects::unblock,
            ))
            .service(super::get("/subjects/{kind}/{id:.+}", subjects::state))
            .default_service(web::to(super::not_found))
            .wrap(actix_web::middleware::from_fn(gate::api)),
    );
    sso::configure(cfg);
    console::configure(cfg);
}
