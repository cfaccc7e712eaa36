//! Single sign-on for the console (`[admin.oidc]`): the routes of the
//! authorization code flow and the sessions it opens.
//!
//! - A console page (GET) without credentials sends the browser to the
//!   provider (`start`, called by the door), with a pending sign-in in an
//!   encrypted cookie (`cookies`). `GET /admin/login?next=/admin/…` does the
//!   same on purpose.
//! - `GET /admin/oidc/callback` checks the callback against that cookie
//!   (`state`, then the code exchanged with the PKCE verifier, the ID token
//!   checked with its nonce: `crate::oidc`), opens a session (a row of
//!   `admin_sessions`, its random id in an encrypted cookie) and returns to
//!   the page. A callback that fails (forged, replayed, stale, refused by
//!   the provider, a bad ID token, no role) answers an error page, counts as
//!   a failed admin authentication of its address (`server.admin_auth_limit`)
//!   and is audited as `sign_in_failed`; a success as `sign_in`. A callback
//!   without the browser's pending sign-in is answered the same page but
//!   neither counted nor audited: a cross-site page can make a browser
//!   send it at will. A throttled
//!   address gets 429 before anything is checked or audited, so each
//!   address adds at most `admin_auth_limit` failure rows per window, and
//!   each IPv6 /48 `admin_auth_network_limit`.
//!   A browser that held a session gives it up: its row is deleted.
//! - A session's roles are what today's `role_map` grants to the claim
//!   values it kept (`oidc::Grants`): an admin taken out of `role_map` or
//!   lowered loses the roles at the next request after the restart.
//! - `POST /admin/logout` (the console's Sign out button, with a CSRF
//!   token) deletes the session row, audited as `sign_out`: the cookie is
//!   worthless on every instance from then on.

mod cookies;

use std::collections::HashMap;

use actix_web::http::header;
use actix_web::http::StatusCode;
use actix_web::{web, HttpRequest, HttpResponse};
use sha2::{Digest, Sha256};

use super::admitted::Via;
use super::pages;
use crate::audit::db::StoredSession;
use crate::audit::{AuditDecision, AuditEvent};
use crate::domain::admin_role::{Actor, Roles};
use crate::domain::{Action, Reason, Subject, SubjectKind};
use crate::error::ApiError;
use crate::guard::RequestInfo;
use crate::oidc::{Oidc, PendingLogin, SignInError, LOGIN_TTL};
use crate::routes::AppState;
use crate::settings::{Secret, CALLBACK_PATH};

/// Every unauthenticated page asks for a sign-in while the provider is
/// down: one line a minute says so.
static CANNOT_START_LINES: crate::telemetry::log_budget::LogBudget =
    crate::telemetry::log_budget::LogBudget::new(std::time::Duration::from_secs(60));

/// Anyone can fail a sign-in (a replayed callback): one line a minute;
/// the metric and the trail count them all.
static FAILED_SIGN_IN_LINES: crate::telemetry::log_budget::LogBudget =
    crate::telemetry::log_budget::LogBudget::new(std::time::Duration::from_secs(60));

/// Where the console sends the browser when a page does not say.
const HOME: &str = "/admin";
/// The console's CSV export, whose link carries a CSRF token.
const EXPORT_PATH: &str = "/admin/events.csv";

/// What a session cookie admits.
pub(super) type SessionAdmin = (Actor, Roles, Secret, Via);

/// Whether the answer's cookies get `Secure`: the console is served over
/// HTTPS (its `redirect_url` is https), or a trusted proxy says the
/// request came over it.
fn secure(state: &AppState, oidc: &Oidc, req: &HttpRequest) -> bool {
    oidc.served_over_https() || state.access.forwarded_https(req)
}

/// Hex SHA-256 of a session id: the table's key.
fn id_hash(id: &str) -> String {
    hex::encode(Sha256::digest(id.as_bytes()))
}

fn now_ms() -> i64 {
    chrono::Utc::now().timestamp_millis()
}

/// The admin the request's session cookie names, if it is live.
pub(super) async fn session(
    state: &AppState,
    req: &HttpRequest,
) -> Result<Option<SessionAdmin>, ApiError> {
    let Some(oidc) = state.oidc.as_deref() else {
        return Ok(None);
    };
    let key = cookies::key(oidc.cookie_secret());
    let Some(id) = cookies::opened(&key, req, cookies::SESSION, secure(state, oidc, req)) else {
        return Ok(None);
    };
    let db = state.audit_db.as_ref().ok_or(ApiError::AuditUnavailable)?;
    let hash = id_hash(&id);
    let found = db.find_session(&hash, now_ms()).await.map_err(|e| {
        tracing::warn!(error = %e, "admin sessions cannot be read");
        ApiError::AuditUnavailable
    })?;
    Ok(found.and_then(|row| {
        // Mapped again through today's role_map: an admin taken out of it
        // (or lowered) since signing in loses the roles now.
        let roles = oidc.session_roles(row.grants.as_deref());
        (!roles.is_empty()).then(|| {
            (
                Actor::stored(row.actor),
                roles,
                Secret::new(id),
                Via::Session { id_hash: hash },
            )
        })
    }))
}

/// The longest path a sign-in comes back to, in JSON (a `"` counts twice):
/// the pending sign-in's cookie carries it encrypted (about 4/3 of its
/// length and 280 bytes more), and browsers drop a cookie over 4,096
/// bytes, which failed the callback.
const MAX_RETURN_PATH: usize = 2048;

/// A console path to come back to: under `/admin`, not the sign-in's own
/// routes, nothing that would leave the site (`//host`, `\`), no
/// control character (a decoded `%0a` could not go in the `Location`
/// header: the sign-in would end in a 500 after its session was stored),
/// and at most `MAX_RETURN_PATH` bytes (a longer one comes back home).
fn return_path(raw: Option<&str>) -> String {
    match raw {
        Some(path)
            if (path == HOME || path.starts_with("/admin/") || path.starts_with("/admin?"))
                && path.len() + path.matches('"').count() <= MAX_RETURN_PATH
                && !path.contains('\\')
                && !path.chars().any(char::is_control)
                && !path.starts_with(CALLBACK_PATH)
                && !path.starts_with("/admin/login")
                && !path.starts_with("/admin/logout") =>
        {
            path.to_string()
        }
        _ => HOME.to_string(),
    }
}

/// Send the browser to the provider to sign in, then back to the page it
/// asked for (a GET without credentials).
pub(super) async fn start(state: &AppState, req: &HttpRequest) -> HttpResponse {
    let here = resume_at(req.uri().path(), req.uri().query());
    begin(state, req, &return_path(Some(&here))).await
}

/// The page a sign-in started at `path?query` comes back to: that page,
/// but for the CSV export link, whose token was keyed by the session that
/// ended (it would answer 403), the events page with the link's filters.
fn resume_at(path: &str, query: Option<&str>) -> String {
    match (path, query) {
        (EXPORT_PATH, query) => {
            let (_, filters) = super::csrf::split_query(query.unwrap_or(""));
            if filters.is_empty() {
                HOME.to_string()
            } else {
                format!("{HOME}?{filters}")
            }
        }
        (path, Some(query)) => format!("{path}?{query}"),
        (path, None) => path.to_string(),
    }
}

async fn begin(state: &AppState, req: &HttpRequest, return_to: &str) -> HttpResponse {
    let Some(oidc) = state.oidc.as_deref() else {
        return pages::message_page(
            req,
            StatusCode::NOT_FOUND,
            "Not found",
            "Single sign-on is not configured.".into(),
        );
    };
    match oidc.begin(return_to).await {
        Ok((url, pending)) => {
            let value = serde_json::to_string(&pending).unwrap_or_default();
            let key = cookies::key(oidc.cookie_secret());
            let cookie = cookies::sealed(
                &key,
                cookies::LOGIN,
                value,
                secure(state, oidc, req),
                LOGIN_TTL,
            );
            HttpResponse::Found()
                .insert_header((header::LOCATION, url))
                .insert_header((header::CACHE_CONTROL, "no-store"))
                .cookie(cookie)
                .finish()
        }
        Err(error) => {
            if let Some(held_back) = CANNOT_START_LINES.admit() {
                tracing::warn!(request_id = %crate::telemetry::request_id(), %error, held_back, "single sign-on cannot start");
            }
            pages::message_page(
                req,
                StatusCode::SERVICE_UNAVAILABLE,
                "Sign-in unavailable",
                "The identity provider cannot be reached; try again shortly.".into(),
            )
        }
    }
}

/// `GET /admin/login?next=/admin/…`.
async fn login(state: web::Data<AppState>, req: HttpRequest) -> HttpResponse {
    let query = web::Query::<HashMap<String, String>>::from_query(req.query_string())
        .map(|q| q.into_inner())
        .unwrap_or_default();
    let return_to = return_path(query.get("next").map(String::as_str));
    begin(&state, &req, &return_to).await
}

/// The audit row of a sign-in, a failed one or a sign-out: on the
/// client's address, naming the admin when known.
fn audit_session_event(
    state: &AppState,
    info: &RequestInfo,
    decision: AuditDecision,
    reason: Reason,
) {
    let subject = match info.ip {
        Some(ip) => Subject::new(SubjectKind::Ip, ip.subject_id()),
        None => Subject::new(SubjectKind::Global, "admin"),
    };
    let event = AuditEvent::new(Action::Admin, decision, reason, &subject);
    state.audit.record(info.stamp(event));
}

/// `GET /admin/oidc/callback?code=…&state=…` (or `?error=…`): the
/// throttle, then the callback checked against the browser's pending
/// sign-in (`crate::oidc`), then a session opened or the failure answered.
async fn callback(state: web::Data<AppState>, req: HttpRequest) -> HttpResponse {
    let Some(oidc) = state.oidc.as_deref() else {
        return pages::message_page(
            &req,
            StatusCode::NOT_FOUND,
            "Not found",
            "Single sign-on is not configured.".into(),
        );
    };
    let ip = state.access.peer_ip(&req);
    if let Err(throttled) = state.admin_auth.check(ip).await {
        return pages::api_error_page(
            &req,
            ApiError::RateLimited {
                rule: throttled.rule,
                retry_after_ms: throttled.retry_after_ms,
            },
        );
    }
    let mut info = state.access.info(&req, ip);
    let key = cookies::key(oidc.cookie_secret());
    let query = web::Query::<HashMap<String, String>>::from_query(req.query_string())
        .map(|q| q.into_inner())
        .unwrap_or_default();
    let pending: Option<PendingLogin> =
        cookies::opened(&key, &req, cookies::LOGIN, secure(&state, oidc, &req))
            .and_then(|json| serde_json::from_str(&json).ok());
    let invalid_callback = || {
        failure_page(
            &state,
            oidc,
            &req,
            StatusCode::UNAUTHORIZED,
            Reason::InvalidCallback,
        )
    };
    let Some(pending) = pending else {
        // No sign-in of this browser's to finish: nothing is checked, so
        // nothing is guessed. Not counted nor audited: any page an admin
        // visits can make the browser fetch this URL (an image carries no
        // `SameSite=Lax` cookie), and counting it would let that page
        // throttle the admin's address, and everyone's behind its NAT.
        return invalid_callback();
    };
    let field = |name: &str| query.get(name).map(String::as_str).unwrap_or("");
    if !pending.answered_by(field("state")) {
        // Not this sign-in's answer (its state is 128 random bits: nothing
        // to guess). Not counted nor audited either: a page on another site
        // can open /admin/login in a popup, then this URL with any state,
        // and would otherwise throttle the admin's address by it. Nor is
        // the pending sign-in dropped: that page could end every sign-in
        // under way by sending the browser here.
        return failure_message(&req, StatusCode::UNAUTHORIZED, Reason::InvalidCallback);
    }
    let outcome = match query.get("error") {
        Some(error) => Err(SignInError::Provider(format!("it answered {error:?}"))),
        None => oidc.finish(&pending, field("state"), field("code")).await,
    };
    match outcome {
        Ok(identity) => {
            info.actor = Some(identity.actor.to_string());
            let back = return_path(Some(&pending.return_to));
            open_session(&state, oidc, &req, &info, identity, back).await
        }
        Err(error) => refuse_sign_in(&state, oidc, &req, info, error).await,
    }
}

/// A failed sign-in: counted against the address, audited with its
/// reason, answered with an error page; the pending sign-in is dropped.
async fn refuse_sign_in(
    state: &AppState,
    oidc: &Oidc,
    req: &HttpRequest,
    mut info: RequestInfo,
    error: SignInError,
) -> HttpResponse {
    let (reason, status) = match &error {
        SignInError::InvalidCallback => (Reason::InvalidCallback, StatusCode::UNAUTHORIZED),
        SignInError::Provider(_) => (Reason::IdpError, StatusCode::UNAUTHORIZED),
        SignInError::IdToken(_) => (Reason::InvalidIdToken, StatusCode::UNAUTHORIZED),
        SignInError::NoRole(actor) => {
            info.actor = Some(actor.clone());
            (Reason::NoRole, StatusCode::FORBIDDEN)
        }
    };
    if let Some(held_back) = FAILED_SIGN_IN_LINES.admit() {
        tracing::warn!(request_id = %info.request_id, %error, held_back, "admin sign-in failed");
    }
    state.admin_auth.failed(&info).await;
    audit_session_event(state, &info, AuditDecision::SignInFailed, reason);
    failure_page(state, oidc, req, status, reason)
}

/// The error page of a failed sign-in, which drops the pending one.
fn failure_page(
    state: &AppState,
    oidc: &Oidc,
    req: &HttpRequest,
    status: StatusCode,
    reason: Reason,
) -> HttpResponse {
    let mut page = failure_message(req, status, reason);
    let _ = page.add_cookie(&cookies::removal(cookies::LOGIN, secure(state, oidc, req)));
    page
}

/// The error page alone.
fn failure_message(req: &HttpRequest, status: StatusCode, reason: Reason) -> HttpResponse {
    pages::message_page(
        req,
        status,
        "Sign-in failed",
        format!("The sign-in could not be completed ({reason}). Open the console again to retry."),
    )
}

/// A new session for `identity`: its row stored, the sign-in audited, the
/// browser sent `back` with the session's cookie.
async fn open_session(
    state: &AppState,
    oidc: &Oidc,
    req: &HttpRequest,
    info: &RequestInfo,
    identity: crate::oidc::Identity,
    back: String,
) -> HttpResponse {
    let Some(db) = state.audit_db.as_ref() else {
        return pages::api_error_page(req, ApiError::AuditUnavailable);
    };
    let id = base64::Engine::encode(
        &base64::engine::general_purpose::URL_SAFE_NO_PAD,
        rand::random::<[u8; 32]>(),
    );
    let now = now_ms();
    let ttl = oidc.session_ttl();
    let grants = match serde_json::to_string(&identity.grants) {
        Ok(grants) => grants,
        Err(e) => return pages::api_error_page(req, ApiError::Internal(e.into())),
    };
    let row = StoredSession {
        id_hash: id_hash(&id),
        actor: identity.actor.to_string(),
        roles: identity.roles.to_list(),
        created_at_ms: now,
        expires_at_ms: now.saturating_add(i64::try_from(ttl.as_millis()).unwrap_or(i64::MAX)),
        grants: Some(grants),
    };
    if let Err(e) = db.insert_session(&row, now).await {
        tracing::warn!(error = %e, "an admin session cannot be stored");
        return pages::api_error_page(req, ApiError::AuditUnavailable);
    }
    // The browser's session before this one ends: its cookie is replaced,
    // and a copy of it (another browser profile, a stolen cookie) must not
    // outlive the admin's new sign-in.
    let key = cookies::key(oidc.cookie_secret());
    if let Some(before) = cookies::opened(&key, req, cookies::SESSION, secure(state, oidc, req)) {
        end_replaced_session(state, db, info, &id_hash(&before)).await;
    }
    audit_session_event(state, info, AuditDecision::SignIn, Reason::Oidc);
    let secure = secure(state, oidc, req);
    HttpResponse::SeeOther()
        .insert_header((header::LOCATION, back))
        .insert_header((header::CACHE_CONTROL, "no-store"))
        .cookie(cookies::sealed(&key, cookies::SESSION, id, secure, ttl))
        .cookie(cookies::removal(cookies::LOGIN, secure))
        .finish()
}

/// End the live session `id_hash` a browser signing in again held,
/// audited as `sign_out` of its own admin (who may be another person's
/// sign-in on a shared browser).
async fn end_replaced_session(
    state: &AppState,
    db: &crate::audit::AuditDb,
    info: &RequestInfo,
    id_hash: &str,
) {
    let found = match db.find_session(id_hash, now_ms()).await {
        Ok(found) => found,
        Err(e) => {
            tracing::warn!(error = %e, "an admin's previous session cannot be read");
            return;
        }
    };
    let Some(row) = found else { return };
    match db.delete_session(id_hash).await {
        Ok(true) => {
            let mut ended = info.clone();
            ended.actor = Some(row.actor);
            audit_session_event(state, &ended, AuditDecision::SignOut, Reason::Oidc);
        }
        Ok(false) => {}
        Err(e) => tracing::warn!(error = %e, "an admin's previous session cannot be deleted"),
    }
}

/// End the session of `admin` (behind the console's door, CSRF checked by
/// the caller): its row is deleted, the sign-out audited with its admin
/// (so that the trail tells which sessions ended) and the browser's cookie
/// removed.
pub(super) async fn end_session(
    state: &AppState,
    req: &HttpRequest,
    info: &RequestInfo,
    id_hash: &str,
) -> HttpResponse {
    if let Some(db) = state.audit_db.as_ref() {
        if let Err(e) = db.delete_session(id_hash).await {
            tracing::warn!(error = %e, "an admin session cannot be deleted");
            return pages::api_error_page(req, ApiError::AuditUnavailable);
        }
    }
    audit_session_event(state, info, AuditDecision::SignOut, Reason::Oidc);
    let secure = state
        .oidc
        .as_deref()
        .is_some_and(|oidc| secure(state, oidc, req));
    let mut page = pages::signed_out_page(req);
    let _ = page.add_cookie(&cookies::removal(cookies::SESSION, secure));
    page
}

/// The sign-in's own routes, outside the door: they are how one gets in.
pub fn configure(cfg: &mut web::ServiceConfig) {
    let other_methods = || crate::routes::other_methods("GET");
    cfg.service(
        web::resource("/admin/login")
            .route(web::get().to(login))
            .default_service(other_methods()),
    )
    .service(
        web::resource(CALLBACK_PATH)
            .route(web::get().to(callback))
            .default_service(other_methods()),
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_console_paths_are_returned_to() {
        for (raw, back) in [
            (
                Some("/admin/subjects/user/alice"),
                "/admin/subjects/user/alice",
            ),
            (Some("/admin?decision=lock"), "/admin?decision=lock"),
            (Some("/admin"), "/admin"),
            (Some("//evil.example/admin"), "/admin"),
            (Some("https://evil.example/admin"), "/admin"),
            (Some("/administrator"), "/admin"),
            (Some("/admin/\\evil"), "/admin"),
            (Some("/admin/oidc/callback?code=x"), "/admin"),
            (Some("/admin/login?next=/admin"), "/admin"),
            (Some("/admin/\nSet-Cookie: x=y"), "/admin"),
            (Some("/admin/\u{7f}"), "/admin"),
            (None, "/admin"),
        ] {
            assert_eq!(return_path(raw), back, "{raw:?}");
        }
        let longest = format!("/admin?subject={}", "a".repeat(MAX_RETURN_PATH - 15));
        assert_eq!(return_path(Some(&longest)), longest);
        assert_eq!(return_path(Some(&format!("{longest}a"))), "/admin");
        let quoted = format!("/admin?subject={}", "\"".repeat(MAX_RETURN_PATH / 2 - 8));
        assert_eq!(return_path(Some(&quoted)), quoted);
        assert_eq!(return_path(Some(&format!("{quoted}\""))), "/admin");
    }

    /// The pending sign-in's cookie of the longest return path stays within
    /// what browsers keep (4,096 bytes, name, value and attributes).
    #[test]
    fn the_longest_return_path_fits_in_a_cookie() {
        let key = cookies::key(b"a cookie secret of thirty-two bytes at least");
        for path in [
            format!("/admin?subject={}", "a".repeat(MAX_RETURN_PATH - 15)),
            format!("/admin?subject={}", "\"".repeat(MAX_RETURN_PATH / 2 - 8)),
            format!("/admin?subject={}", "é".repeat((MAX_RETURN_PATH - 15) / 2)),
        ] {
            let pending = crate::oidc::PendingLogin {
                state: "s".repeat(43),
                nonce: "n".repeat(43),
                verifier: "v".repeat(43),
                return_to: return_path(Some(&path)),
                started: 1_800_000_000,
            };
            assert_eq!(pending.return_to, path, "kept");
            let value = serde_json::to_string(&pending).unwrap();
            let cookie = cookies::sealed(&key, cookies::LOGIN, value, true, LOGIN_TTL);
            let written = cookie.to_string().len();
            assert!(written <= 4096, "{written} bytes");
        }
    }

    /// A sign-in that an ended session's export link started comes back to
    /// the events page with the link's filters, not to the export (whose
    /// token the new session would refuse); any other page as it was.
    #[test]
    fn an_export_link_resumes_at_its_events_page() {
        for (path, query, back) in [
            (
                "/admin/events.csv",
                Some("decision=lock&csrf=1795993348.0837&subject=a%2Bb"),
                "/admin?decision=lock&subject=a%2Bb",
            ),
            ("/admin/events.csv", Some("csrf=1.00"), "/admin"),
            ("/admin/events.csv", None, "/admin"),
            (
                "/admin",
                Some("decision=lock&csrf=x"),
                "/admin?decision=lock&csrf=x",
            ),
            ("/admin/overview", None, "/admin/overview"),
        ] {
            assert_eq!(resume_at(path, query), back, "{path} {query:?}");
        }
    }
}
