use actix_web::{web, HttpRequest, HttpResponse};
use serde::Deserialize;

use super::{post, AppState};
use crate::captcha::CaptchaProof;
use crate::domain::Username;
use crate::error::ApiError;
use crate::guard::login::{LoginAttempt, LoginDecision, LoginState};
use crate::metrics;

pub fn configure(cfg: &mut web::ServiceConfig) {
    cfg.service(post("/login/check", check))
        .service(post("/login/attempt", attempt));
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct CheckBody {
    user: String,
    ip: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct AttemptBody {
    user: String,
    ip: Option<String>,
    success: bool,
    captcha_token: Option<String>,
    captcha_passed: Option<bool>,
    notify_email: Option<String>,
    /// Locale of the lockout notice (`en` when absent or unknown).
    locale: Option<String>,
}

fn parse_user(raw: &str) -> Result<Username, ApiError> {
    Username::parse(raw).map_err(|e| ApiError::InvalidRequest(e.to_string()))
}

async fn check(
    state: web::Data<AppState>,
    req: HttpRequest,
    body: web::Json<CheckBody>,
) -> Result<HttpResponse, ApiError> {
    let info = state.access.caller(&req, body.ip.as_deref())?;
    let user = parse_user(&body.user)?;
    let login_state = count("login_check", state.login.check(&user, &info).await)?;
    Ok(HttpResponse::Ok().json(login_state))
}

async fn attempt(
    state: web::Data<AppState>,
    req: HttpRequest,
    body: web::Json<AttemptBody>,
) -> Result<HttpResponse, ApiError> {
    let body = body.into_inner();
    let info = state.access.caller(&req, body.ip.as_deref())?;
    let user = parse_user(&body.user)?;
    if let Some(email) = &body.notify_email {
        let plausible = email.len() <= 254
            && email
                .split_once('@')
                .is_some_and(|(l, d)| !l.is_empty() && d.contains('.'));
        if !plausible {
            return Err(ApiError::InvalidRequest(
                "notify_email is not an email address".into(),
            ));
        }
    }
    let attempt = LoginAttempt {
        user,
        success: body.success,
        captcha: CaptchaProof {
            token: body.captcha_token,
            passed: body.captcha_passed,
        },
        notify_email: body.notify_email,
        locale: super::sms::parse_locale(body.locale)?,
    };
    let login_state = count("login_attempt", state.login.attempt(attempt, &info).await)?;
    Ok(HttpResponse::Ok().json(login_state))
}

fn count<E>(route: &'static str, result: Result<LoginState, E>) -> Result<LoginState, E> {
    metrics::request(
        route,
        match &result {
            Ok(state) => match state.decision {
                LoginDecision::Allow => "allow",
                LoginDecision::Challenge => "challenge",
                LoginDecision::Deny => "deny",
            },
            Err(_) => "error",
        },
    );
    result
}
