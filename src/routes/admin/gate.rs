//! The door of every admin route, JSON and HTML: a middleware that answers
//! before any extractor or handler runs.
//!
//! 1. An address throttled for failed admin authentication
//!    (`guard::admin_auth`) gets 429 `rate_limited` with `Retry-After`,
//!    whatever it presents but a live console session.
//! 2. A request without an admin credential gets 401, whatever its path,
//!    query or body: a stranger learns nothing about what a route takes (not
//!    400, 404, 405 or 415). A wrong token or password, and a JWT access
//!    token the OpenID provider's keys and claims do not vouch for, is a
//!    failed authentication; a scheme the route does not read (Basic on
//!    the JSON API) or an empty token is not, as nothing was checked. A
//!    console page (GET) without credentials, when single sign-on is
//!    configured, sends the browser to the provider instead (`sso`); a
//!    console session is a credential too.
//! 3. Every answer, refusals included, carries `Cache-Control: no-store`:
//!    admin answers hold personal data (phones, user names, addresses) that
//!    no browser or proxy cache should keep.
//!
//! The admitted caller ([`Admin`]) goes into the request's extensions, where
//! handlers take it as an extractor.

use actix_web::body::{BoxBody, MessageBody};
use actix_web::dev::{ServiceRequest, ServiceResponse};
use actix_web::http::header::{self, HeaderValue};
use actix_web::middleware::Next;
use actix_web::{web, HttpMessage, HttpRequest, HttpResponse, ResponseError};

pub use super::admitted::{Admin, Via};
use super::sso;
use crate::domain::admin_role::{Actor, Roles};
use crate::error::ApiError;
use crate::guard::RequestInfo;
use crate::oidc::BearerError;
use crate::routes::caller::AdminCredential;
use crate::routes::AppState;
use crate::settings::Secret;

/// Why the door stayed shut.
pub(super) enum Shut {
    /// The address failed too often: 429.
    Throttled(ApiError),
    /// No or wrong credentials: 401.
    Unauthorized,
    /// A console page without credentials while single sign-on is on: the
    /// browser goes to the provider.
    SignIn,
    /// What would check the credential is unreachable (the provider's
    /// keys, the sessions' database): 503.
    Unavailable(ApiError),
}

/// Which credentials a route takes.
#[derive(Clone, Copy)]
pub(super) enum Credentials {
    /// The JSON API: `Authorization: Bearer`.
    Bearer,
    /// The HTML console: Bearer, or Basic with user `admin`.
    BearerOrBasic,
}

/// Decide whether `req` may in: a live console session first, then the
/// throttle, then the credential; a wrong one is counted against its
/// address.
///
/// A session goes before the throttle: its id is 256 random bits sealed
/// with the cookie key, so there is nothing to guess, and someone sharing
/// the admin's address (a NAT, conference Wi-Fi) could else shut a signed-in
/// admin out of the console, Sign out included, with 20 wrong passwords.
pub(super) async fn admit(
    state: &AppState,
    req: &HttpRequest,
    credentials: Credentials,
) -> Result<Admin, Shut> {
    let ip = state.access.peer_ip(req);
    let console = matches!(credentials, Credentials::BearerOrBasic);
    let info = state.access.info(req, ip);
    let credential = state.access.admin_credential(req, console);
    // Nothing was read of an unread credential: as without one.
    let by_session = console
        && state.oidc.is_some()
        && matches!(
            credential,
            AdminCredential::Missing | AdminCredential::Unread
        );
    if by_session {
        match sso::session(state, req).await {
            Ok(Some((actor, roles, csrf_key, via))) => {
                return Ok(admitted(info, actor, roles, csrf_key, via))
            }
            Ok(None) => {}
            Err(error) => return Err(Shut::Unavailable(error)),
        }
    }
    if let Err(throttled) = state.admin_auth.check(ip).await {
        return Err(Shut::Throttled(ApiError::RateLimited {
            rule: throttled.rule,
            retry_after_ms: throttled.retry_after_ms,
        }));
    }
    let (actor, roles, csrf_key, via) = match credential {
        AdminCredential::Token(token) => (token.actor, token.roles, token.secret, Via::Token),
        AdminCredential::Jwt(jwt) => {
            let Some(oidc) = state.oidc.as_ref().filter(|o| o.accepts_bearer_tokens()) else {
                state.admin_auth.failed(&info).await;
                return Err(Shut::Unauthorized);
            };
            match oidc.verify_bearer(&jwt).await {
                Ok(identity) => (identity.actor, identity.roles, Secret::new(jwt), Via::Jwt),
                Err(BearerError::Unavailable) => {
                    return Err(Shut::Unavailable(ApiError::IdentityProviderUnavailable))
                }
                Err(error) => {
                    tracing::info!(request_id = %info.request_id, %error, "admin bearer token refused");
                    state.admin_auth.failed(&info).await;
                    return Err(Shut::Unauthorized);
                }
            }
        }
        AdminCredential::Wrong => {
            state.admin_auth.failed(&info).await;
            return Err(Shut::Unauthorized);
        }
        // No live session (looked up above): a page goes to sign in.
        AdminCredential::Missing | AdminCredential::Unread
            if by_session && req.method() == actix_web::http::Method::GET =>
        {
            return Err(Shut::SignIn)
        }
        AdminCredential::Missing | AdminCredential::Unread => return Err(Shut::Unauthorized),
    };
    Ok(admitted(info, actor, roles, csrf_key, via))
}

/// The admin let in, named in its request's info.
fn admitted(
    mut info: RequestInfo,
    actor: Actor,
    roles: Roles,
    csrf_key: Secret,
    via: Via,
) -> Admin {
    info.actor = Some(actor.to_string());
    Admin {
        info,
        actor,
        roles,
        csrf_key,
        via,
    }
}

/// `Cache-Control: no-store` on `response`.
pub(super) fn no_store(response: &mut HttpResponse<impl MessageBody>) {
    response
        .headers_mut()
        .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
}

/// Run `req` through the door with `credentials`; a refusal is answered by
/// `refused` (JSON for the API, an HTML page for the console).
pub(super) async fn guarded(
    req: ServiceRequest,
    next: Next<impl MessageBody + 'static>,
    credentials: Credentials,
    refused: fn(&HttpRequest, Shut) -> HttpResponse,
) -> Result<ServiceResponse<BoxBody>, actix_web::Error> {
    let Some(state) = req.app_data::<web::Data<AppState>>().cloned() else {
        return Err(ApiError::Internal(anyhow::anyhow!("no application state")).into());
    };
    // Borrowed, not cloned: actix needs the request's only reference to
    // route it further.
    match admit(&state, req.request(), credentials).await {
        Ok(admin) => {
            req.extensions_mut().insert(admin);
            // Handlers' and extractors' errors come back as answers; an
            // error here would come from a middleware inside, none of
            // which the admin routes have.
            let mut answered = next.call(req).await?.map_into_boxed_body();
            no_store(answered.response_mut());
            Ok(answered)
        }
        Err(Shut::SignIn) => {
            let mut response = sso::start(&state, req.request()).await;
            no_store(&mut response);
            Ok(req.into_response(response))
        }
        Err(shut) => {
            let mut response = refused(req.request(), shut);
            no_store(&mut response);
            Ok(req.into_response(response))
        }
    }
}

/// The JSON API's refusals: the `ApiError` bodies.
fn api_refusal(_req: &HttpRequest, shut: Shut) -> HttpResponse {
    match shut {
        Shut::Throttled(error) | Shut::Unavailable(error) => error.error_response(),
        Shut::Unauthorized | Shut::SignIn => ApiError::Unauthorized.error_response(),
    }
}

/// The door of `/admin/api/*`.
pub async fn api(
    req: ServiceRequest,
    next: Next<impl MessageBody + 'static>,
) -> Result<ServiceResponse<BoxBody>, actix_web::Error> {
    guarded(req, next, Credentials::Bearer, api_refusal).await
}
