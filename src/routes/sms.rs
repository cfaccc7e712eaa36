use actix_web::{web, HttpRequest, HttpResponse};
use serde::Deserialize;
use serde_json::json;

use super::{post, AppState};
use crate::captcha::CaptchaProof;
use crate::domain::{PhoneError, PhoneNumber};
use crate::error::ApiError;
use crate::guard::sms::{SendRequest, SmsRefusal, Verified};
use crate::metrics;

pub fn configure(cfg: &mut web::ServiceConfig) {
    cfg.service(post("/sms/send", send))
        .service(post("/sms/verify", verify));
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct SendBody {
    phone: String,
    ip: Option<String>,
    locale: Option<String>,
    captcha_token: Option<String>,
    captcha_passed: Option<bool>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct VerifyBody {
    phone: String,
    code: String,
    ip: Option<String>,
}

fn parse_phone(raw: &str) -> Result<PhoneNumber, ApiError> {
    PhoneNumber::parse(raw).map_err(|e| match e {
        PhoneError::Empty => ApiError::InvalidRequest(e.to_string()),
        other => ApiError::InvalidPhone(other.to_string()),
    })
}

pub(super) fn parse_locale(raw: Option<String>) -> Result<Option<String>, ApiError> {
    match raw {
        Some(l)
            if l.is_empty()
                || l.len() > 35
                || !l
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_') =>
        {
            Err(ApiError::InvalidRequest(
                "locale must be a language tag such as zh-CN".into(),
            ))
        }
        other => Ok(other),
    }
}

async fn send(
    state: web::Data<AppState>,
    req: HttpRequest,
    body: web::Json<SendBody>,
) -> Result<HttpResponse, ApiError> {
    let body = body.into_inner();
    let info = state.access.caller(&req, body.ip.as_deref())?;
    let request = SendRequest {
        phone: parse_phone(&body.phone)?,
        locale: parse_locale(body.locale)?,
        captcha: CaptchaProof {
            token: body.captcha_token,
            passed: body.captcha_passed,
        },
    };
    let result = state.sms.send(request, &info).await;
    metrics::request(
        "sms_send",
        match &result {
            Ok(_) => "allow",
            Err(SmsRefusal::CaptchaRequired) => "challenge",
            Err(SmsRefusal::RateLimited { .. } | SmsRefusal::RegionBlocked { .. }) => "deny",
            Err(_) => "error",
        },
    );
    let sent = result?;
    Ok(HttpResponse::Ok().json(json!({
        "status": "sent",
        "phone": sent.masked_phone,
        "code_ttl_secs": sent.code_ttl_secs,
        "resend_after_secs": sent.resend_after_secs,
        "captcha_required": sent.captcha_required,
    })))
}

async fn verify(
    state: web::Data<AppState>,
    req: HttpRequest,
    body: web::Json<VerifyBody>,
) -> Result<HttpResponse, ApiError> {
    let body = body.into_inner();
    let info = state.access.caller(&req, body.ip.as_deref())?;
    let phone = parse_phone(&body.phone)?;
    let code = body.code.trim();
    if code.is_empty() {
        return Err(ApiError::InvalidRequest("code is required".into()));
    }
    if code.len() > 64 {
        return Err(ApiError::InvalidRequest("code is too long".into()));
    }
    let result = state.sms.verify(&phone, code, &info).await;
    metrics::request(
        "sms_verify",
        match &result {
            Ok(Verified::Valid) => "allow",
            Ok(Verified::Invalid { .. }) | Err(SmsRefusal::RateLimited { .. }) => "deny",
            Err(_) => "error",
        },
    );
    let answer = match result? {
        Verified::Valid => json!({ "valid": true }),
        Verified::Invalid { attempts_left } => {
            json!({ "valid": false, "attempts_left": attempts_left })
        }
    };
    Ok(HttpResponse::Ok().json(answer))
}
