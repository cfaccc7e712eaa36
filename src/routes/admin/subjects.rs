//! `/admin/api/subjects/{kind}/{id}`: a subject's live state and unblocking
//! it, and reading a subject from a path, which the console shares.

use actix_web::{web, HttpRequest, HttpResponse};

use super::gate::Admin;
use crate::domain::admin_role::Permission;
use crate::domain::SubjectKind;
use crate::error::{ApiError, ErrorBody};
use crate::guard::admin::SubjectState;
use crate::routes::to_the_end::to_the_end;
use crate::routes::AppState;

use super::request::path_subject;

/// Where the API's subject paths start (the console's start at `/admin/subjects/`).
const API_PREFIX: &str = "/admin/api/subjects/";

/// A subject's live state: counts per window per action, lock, captcha
#[utoipa::path(
    get,
    path = "/admin/api/subjects/{kind}/{id}",
    operation_id = "get_subject_state",
    tag = "admin",
    params(
        ("kind" = SubjectKind, Path, description = "The subject kind"),
        ("id" = String, Path, description = "The subject id, percent-encoded \
            (`%2B8613800138000`; a raw `+` is also accepted); an IPv6 /64 as `2001:db8:1:2::/64` or with `%2F`"),
    ),
    responses(
        (status = 200, description = "The subject's live state", body = SubjectState),
        (status = 400, description = "`invalid_request` (unknown kind, malformed id), `invalid_phone`, or `subject_too_long` (a user name over 256 characters once normalised)", body = ErrorBody),
        (status = 401, description = "`unauthorized`: no valid admin token", body = ErrorBody),
        (status = 429, description = "`rate_limited`: this address failed admin authentication `server.admin_auth_limit` times (or its IPv6 /48 `server.admin_auth_network_limit` times); every admin route refuses it, token or not, until `Retry-After`", body = crate::routes::schemas::RateLimitedError,
            headers(("Retry-After" = u64, description = "Whole seconds until the oldest counted failure leaves the window"))),
        (status = 503, description = "`store_unavailable`", body = ErrorBody),
    ),
    security(("admin_token" = []), ("oidc_jwt" = [])),
)]
pub async fn state(
    state: web::Data<AppState>,
    _admin: Admin,
    req: HttpRequest,
) -> Result<HttpResponse, ApiError> {
    let subject = path_subject(&req, API_PREFIX, "")?;
    Ok(HttpResponse::Ok().json(state.admin.state(&subject).await?))
}

/// Clear a subject's windows and lock (audited as `unblock`)
#[utoipa::path(
    post,
    path = "/admin/api/subjects/{kind}/{id}/unblock",
    operation_id = "unblock_subject",
    tag = "admin",
    params(
        ("kind" = SubjectKind, Path, description = "The subject kind"),
        ("id" = String, Path, description = "The subject id, percent-encoded \
            (`%2B8613800138000`; a raw `+` is also accepted); an IPv6 /64 as `2001:db8:1:2::/64` or with `%2F`"),
    ),
    responses(
        (status = 200, description = "The subject's state after the unblock", body = SubjectState),
        (status = 404, description = "`not_found`: a prefix or network of a length no limit counts (`sms.prefix_digits`; `sms.network_bits` and the admin sign-in throttle's /48): nothing to unblock, nothing audited. A prefix still listed as blocked under an earlier `sms.prefix_digits` is unblocked", body = ErrorBody),
        (status = 400, description = "`invalid_request` (unknown kind, malformed id), `invalid_phone`, or `subject_too_long` (a user name over 256 characters once normalised)", body = ErrorBody),
        (status = 401, description = "`unauthorized`: no valid admin token", body = ErrorBody),
        (status = 403, description = "`forbidden`: the admin's role may not unblock (the operator role may); audited", body = ErrorBody),
        (status = 429, description = "`rate_limited`: this address failed admin authentication `server.admin_auth_limit` times (or its IPv6 /48 `server.admin_auth_network_limit` times); every admin route refuses it, token or not, until `Retry-After`", body = crate::routes::schemas::RateLimitedError,
            headers(("Retry-After" = u64, description = "Whole seconds until the oldest counted failure leaves the window"))),
        (status = 503, description = "`store_unavailable`: nothing was done, or (its message says so) the unblock was done and audited but the state after it could not be read", body = ErrorBody),
    ),
    security(("admin_token" = []), ("oidc_jwt" = [])),
)]
pub async fn unblock(
    state: web::Data<AppState>,
    admin: Admin,
    req: HttpRequest,
) -> Result<HttpResponse, ApiError> {
    let subject = path_subject(&req, API_PREFIX, "/unblock")?;
    super::roles::require(&state, &admin, Permission::Unblock, &subject)?;
    // Lifted and audited whether or not the admin waits for the answer.
    let (lifting, target, info) = (state.clone(), subject.clone(), admin.info.clone());
    let unblock = async move { lifting.admin.unblock(&target, &info).await };
    to_the_end(state.detached.clone(), unblock).await?;
    let after = state.admin.state(&subject).await;
    Ok(HttpResponse::Ok().json(after.map_err(ApiError::UnblockedStateUnread)?))
}
