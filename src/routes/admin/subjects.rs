//! `/admin/api/subjects/{kind}/{id}`: a subject's live state and unblocking
//! it, and reading a subject from a path, which the console shares.

use actix_web::{web, HttpRequest, HttpResponse};

use crate::domain::{Action, ClientIp, PhoneNumber, Subject, SubjectKind, Username};
use crate::error::{ApiError, ErrorBody};
use crate::guard::admin::SubjectState;
use crate::routes::AppState;

/// Where the API's subject paths start (the console's start at `/admin/subjects/`).
const API_PREFIX: &str = "/admin/api/subjects/";

/// `{kind}/{id}` from the path, the id normalised as the guards store it
/// (`%2B8613800138000` and a raw `+` both name the phone `+8613800138000`).
///
/// The `{kind}/{id}` that follows `prefix` in the request's path, the id
/// percent-decoded exactly once. actix decodes path parameters but leaves
/// `%2F` encoded, so decoding that again would turn a user literally named
/// `a%2Fb` (sent as `a%252Fb`) into `a/b`; the raw path avoids both.
/// `suffix` is what follows the id on this route (`/unblock`), so that a
/// user named `unblock` is a user like any other on the others.
pub(super) fn path_subject(
    req: &HttpRequest,
    prefix: &str,
    suffix: &str,
) -> Result<Subject, ApiError> {
    let malformed = || ApiError::InvalidRequest("the path names no subject".into());
    let rest = req
        .uri()
        .path()
        .strip_prefix(prefix)
        .ok_or_else(malformed)?;
    let rest = rest.strip_suffix(suffix).ok_or_else(malformed)?;
    let (kind, id) = rest.split_once('/').ok_or_else(malformed)?;
    let id = percent_encoding::percent_decode_str(id)
        .decode_utf8()
        .map_err(|_| ApiError::InvalidRequest("the subject id is not UTF-8".into()))?;
    subject(kind, &id)
}

/// A subject from its kind and id as an admin writes them, the id
/// normalised as the guards count it.
pub(super) fn subject(kind: &str, id: &str) -> Result<Subject, ApiError> {
    let kind = SubjectKind::parse(kind)
        .ok_or_else(|| ApiError::InvalidRequest(format!("unknown subject kind {kind:?}")))?;
    let invalid = |what: &str| ApiError::InvalidRequest(format!("{id:?} is not {what}"));
    let id = match kind {
        SubjectKind::Phone => PhoneNumber::parse(id)?.e164().to_string(),
        SubjectKind::User => Username::parse(id)
            .map_err(|e| ApiError::InvalidRequest(e.to_string()))?
            .as_str()
            .to_string(),
        SubjectKind::Ip => ClientIp::parse_subject(id)
            .ok_or_else(|| invalid("an IP address or IPv6 /64 (another range is not a subject)"))?
            .subject_id(),
        SubjectKind::Prefix => {
            let digits = id.strip_prefix('+').unwrap_or(id);
            if digits.is_empty() || digits.len() > 15 || !digits.chars().all(|c| c.is_ascii_digit())
            {
                return Err(invalid("a number prefix such as +8613800"));
            }
            format!("+{digits}")
        }
        SubjectKind::Global => {
            if Action::parse(id) != Some(Action::SmsSend) {
                return Err(invalid("a global subject (sms_send)"));
            }
            id.to_string()
        }
        // As `PhoneNumber::region` names it: upper case.
        SubjectKind::Country => {
            if id.len() != 2 || !id.chars().all(|c| c.is_ascii_alphabetic()) {
                return Err(invalid("an ISO 3166 alpha-2 country code such as CN"));
            }
            id.to_ascii_uppercase()
        }
    };
    Ok(Subject::new(kind, id))
}

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
        (status = 400, description = "`invalid_request` (unknown kind, malformed id) or `invalid_phone`", body = ErrorBody),
        (status = 401, description = "`unauthorized`: no valid admin token", body = ErrorBody),
        (status = 503, description = "`store_unavailable`", body = ErrorBody),
    ),
    security(("admin_token" = [])),
)]
pub async fn state(state: web::Data<AppState>, req: HttpRequest) -> Result<HttpResponse, ApiError> {
    state.access.admin(&req)?;
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
        (status = 400, description = "`invalid_request` (unknown kind, malformed id) or `invalid_phone`", body = ErrorBody),
        (status = 401, description = "`unauthorized`: no valid admin token", body = ErrorBody),
        (status = 503, description = "`store_unavailable`", body = ErrorBody),
    ),
    security(("admin_token" = [])),
)]
pub async fn unblock(
    state: web::Data<AppState>,
    req: HttpRequest,
) -> Result<HttpResponse, ApiError> {
    let info = state.access.admin(&req)?;
    let subject = path_subject(&req, API_PREFIX, "/unblock")?;
    Ok(HttpResponse::Ok().json(state.admin.unblock(&subject, &info).await?))
}
