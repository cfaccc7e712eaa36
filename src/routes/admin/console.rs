//! The admin HTML console (DESIGN.md §3 "Admin"): `GET /admin/overview`
//! sums up a period's refusals and lists who is locked now (`overview`),
//! `GET /admin` browses the audit trail, `GET /admin/subjects/{kind}/{id}`
//! shows a subject's live state with an Unblock form, which posts to
//! `…/unblock` with a CSRF token (see `csrf`); so do the overview's. Pages
//! accept the admin token as Bearer or as the HTTP Basic password of user
//! `admin`; HTML comes from `templates/admin/` only.

mod csrf;
mod events;
mod lists;
mod overview;
mod period;
mod subject;
mod views;

use actix_web::http::header::{self, HeaderValue};
use actix_web::http::StatusCode;
use actix_web::{web, HttpRequest, HttpResponse, Responder, ResponseError};
use chrono::Utc;

use super::gate::{self, Admin, Via};
use super::request::EventsQuery;
use crate::audit::query::Empty;
use crate::domain::admin_role::Permission;
use crate::domain::{Subject, SubjectKind};
use crate::error::ApiError;
use crate::routes::AppState;
use crate::settings::Secret;
use crate::store::StoreError;
use views::{ErrorPage, Me};

/// Rows per page of the event table, unless the form asks for another size.
const PAGE_SIZE: usize = 50;
/// Recent events shown on a subject page.
const SUBJECT_EVENTS: usize = 20;
/// The unblock form carries one short field.
const FORM_LIMIT: usize = 4 * 1024;

/// Register the console: the overview, `/admin`, the `/admin/subjects`
/// look-up, a subject's page and its unblock form, and the lists.
/// Every page behind the console's door (`gate`).
pub fn configure(cfg: &mut web::ServiceConfig) {
    let door = || actix_web::middleware::from_fn(console_gate);
    cfg.service(
        web::resource("/admin/overview")
            .route(web::get().to(overview::page))
            .wrap(door()),
    )
    .service(
        web::resource(["/admin", "/admin/"])
            .route(web::get().to(events::page))
            .wrap(door()),
    )
    .service(
        web::resource("/admin/subjects")
            .route(web::get().to(subject::find))
            .wrap(door()),
    )
    .service(
        web::resource("/admin/subjects/{kind}/{id:.+}/unblock")
            .app_data(web::PayloadConfig::new(FORM_LIMIT))
            .route(web::post().to(subject::unblock))
            .wrap(door()),
    )
    .service(
        web::resource("/admin/subjects/{kind}/{id:.+}")
            .route(web::get().to(subject::page))
            .wrap(door()),
    )
    .service(
        web::resource("/admin/lists")
            .app_data(web::PayloadConfig::new(FORM_LIMIT))
            .route(web::get().to(lists::page))
            .route(web::post().to(lists::add))
            .wrap(door()),
    )
    .service(
        web::resource("/admin/lists/{id}/delete")
            .app_data(web::PayloadConfig::new(FORM_LIMIT))
            .route(web::post().to(lists::delete))
            .wrap(door()),
    )
    .service(
        web::resource("/admin/events.csv")
            .route(web::get().to(export_csv))
            .wrap(door()),
    )
    .service(
        web::resource("/admin/logout")
            .app_data(web::PayloadConfig::new(FORM_LIMIT))
            .route(web::post().to(logout))
            .wrap(door()),
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

/// An HTML answer: the page with `status` (unless rendering failed), never
/// cached, never framed, no scripts.
fn html(req: &HttpRequest, status: StatusCode, page: impl Responder) -> HttpResponse {
    let mut response = page.respond_to(req).map_into_boxed_body();
    if response.status().is_success() {
        *response.status_mut() = status;
    }
    let headers = response.headers_mut();
    for (name, value) in [
        (header::CACHE_CONTROL, "no-store"),
        (
            header::CONTENT_SECURITY_POLICY,
            "default-src 'none'; style-src 'unsafe-inline'; form-action 'self'; \
             frame-ancestors 'none'; base-uri 'none'",
        ),
        (header::X_FRAME_OPTIONS, "DENY"),
        (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
        (header::REFERRER_POLICY, "same-origin"),
    ] {
        headers.insert(name, HeaderValue::from_static(value));
    }
    response
}

/// Why a console request gets an error page instead of what it asked for.
enum Refusal {
    /// No or wrong credentials: 401 with a Basic challenge, so that a browser
    /// asks for them.
    Unauthorized,
    /// The unblock form came without a valid CSRF token.
    Forbidden,
    /// Bad input, or the store or the audit database is down.
    Api(ApiError),
}

impl From<ApiError> for Refusal {
    fn from(e: ApiError) -> Self {
        Self::Api(e)
    }
}

impl From<StoreError> for Refusal {
    fn from(e: StoreError) -> Self {
        Self::Api(e.into())
    }
}

impl Refusal {
    fn page(self, req: &HttpRequest) -> HttpResponse {
        let retry_after = match &self {
            Self::Api(ApiError::RateLimited { retry_after_ms, .. }) => {
                Some(crate::guard::ceil_secs(*retry_after_ms))
            }
            _ => None,
        };
        let (status, title, message) = match self {
            Self::Unauthorized if single_sign_on(req) => (
                StatusCode::UNAUTHORIZED,
                "Sign-in required",
                "Your session has ended or was never opened: open the console \
                 (/admin) to sign in, or sign in as user \"admin\" with an admin \
                 token as the password."
                    .to_string(),
            ),
            Self::Unauthorized => (
                StatusCode::UNAUTHORIZED,
                "Sign-in required",
                "Sign in as user \"admin\" with an admin token as the password.".to_string(),
            ),
            Self::Forbidden => (
                StatusCode::FORBIDDEN,
                "Forbidden",
                "The form's CSRF token is missing, wrong or expired: \
                 reload the subject page and try again."
                    .to_string(),
            ),
            Self::Api(e) => {
                if matches!(e, ApiError::Internal(_) | ApiError::StoreUnavailable(_)) {
                    tracing::error!(request_id = %crate::telemetry::request_id(), error = %e, "admin console");
                }
                let status = e.status_code();
                let title = match status {
                    StatusCode::BAD_REQUEST => "Bad request",
                    StatusCode::FORBIDDEN => "Forbidden",
                    StatusCode::TOO_MANY_REQUESTS => "Too many failed sign-ins",
                    StatusCode::SERVICE_UNAVAILABLE => "Temporarily unavailable",
                    _ => "Something went wrong",
                };
                (status, title, e.to_string())
            }
        };
        let me = current(req).map(|admin| me(&admin));
        let mut response = html(req, status, ErrorPage { title, message, me });
        if status == StatusCode::UNAUTHORIZED {
            response.headers_mut().insert(
                header::WWW_AUTHENTICATE,
                HeaderValue::from_static("Basic realm=\"tollgate admin\""),
            );
        }
        if let Some(secs) = retry_after {
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(secs));
        }
        response
    }
}

/// Whether `[admin.oidc]` is on.
fn single_sign_on(req: &HttpRequest) -> bool {
    req.app_data::<web::Data<AppState>>()
        .is_some_and(|state| state.oidc.is_some())
}

/// The admin the door let in, if any.
fn current(req: &HttpRequest) -> Option<Admin> {
    use actix_web::HttpMessage as _;
    req.extensions().get::<Admin>().cloned()
}

/// The admin the door let in; it carries the secret that keys the CSRF
/// tokens.
fn authenticate(_state: &AppState, req: &HttpRequest) -> Result<Admin, Refusal> {
    current(req).ok_or(Refusal::Unauthorized)
}

/// What the Sign out form's CSRF token is bound to.
fn logout_form() -> Subject {
    Subject::new(SubjectKind::Global, "logout")
}

/// The header's view of `admin`, and what the pages offer them.
fn me(admin: &Admin) -> Me {
    let roles: Vec<&str> = admin.roles.iter().map(|r| r.as_str()).collect();
    Me {
        actor: admin.actor.to_string(),
        roles: roles.join(", "),
        logout_csrf: matches!(admin.via, Via::Session { .. })
            .then(|| csrf::issue(&admin.csrf_key, &logout_form(), Utc::now())),
    }
}

/// Whether the browser says the request came from another site.
fn cross_site(req: &HttpRequest) -> bool {
    req.headers()
        .get("sec-fetch-site")
        .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"cross-site"))
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
        return Err(Refusal::Forbidden);
    }
    super::roles::require(state, admin, permission, subject).map_err(Refusal::Api)
}

/// A page of the console that says one thing (sign-in failures, a
/// provider that cannot be reached).
pub(super) fn message_page(
    req: &HttpRequest,
    status: StatusCode,
    title: &'static str,
    message: String,
) -> HttpResponse {
    let me = current(req).map(|admin| me(&admin));
    html(req, status, ErrorPage { title, message, me })
}

/// The page of an `ApiError`, as the console shows it.
pub(super) fn api_error_page(req: &HttpRequest, error: ApiError) -> HttpResponse {
    Refusal::Api(error).page(req)
}

/// After Sign out.
pub(super) fn signed_out_page(req: &HttpRequest) -> HttpResponse {
    html(
        req,
        StatusCode::OK,
        ErrorPage {
            title: "Signed out",
            message: "Your console session is over on every instance. The identity provider \
                      may still remember you: opening the console signs you in again."
                .into(),
            me: None,
        },
    )
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
    let cross_site = cross_site(req);
    let valid = fields
        .iter()
        .find(|(name, _)| name == "csrf")
        .is_some_and(|(_, t)| csrf::verify(key, subject, t, Utc::now()));
    if cross_site || !valid {
        tracing::warn!(
            request_id = %crate::telemetry::request_id(),
            subject_kind = subject.kind.as_str(),
            cross_site,
            "console form refused: missing or bad CSRF token"
        );
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
    let exported = authenticate(&state, &req).and_then(|admin| {
        let query = web::Query::<EventsQuery>::from_query(req.query_string())
            .map_err(|e| ApiError::InvalidRequest(format!("invalid query: {e}")))?;
        Ok(super::export::csv(&state, &admin, &query, Empty::NoFilter)?)
    });
    exported.unwrap_or_else(|refusal| refusal.page(&req))
}

/// `POST /admin/logout` (the header's Sign out, with its CSRF token): ends
/// a single-sign-on session everywhere.
async fn logout(state: web::Data<AppState>, req: HttpRequest, body: web::Bytes) -> HttpResponse {
    let ended = async {
        let admin = authenticate(&state, &req)?;
        checked_form(&req, &admin.csrf_key, &logout_form(), &body)?;
        match &admin.via {
            Via::Session { id_hash } => Ok(super::sso::end_session(&state, &req, id_hash).await),
            Via::Token | Via::Jwt => Err(Refusal::Api(ApiError::InvalidRequest(
                "only a single sign-on session signs out; a token stays valid until removed from \
                 server.admin_tokens"
                    .into(),
            ))),
        }
    };
    ended.await.unwrap_or_else(|refusal| refusal.page(&req))
}
