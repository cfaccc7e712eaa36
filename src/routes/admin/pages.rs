//! The console's HTML answers that are not a page of their own: every
//! refusal (`Refusal`), the one-message pages single sign-on shows, and
//! the header's view of who is signed in. Below the console and `sso`,
//! which both answer with them.

use actix_web::http::header::{self, HeaderValue};
use actix_web::http::StatusCode;
use actix_web::{web, HttpRequest, HttpResponse, Responder, ResponseError};
use askama::Template;
use askama_web::WebTemplate;
use chrono::Utc;

use super::admitted::{Admin, Via};
use super::csrf;
use crate::domain::{Subject, SubjectKind};
use crate::error::ApiError;
use crate::routes::AppState;
use crate::store::StoreError;

/// Who is signed in, for the header of every page. (The pages also say
/// which of its buttons the admin's role may use: the others are not shown,
/// and the server refuses them anyway.)
#[derive(Clone, Debug, Default)]
pub struct Me {
    /// `token:oncall`, `oidc:ann@example.com`.
    pub actor: String,
    /// `operator, auditor`.
    pub roles: String,
    /// The Sign out form's CSRF token, for a single-sign-on session.
    pub logout_csrf: Option<String>,
}

/// Why the console could not show what was asked.
#[derive(Template, WebTemplate)]
#[template(path = "admin/error.html")]
pub struct ErrorPage {
    /// The page's heading (`Forbidden`).
    pub title: &'static str,
    /// What went wrong, in a sentence or two.
    pub message: String,
    /// Who is signed in, when someone is.
    pub me: Option<Me>,
}

/// An HTML answer: the page with `status` (unless rendering failed), never
/// cached, never framed, no scripts.
pub(super) fn html(req: &HttpRequest, status: StatusCode, page: impl Responder) -> HttpResponse {
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
pub(super) enum Refusal {
    /// No or wrong credentials: 401 with a Basic challenge, so that a browser
    /// asks for them.
    Unauthorized,
    /// A form, or the CSV export link, came without a valid CSRF token.
    Forbidden,
    /// The browser says a page of another origin sent the request
    /// (`Sec-Fetch-Site` other than `same-origin` or `none`): nothing is
    /// done or written in the admin's name.
    CrossSite,
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
    /// The refusal as the console shows it.
    pub(super) fn page(self, req: &HttpRequest) -> HttpResponse {
        let retry_after = match &self {
            Self::Api(ApiError::RateLimited { retry_after_ms, .. }) => {
                Some(crate::guard::ceil_secs(*retry_after_ms))
            }
            _ => None,
        };
        let (status, title, message) = match self {
            // No Basic challenge to a request another site started: a
            // browser sends the credentials of a URL (`admin:guess@host`)
            // only in answer to one, and a page an admin visits could
            // otherwise send twenty wrong ones and throttle the admin's
            // address. What the browser has cached, it sends unasked.
            Self::Unauthorized if cross_site(req) => (
                StatusCode::UNAUTHORIZED,
                "Sign-in required",
                "This link came from another site: open the console from its own address \
                 (typed or bookmarked) to sign in."
                    .to_string(),
            ),
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
            Self::CrossSite => {
                tracing::warn!(
                    request_id = %crate::telemetry::request_id(),
                    route = req.match_pattern().as_deref().unwrap_or("?"),
                    "console request from another site refused"
                );
                (
                    StatusCode::FORBIDDEN,
                    "Forbidden",
                    "This request came from another site; open the console and use its \
                     own links and forms."
                        .to_string(),
                )
            }
            Self::Forbidden => (
                StatusCode::FORBIDDEN,
                "Forbidden",
                "The form's or link's CSRF token is missing, wrong or expired: \
                 reload the page it was on and try again."
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
        if status == StatusCode::UNAUTHORIZED && !cross_site(req) {
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

/// Whether the browser says the request came from a page of another origin
/// (every caller refuses it with [`Refusal::CrossSite`], whose page logs
/// it). `same-site` too: a sibling subdomain (user content, a forgotten
/// app) is another origin, and the session cookie, `SameSite=Lax`, goes
/// with its requests. Only the console's own pages (`same-origin`) and
/// what the admin typed or bookmarked (`none`) pass; a browser that sends
/// no such header passes, and the CSRF token guards its posts.
pub(super) fn cross_site(req: &HttpRequest) -> bool {
    req.headers().get("sec-fetch-site").is_some_and(|v| {
        let v = v.as_bytes();
        !(v.eq_ignore_ascii_case(b"same-origin") || v.eq_ignore_ascii_case(b"none"))
    })
}

/// A console query that does not deserialize, as its error box says it.
/// serde names an unknown field as given, and a link anyone can send an
/// admin chooses it: "unknown field `Your token leaked, rotate it at …`"
/// in the console's own red box. The name is left out; the fields the
/// page takes, which are ours, are kept.
pub(super) fn query_error(error: impl std::fmt::Display) -> String {
    let text = error.to_string();
    let Some(at) = text.find("unknown field `") else {
        return format!("invalid query: {text}");
    };
    // The last `, expected ` is serde's own: a name holding one comes before.
    match text[at..].rsplit_once("`, expected ") {
        Some((_, expected)) => format!("invalid query: unknown field; expected {expected}"),
        None => "invalid query: unknown field".to_string(),
    }
}

/// Whether `[admin.oidc]` is on.
pub(super) fn single_sign_on(req: &HttpRequest) -> bool {
    req.app_data::<web::Data<AppState>>()
        .is_some_and(|state| state.oidc.is_some())
}

/// The admin the door let in, if any.
pub(super) fn current(req: &HttpRequest) -> Option<Admin> {
    use actix_web::HttpMessage as _;
    req.extensions().get::<Admin>().cloned()
}

/// What the Sign out form's CSRF token is bound to.
pub(super) fn logout_form() -> Subject {
    Subject::new(SubjectKind::Global, "logout")
}

/// The header's view of `admin`, and what the pages offer them.
pub(super) fn me(admin: &Admin) -> Me {
    let roles: Vec<&str> = admin.roles.iter().map(|r| r.as_str()).collect();
    Me {
        actor: admin.actor.to_string(),
        roles: roles.join(", "),
        logout_csrf: matches!(admin.via, Via::Session { .. })
            .then(|| csrf::issue(&admin.csrf_key, &logout_form(), Utc::now())),
    }
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
