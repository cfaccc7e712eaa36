//! `POST /login/check` and `POST /login/attempt`: only the login backend may
//! call them; the body is parsed here and the login guard decides.

use actix_web::http::header::{HeaderValue, CONTENT_TYPE};
use actix_web::{web, HttpRequest, HttpResponse};
use serde::Deserialize;
use utoipa::ToSchema;

use super::api_key::BackendKey;
use super::to_the_end::to_the_end;
use super::{json, post, schemas};
use crate::captcha::CaptchaProof;
use crate::domain::{EmailAddress, Username};
use crate::error::{ApiError, ErrorBody};
use crate::guard::login::{LoginAttempt, LoginDecision, LoginRefusal, LoginState};
use crate::metrics::{self, Outcome, Route};

/// Register `/login/check` and `/login/attempt` (POST, JSON bodies).
pub fn configure(cfg: &mut web::ServiceConfig) {
    cfg.service(post("/login/check", check))
        .service(post("/login/attempt", attempt));
}

#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({"user": "alice", "ip": "203.0.113.7"}))]
struct CheckBody {
    #[schema(schema_with = schemas::user)]
    user: String,
    #[schema(schema_with = schemas::optional_ip_address)]
    ip: Option<String>,
}

#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({"user": "alice", "ip": "203.0.113.7", "success": false, "notify_email": "alice@example.com"}))]
struct AttemptBody {
    #[schema(schema_with = schemas::user)]
    user: String,
    #[schema(schema_with = schemas::optional_ip_address)]
    ip: Option<String>,
    /// Whether the password was right.
    success: bool,
    /// Captcha provider token, verified server-side when `captcha.kind` names a provider.
    captcha_token: Option<String>,
    /// The caller verified a captcha itself; counts only when `captcha.kind = "none"`.
    captcha_passed: Option<bool>,
    #[schema(schema_with = schemas::optional_email)]
    notify_email: Option<String>,
    #[schema(schema_with = schemas::optional_locale)]
    locale: Option<String>,
}

fn parse_user(raw: &str) -> Result<Username, ApiError> {
    Ok(Username::parse(raw)?)
}

/// Whether a captcha or a lock applies to a login (read-only, counts nothing)
#[utoipa::path(
    post,
    path = "/login/check",
    operation_id = "login_check",
    request_body = CheckBody,
    tag = "login",
    responses(
        (status = 200, description = "`deny` when the user is locked or the IP blocked, `challenge` when a captcha is required, `allow` otherwise", body = LoginState),
        (status = 400, description = "`invalid_request` (malformed JSON, missing, empty or unknown fields), or `subject_too_long`: `user` is over 256 characters once normalised (NFKC can make one character many)", body = ErrorBody),
        (status = 401, description = "`unauthorized`: API keys are configured and none was given", body = ErrorBody),
        (status = 403, description = "`forbidden`: not the login backend (no API keys are configured and the call is not straight from loopback); or `blocklisted`: the user or client IP is on the block list (`[lists]`, `/admin/api/lists`)", body = ErrorBody),
        (status = 413, description = "`payload_too_large`: body over 16 KiB", body = ErrorBody),
        (status = 415, description = "`unsupported_media_type`: body not `application/json`, or compressed (`Content-Encoding`)", body = ErrorBody),
        (status = 503, description = "`store_unavailable` (only with `store.on_error = \"deny\"`)", body = ErrorBody),
    ),
    security((), ("api_key" = [])),
)]
async fn check(
    req: HttpRequest,
    BackendKey { state, key }: BackendKey,
    body: json::Body<CheckBody>,
) -> Result<HttpResponse, ApiError> {
    let info = state
        .access
        .caller(&req, Route::LoginCheck, key, body.ip.as_deref())?;
    let user = parse_user(&body.user)?;
    let login_state = count(Route::LoginCheck, state.login.check(&user, &info).await)?;
    Ok(answer(&login_state))
}

/// Report a login outcome and get the resulting state
///
/// A locked user or blocked IP answers `deny`, a required and missing captcha
/// `challenge` (neither is counted); otherwise the outcome is recorded and the
/// answer is `allow`, saying whether the *next* attempt needs a captcha or
/// whether this failure locked the user.
#[utoipa::path(
    post,
    path = "/login/attempt",
    operation_id = "login_attempt",
    request_body = AttemptBody,
    tag = "login",
    responses(
        (status = 200, description = "The state after this attempt", body = LoginState),
        (status = 400, description = "`invalid_request` (malformed JSON, missing, empty or unknown fields, a bad `notify_email`), or `subject_too_long`: `user` is over 256 characters once normalised (NFKC can make one character many)", body = ErrorBody),
        (status = 401, description = "`unauthorized`: API keys are configured and none was given", body = ErrorBody),
        (status = 403, description = "`forbidden`: not the login backend (no API keys are configured and the call is not straight from loopback); or `blocklisted`: the user or client IP is on the block list (`[lists]`, `/admin/api/lists`)", body = ErrorBody),
        (status = 413, description = "`payload_too_large`: body over 16 KiB", body = ErrorBody),
        (status = 415, description = "`unsupported_media_type`: body not `application/json`, or compressed (`Content-Encoding`)", body = ErrorBody),
        (status = 503, description = "`store_unavailable` (only with `store.on_error = \"deny\"`)", body = ErrorBody),
    ),
    security((), ("api_key" = [])),
)]
async fn attempt(
    req: HttpRequest,
    BackendKey { state, key }: BackendKey,
    body: json::Body<AttemptBody>,
) -> Result<HttpResponse, ApiError> {
    let body = body.into_inner();
    let info = state
        .access
        .caller(&req, Route::LoginAttempt, key, body.ip.as_deref())?;
    let user = parse_user(&body.user)?;
    let notify_email = body
        .notify_email
        .as_deref()
        .map(EmailAddress::parse)
        .transpose()
        .map_err(|e| ApiError::InvalidRequest(e.to_string()))?;
    let attempt = LoginAttempt {
        user,
        success: body.success,
        captcha: CaptchaProof {
            token: body.captcha_token,
            passed: body.captcha_passed,
        },
        notify_email,
        locale: schemas::locale(body.locale)?,
    };
    let detached = state.detached.clone();
    let attempted = to_the_end(detached, async move {
        state.login.attempt(attempt, &info).await
    });
    let login_state = count(Route::LoginAttempt, attempted.await)?;
    Ok(answer(&login_state))
}

/// The 200 of both endpoints: the state as JSON, written straight into
/// its string. serde_json's serializer (field by field, each key escaped
/// character by character) and a content type converted from a `Mime` cost
/// about 1,600 instructions a login (callgrind); the fields and their order
/// are `LoginState`'s, as its `Serialize` writes them (pinned by a test).
fn answer(state: &LoginState) -> HttpResponse {
    HttpResponse::Ok()
        .insert_header((CONTENT_TYPE, HeaderValue::from_static("application/json")))
        .body(login_state_json(state))
}

fn login_state_json(state: &LoginState) -> String {
    let mut json = String::with_capacity(128);
    json.push_str(match state.decision {
        LoginDecision::Allow => r#"{"decision":"allow""#,
        LoginDecision::Challenge => r#"{"decision":"challenge""#,
        LoginDecision::Deny => r#"{"decision":"deny""#,
    });
    json.push_str(if state.captcha_required {
        r#","captcha_required":true"#
    } else {
        r#","captcha_required":false"#
    });
    json.push_str(if state.locked {
        r#","locked":true"#
    } else {
        r#","locked":false"#
    });
    json.push_str(r#","retry_after_secs":"#);
    match state.retry_after_secs {
        Some(secs) => json.push_str(itoa::Buffer::new().format(secs)),
        None => json.push_str("null"),
    }
    json.push_str(r#","failures":"#);
    json.push_str(itoa::Buffer::new().format(state.failures));
    json.push_str(r#","reason":"#);
    match state.reason {
        // Every reason is snake_case ASCII: nothing to escape.
        Some(reason) => {
            json.push('"');
            json.push_str(reason.as_str());
            json.push('"');
        }
        None => json.push_str("null"),
    }
    json.push('}');
    json
}

fn count(
    route: Route,
    result: Result<LoginState, LoginRefusal>,
) -> Result<LoginState, LoginRefusal> {
    metrics::request(
        route,
        match &result {
            Ok(state) => match state.decision {
                LoginDecision::Allow => Outcome::Allow,
                LoginDecision::Challenge => Outcome::Challenge,
                LoginDecision::Deny => Outcome::Deny,
            },
            Err(LoginRefusal::Blocklisted(_)) => Outcome::Deny,
            Err(LoginRefusal::Store(_)) => Outcome::Error,
        },
    );
    result
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::Reason;

    /// Written by hand, the answer is what `LoginState`'s `Serialize` (the
    /// OpenAPI document's schema) writes, for every decision, every reason
    /// and the ends of the numbers.
    #[test]
    fn the_answer_is_the_serialized_state() {
        let reasons = Reason::ALL.into_iter().map(Some).chain([None]);
        for reason in reasons {
            for decision in [
                LoginDecision::Allow,
                LoginDecision::Challenge,
                LoginDecision::Deny,
            ] {
                for (retry_after_secs, failures) in
                    [(None, 0), (Some(0), 1), (Some(u64::MAX), u32::MAX)]
                {
                    for (captcha_required, locked) in
                        [(false, false), (true, false), (false, true), (true, true)]
                    {
                        let state = LoginState {
                            decision,
                            captcha_required,
                            locked,
                            retry_after_secs,
                            failures,
                            reason,
                        };
                        assert_eq!(
                            login_state_json(&state),
                            serde_json::to_string(&state).expect("serializes"),
                        );
                    }
                }
            }
        }
    }
}
