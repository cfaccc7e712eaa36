//! The admin HTML console (DESIGN.md §3 "Admin"): `GET /admin/overview`
//! sums up a period's refusals and lists who is locked now (`overview`),
//! `GET /admin` browses the audit trail, `GET /admin/subjects/{kind}/{id}`
//! shows a subject's live state with an Unblock form, which posts to
//! `…/unblock` with a CSRF token (see `csrf`); so do the overview's. Pages
//! accept the admin token as Bearer or as the HTTP Basic password of user
//! `admin`; HTML comes from `templates/admin/` only.

mod events;
mod form_body;
mod lists;
mod overview;
mod subject;
mod views;

use actix_web::http::header;
use actix_web::{web, HttpRequest, HttpResponse};
use chrono::Utc;

use super::csrf;
use super::gate::{self, Admin, Via};
use super::pages::{cross_site, current, html, logout_form, me, query_error, Refusal};
use super::request::EventsQuery;
use crate::admin::trail::export_subject;
use crate::audit::query::Empty;
use crate::domain::admin_role::Permission;
use crate::domain::Subject;
use crate::error::ApiError;
use crate::routes::AppState;
use crate::settings::Secret;
use form_body::FormBody;
use views::Me;

/// Forged or stale forms can come at any rate: one line a minute.
static CSRF_LINES: crate::telemetry::log_budget::LogBudget =
    crate::telemetry::log_budget::LogBudget::new(std::time::Duration::from_secs(60));

/// Rows per page of the event table, unless the form asks for another size.
const PAGE_SIZE: usize = 50;
/// Recent events shown on a subject page.
const SUBJECT_EVENTS: usize = 20;
/// The unblock form carries one short field.
const FORM_LIMIT: usize = 4 * 1024;

/// Register the console under one `/admin` scope behind one door (`gate`):
/// the overview, `/admin`, the `/admin/subjects` look-up, a subject's page
/// and its unblock form, the lists, and every other path under `/admin/`,
/// so that a stranger gets the same 401 whatever the path and cannot map
/// the routes by their 404s (an admin gets the JSON 404). Registered after
/// the admin API's scope and the sign-in's routes, which have doors (or
/// none) of their own and are matched first.
pub fn configure(cfg: &mut web::ServiceConfig) {
    use crate::routes::other_methods;
    let form = || web::PayloadConfig::new(FORM_LIMIT);
    cfg.service(
        web::scope("/admin")
            .service(
                web::resource("/overview")
                    .route(web::get().to(overview::page))
                    .default_service(other_methods("GET")),
            )
            .service(
                web::resource(["", "/"])
                    .route(web::get().to(events::page))
                    .default_service(other_methods("GET")),
            )
            .service(
                web::resource("/subjects")
                    .route(web::get().to(subject::find))
                    .default_service(other_methods("GET")),
            )
            .service(
                web::resource("/subjects/unblock")
                    .app_data(form())
                    .route(web::post().to(subject::unblock_by_query))
                    .default_service(other_methods("POST")),
            )
            .service(
                web::resource("/subjects/{kind}/{id:.+}/unblock")
                    .app_data(form())
                    .route(web::post().to(subject::unblock))
                    .default_service(other_methods("POST")),
            )
            .service(
                web::resource("/subjects/{kind}/{id:.+}")
                    .route(web::get().to(subject::page))
                    .default_service(other_methods("GET")),
            )
            .service(
                web::resource("/lists")
                    .app_data(form())
                    .route(web::get().to(lists::page))
                    .route(web::post().to(lists::add))
                    .default_service(other_methods("GET, POST")),
            )
            .service(
                web::resource("/lists/{id}/delete")
                    .app_data(form())
                    .route(web::post().to(lists::delete))
                    .default_service(other_methods("POST")),
            )
            .service(
                web::resource("/events.csv")
                    .route(web::get().to(export_csv))
                    .default_service(other_methods("GET")),
            )
            .service(
                web::resource("/logout")
                    .app_data(form())
                    .route(web::post().to(logout))
                    .default_service(other_methods("POST")),
            )
            .default_service(web::to(crate::routes::not_found))
            .wrap(actix_web::middleware::from_fn(console_gate)),
    );
}

/// The console's door: Bearer or Basic, refusals as HTML pages.
async fn console_gate(
    req: actix_web::dev::ServiceRequest,
    next: actix_web::middleware::Next<impl actix_web::body::MessageBody + 'static>,
) -> Result<actix_web::dev::ServiceResponse<actix_web::body::BoxBody>, actix_web::Error> {
    gate::guarded(req, next, gate::Credentials::BearerOrBasic, |req, shut| {
        match shut {
            gate::Shut::Unauthorized | gate::Shut::SignIn => Refusal::Unauthorized,
            gate::Shut::Throttled(error) | gate::Shut::Unavailable(error) => Refusal::Api(error),
        }
        .page(req)
    })
    .await
}

/// The admin the door let in; it carries the secret that keys the CSRF
/// tokens.
fn authenticate(_state: &AppState, req: &HttpRequest) -> Result<Admin, Refusal> {
    current(req).ok_or(Refusal::Unauthorized)
}

/// `permission` for `admin` posting a form, or the 403 page. Checked before
/// the form's CSRF token, so that a same-site post of an admin whose role
/// may not act is refused and audited as theirs (the forms are not shown
/// to them, so they have no token); a cross-site post is refused without
/// a row, so another site cannot write one in an admin's name.
fn require(
    state: &AppState,
    req: &HttpRequest,
    admin: &Admin,
    permission: Permission,
    subject: &Subject,
) -> Result<(), Refusal> {
    if cross_site(req) {
        return Err(Refusal::CrossSite);
    }
    super::roles::require(state, admin, permission, subject).map_err(Refusal::Api)
}

fn path_subject(req: &HttpRequest, suffix: &str) -> Result<Subject, Refusal> {
    Ok(super::request::path_subject(
        req,
        "/admin/subjects/",
        suffix,
    )?)
}

/// A posted form's fields, once its CSRF token (issued for `subject`) is
/// checked and the browser did not say it came from another site (no form
/// of ours does).
fn checked_form(
    req: &HttpRequest,
    key: &Secret,
    subject: &Subject,
    body: &[u8],
) -> Result<Vec<(String, String)>, Refusal> {
    let fields: Vec<(String, String)> = form_urlencoded::parse(body).into_owned().collect();
    if cross_site(req) {
        return Err(Refusal::CrossSite);
    }
    let valid = fields
        .iter()
        .find(|(name, _)| name == "csrf")
        .is_some_and(|(_, t)| csrf::verify(key, subject, t, Utc::now()));
    if !valid {
        if let Some(held_back) = CSRF_LINES.admit() {
            tracing::warn!(
                request_id = %crate::telemetry::request_id(),
                subject_kind = subject.kind.as_str(),
                held_back,
                "console form refused: missing or bad CSRF token"
            );
        }
        return Err(Refusal::Forbidden);
    }
    Ok(fields)
}

fn see_other(location: &str) -> HttpResponse {
    HttpResponse::SeeOther()
        .insert_header((header::LOCATION, location))
        .insert_header((header::CACHE_CONTROL, "no-store"))
        .finish()
}

/// `GET /admin/events.csv?…`: the event table's filters as CSV, for an
/// admin whose role may export (the link shows only then); audited.
async fn export_csv(state: web::Data<AppState>, req: HttpRequest) -> HttpResponse {
    // An export is audited in the admin's name: another site's link or
    // image is refused before anything is written, as a cross-site post is.
    if cross_site(&req) {
        return Refusal::CrossSite.page(&req);
    }
    let exported = authenticate(&state, &req).and_then(|admin| {
        let (token, filters) = csrf::split_query(req.query_string());
        // The role first, so that a viewer's try is audited as theirs (they
        // are shown no link, so have no token); then the token, which a
        // browser that sends no `Sec-Fetch-Site` needs to tell the
        // console's own link from another site's.
        super::roles::require(&state, &admin, Permission::ExportCsv, &export_subject())?;
        if !token.is_some_and(|t| csrf::verify(&admin.csrf_key, &export_subject(), &t, Utc::now()))
        {
            tracing::warn!(
                request_id = %crate::telemetry::request_id(),
                "console export refused: missing or bad CSRF token"
            );
            return Err(Refusal::Forbidden);
        }
        let query = web::Query::<EventsQuery>::from_query(&filters)
            .map_err(|e| ApiError::InvalidRequest(format!("invalid query: {e}")))?;
        Ok(super::export::csv(&state, &admin, &query, Empty::NoFilter)?)
    });
    exported.unwrap_or_else(|refusal| refusal.page(&req))
}

/// `POST /admin/logout` (the header's Sign out, with its CSRF token): ends
/// a single-sign-on session everywhere.
async fn logout(
    state: web::Data<AppState>,
    req: HttpRequest,
    FormBody(body): FormBody,
) -> HttpResponse {
    let ended = async {
        let admin = authenticate(&state, &req)?;
        checked_form(&req, &admin.csrf_key, &logout_form(), &body)?;
        match &admin.via {
            Via::Session { id_hash } => {
                Ok(super::sso::end_session(&state, &req, &admin.info, id_hash).await)
            }
            Via::Token | Via::Jwt => Err(Refusal::Api(ApiError::InvalidRequest(
                "only a single sign-on session signs out; a token stays valid until removed from \
                 server.admin_tokens"
                    .into(),
            ))),
        }
    };
    ended.await.unwrap_or_else(|refusal| refusal.page(&req))
}
