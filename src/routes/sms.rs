//! `POST /sms/send` and `POST /sms/verify`: the body is parsed here, the SMS
//! guard decides, and its answer becomes the response.

use actix_web::http::header::{HeaderName, HeaderValue, CONTENT_TYPE};
use actix_web::{web, HttpRequest, HttpResponse};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::api_key::PublicKey;
use super::cors::CorsOrigins;
use super::schemas::{self, RateLimitedError};
use super::to_the_end::to_the_end;
use super::{json, post};
use crate::captcha::CaptchaProof;
use crate::domain::PhoneNumber;
use crate::error::{ApiError, ErrorBody};
use crate::guard::sms::{SendRequest, SmsRefusal, Verified};
use crate::metrics::{self, Outcome, Route};

/// Register `/sms/send` and `/sms/verify` (POST, JSON bodies).
pub fn configure(cfg: &mut web::ServiceConfig, cors: &CorsOrigins) {
    // Only where CORS is on: a send pays no layer for it otherwise.
    use actix_web::middleware::{from_fn, Condition};
    let on = cors.enabled();
    cfg.service(
        post("/sms/send", send)
            .wrap(cors.middleware())
            .wrap(Condition::new(on, from_fn(super::cors::json_refusals))),
    )
    .service(
        post("/sms/verify", verify)
            .wrap(cors.middleware())
            .wrap(Condition::new(on, from_fn(super::cors::json_refusals))),
    );
}

const RATELIMIT_POLICY: HeaderName = HeaderName::from_static("ratelimit-policy");
const RATELIMIT: HeaderName = HeaderName::from_static("ratelimit");

/// `"phone";a=1;b=2`, the value of a RateLimit header, written with `itoa`:
/// two `format!`s were about 1,400 instructions of every send.
fn phone_quota((a, x): (&str, u64), (b, y): (&str, u64)) -> HeaderValue {
    let (mut x_digits, mut y_digits) = (itoa::Buffer::new(), itoa::Buffer::new());
    let (x, y) = (x_digits.format(x), y_digits.format(y));
    let mut value = String::with_capacity(13 + x.len() + y.len());
    for part in ["\"phone\";", a, "=", x, ";", b, "=", y] {
        value.push_str(part);
    }
    // Digits, letters and the quoted name: always a valid header value.
    HeaderValue::from_str(&value).unwrap_or_else(|_| HeaderValue::from_static("\"phone\""))
}

#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({"phone": "+8613800138000", "ip": "203.0.113.7", "locale": "zh-CN"}))]
struct SendBody {
    #[schema(schema_with = schemas::phone)]
    phone: String,
    #[schema(schema_with = schemas::optional_ip_address)]
    ip: Option<String>,
    #[schema(schema_with = schemas::optional_locale)]
    locale: Option<String>,
    /// Captcha provider token, verified server-side when `captcha.kind` names a provider.
    captcha_token: Option<String>,
    /// The caller verified a captcha itself; counts only when `captcha.kind = "none"`.
    captcha_passed: Option<bool>,
}

#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({"phone": "+8613800138000", "code": "123456"}))]
struct VerifyBody {
    /// The phone number the code was sent to.
    #[schema(schema_with = schemas::phone)]
    phone: String,
    #[schema(schema_with = schemas::code)]
    code: String,
    #[schema(schema_with = schemas::optional_ip_address)]
    ip: Option<String>,
}

/// `POST /sms/send` 200.
#[derive(Serialize, ToSchema)]
pub struct SendResult {
    /// Always `sent`.
    #[schema(example = "sent")]
    status: &'static str,
    /// The masked phone number.
    #[schema(example = "+86138****8000")]
    phone: String,
    /// Seconds the code stays valid.
    #[schema(example = 300)]
    code_ttl_secs: u64,
    /// When this phone's next send would pass the phone windows (0: at once).
    #[schema(example = 60)]
    resend_after_secs: u64,
    /// Whether the *next* send will need a captcha.
    captcha_required: bool,
}

/// `POST /sms/verify` 200: `{"valid": true}` or `{"valid": false, "attempts_left": n}`.
#[derive(Serialize, ToSchema)]
#[schema(example = json!({"valid": false, "attempts_left": 3}))]
pub struct VerifyResult {
    /// Whether the code was right; a right code is used up.
    valid: bool,
    /// This address's wrong tries left (the asker's own, or those everyone
    /// else shares) before the code is burnt for it; only when `valid` is
    /// false.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false, example = 3)]
    attempts_left: Option<u32>,
}

/// Send an SMS verification code
#[utoipa::path(
    post,
    path = "/sms/send",
    operation_id = "sms_send",
    request_body = SendBody,
    tag = "sms",
    responses(
        (status = 200, description = "The code was sent", body = SendResult, headers(
            ("RateLimit-Policy" = String, description = "The phone's window with the fewest sends left: `\"phone\";q=<limit>;w=<window secs>` (IETF RateLimit headers draft); absent in shadow mode"),
            ("RateLimit" = String, description = "What is left of it: `\"phone\";r=<sends left>;t=<secs until the next send passes>`"),
        )),
        (status = 400, description = "`invalid_phone`, or `invalid_request` (malformed JSON, missing, empty or unknown fields)", body = ErrorBody),
        (status = 401, description = "`unauthorized`: API keys are configured and the request has a wrong one, or none while `server.keyless_sms` is off", body = ErrorBody),
        (status = 403, description = "`region_blocked`; `captcha_required` (with `captcha_required: true`): the phone's, IP's or IPv6 network's captcha tier is reached (`sms.captcha_after`, `sms.network_captcha_after`), or the number's country asks for a captcha because its sends surge far above its normal, seldom verified (`sms.pumping`); `pumping_suspected`: the number's prefix or country is blocked because too few of the codes sent to it were verified (`sms.pumping`); `blocklisted`: the phone or client IP is on the block list; or `forbidden`: `captcha_passed` from a caller that is not a backend (no API keys configured and not straight from loopback)", body = ErrorBody),
        (status = 413, description = "`payload_too_large`: body over 16 KiB", body = ErrorBody),
        (status = 415, description = "`unsupported_media_type`: body not `application/json`, or compressed (`Content-Encoding`)", body = ErrorBody),
        (status = 429, description = "`rate_limited`", body = RateLimitedError,
            headers(("Retry-After" = u64, description = "Whole seconds until a retry can pass"))),
        (status = 502, description = "`delivery_failed`: the SMS provider refused or could not be reached, and the reservation is given back (but to the asking address's windows when the provider refused to text the number, or declined it past the address's or network's budget of such failures, `sms.failed_delivery_limit`, `sms.failed_delivery_network_limit`; an allow-listed address's send is kept so by the phone's, prefix's and global windows, and a declined send naming no client, which has no budget, by the same windows at once; a connection closed or reset once the request went out spends the same budgets, and naming no client is kept by the phone's windows alone); or it took the message and did not answer within `sms.provider.timeout`, and the send counts in the windows and its code stays (it may arrive late: the body says `may_arrive: true`)", body = ErrorBody),
        (status = 503, description = "`store_unavailable` (only with `store.on_error = \"deny\"`)", body = ErrorBody),
    ),
    security((), ("api_key" = [])),
)]
async fn send(
    req: HttpRequest,
    PublicKey { state, key }: PublicKey,
    body: json::Body<SendBody>,
) -> Result<HttpResponse, ApiError> {
    let body = body.into_inner();
    let info = state
        .access
        .caller(&req, Route::SmsSend, key, body.ip.as_deref())?;
    if body.captcha_passed.is_some() && !info.backend {
        // A browser could say anything here: with a captcha provider it sends
        // `captcha_token`, which tollgate checks itself.
        return Err(ApiError::Forbidden(
            "captcha_passed counts only from a backend (an API key, or loopback when none \
             is configured); a browser sends captcha_token",
        ));
    }
    let request = SendRequest {
        phone: PhoneNumber::parse(&body.phone)?,
        locale: schemas::locale(body.locale)?,
        captcha: CaptchaProof {
            token: body.captcha_token,
            passed: body.captcha_passed,
        },
    };
    let detached = state.detached.clone();
    let result = to_the_end(
        detached,
        async move { state.sms.send(request, &info).await },
    )
    .await;
    metrics::request(
        Route::SmsSend,
        match &result {
            Ok(_) => Outcome::Allow,
            Err(SmsRefusal::CaptchaRequired) => Outcome::Challenge,
            Err(
                SmsRefusal::RateLimited { .. }
                | SmsRefusal::RegionBlocked { .. }
                | SmsRefusal::Blocklisted(_)
                | SmsRefusal::PumpingSuspected,
            ) => Outcome::Deny,
            Err(_) => Outcome::Error,
        },
    );
    if matches!(result, Err(SmsRefusal::PumpingSuspected)) {
        metrics::pumping_refusal();
    }
    let sent = result?;
    let mut answer = HttpResponse::Ok();
    // IETF draft-ietf-httpapi-ratelimit-headers: a page can show a countdown.
    if let Some(q) = sent.quota {
        answer.insert_header((
            RATELIMIT_POLICY,
            phone_quota(("q", u64::from(q.limit)), ("w", q.window_secs)),
        ));
        answer.insert_header((
            RATELIMIT,
            phone_quota(("r", u64::from(q.remaining)), ("t", sent.resend_after_secs)),
        ));
    }
    let result = SendResult {
        status: "sent",
        phone: sent.masked_phone,
        code_ttl_secs: sent.code_ttl_secs,
        resend_after_secs: sent.resend_after_secs,
        captcha_required: sent.captcha_required,
    };
    Ok(answer
        .insert_header((CONTENT_TYPE, HeaderValue::from_static("application/json")))
        .body(send_result_json(&result)))
}

/// The 200 of a send written straight into its string, as the login's
/// (`routes::login::answer`): serde_json's serializer and the content type
/// converted from a `Mime` were about 1,500 instructions of a send
/// (callgrind). The fields and their order are `SendResult`'s, as its
/// `Serialize` writes them (pinned by a test).
fn send_result_json(result: &SendResult) -> String {
    let mut json = String::with_capacity(112);
    json.push_str(r#"{"status":"#);
    push_json_str(&mut json, result.status);
    json.push_str(r#","phone":"#);
    push_json_str(&mut json, &result.phone);
    json.push_str(r#","code_ttl_secs":"#);
    json.push_str(itoa::Buffer::new().format(result.code_ttl_secs));
    json.push_str(r#","resend_after_secs":"#);
    json.push_str(itoa::Buffer::new().format(result.resend_after_secs));
    json.push_str(if result.captcha_required {
        r#","captcha_required":true}"#
    } else {
        r#","captcha_required":false}"#
    });
    json
}

/// `text` as a JSON string. A masked phone is `+`, digits and `*`, with
/// nothing to escape; anything else goes through serde_json.
fn push_json_str(json: &mut String, text: &str) {
    if text.bytes().all(|b| b >= 0x20 && b != b'"' && b != b'\\') {
        json.push('"');
        json.push_str(text);
        json.push('"');
    } else {
        json.push_str(&serde_json::Value::from(text).to_string());
    }
}

/// Check an SMS verification code
///
/// A code is single-use. Each wrong code answers `valid: false` with
/// `attempts_left` counting down; at 0 the code is burnt and further tries
/// answer 429 until a new send. The address that asked for the code (its
/// client IP; an IPv6 client's /64) has `sms.max_verify_attempts` tries of
/// its own, and every other address shares as many: strangers who use
/// theirs up are refused, and cannot burn the asker's code. A phone with
/// no code pending (used, expired
/// or never sent) answers the same way, counting down from
/// `sms.max_verify_attempts`, so the answers never tell whether a code is
/// pending. Failed tries are also counted per client IP
/// (`sms.verify_ip_limits`) and per IPv6 network
/// (`sms.verify_network_limits`); a full window answers 429 before the
/// code is looked at. A backend's call (an API key) without `ip` names
/// no client and is counted in neither: pass the user's `ip`, as on the
/// send.
#[utoipa::path(
    post,
    path = "/sms/verify",
    operation_id = "sms_verify",
    request_body = VerifyBody,
    tag = "sms",
    responses(
        (status = 200, description = "Whether the code was right", body = VerifyResult),
        (status = 400, description = "`invalid_phone`, or `invalid_request` (malformed JSON, missing, empty or unknown fields)", body = ErrorBody),
        (status = 401, description = "`unauthorized`: API keys are configured and the request has a wrong one, or none while `server.keyless_sms` is off", body = ErrorBody),
        (status = 413, description = "`payload_too_large`: body over 16 KiB", body = ErrorBody),
        (status = 415, description = "`unsupported_media_type`: body not `application/json`, or compressed (`Content-Encoding`)", body = ErrorBody),
        (status = 403, description = "`blocklisted`: the phone or client IP is on the block list", body = ErrorBody),
        (status = 429, description = "`rate_limited`: the code was burnt by too many wrong tries, or this address's share of them is used up (rule `phone 5/5m`), or the client IP (or its IPv6 network) has had too many failed tries (`sms.verify_ip_limits`, rule `ip 30/1h`; `sms.verify_network_limits`, rule `network 7680/1h`)", body = RateLimitedError,
            headers(("Retry-After" = u64, description = "Whole seconds: a code's life (`sms.code_ttl`) for a burnt code, or until the IP's (or network's) window admits a try"))),
        (status = 503, description = "`store_unavailable` (only with `store.on_error = \"deny\"`)", body = ErrorBody),
    ),
    security((), ("api_key" = [])),
)]
async fn verify(
    req: HttpRequest,
    PublicKey { state, key }: PublicKey,
    body: json::Body<VerifyBody>,
) -> Result<HttpResponse, ApiError> {
    let body = body.into_inner();
    let info = state
        .access
        .caller(&req, Route::SmsVerify, key, body.ip.as_deref())?;
    let phone = PhoneNumber::parse(&body.phone)?;
    // As the document says: at most 64 characters as given, not all white
    // space; compared without the white space around it.
    if body.code.chars().count() > schemas::CODE_MAX_CHARS {
        return Err(ApiError::InvalidRequest("code is too long".into()));
    }
    if body.code.trim().is_empty() {
        return Err(ApiError::InvalidRequest("code is required".into()));
    }
    let code = body.code;
    let detached = state.detached.clone();
    let verified = to_the_end(detached, async move {
        state.sms.verify(&phone, code.trim(), &info).await
    });
    let result = verified.await;
    metrics::request(
        Route::SmsVerify,
        match &result {
            Ok(Verified::Valid) => Outcome::Allow,
            Ok(Verified::Invalid { .. })
            | Err(SmsRefusal::RateLimited { .. } | SmsRefusal::Blocklisted(_)) => Outcome::Deny,
            Err(_) => Outcome::Error,
        },
    );
    let answer = match result? {
        Verified::Valid => VerifyResult {
            valid: true,
            attempts_left: None,
        },
        Verified::Invalid { attempts_left } => VerifyResult {
            valid: false,
            attempts_left: Some(attempts_left),
        },
    };
    Ok(HttpResponse::Ok().json(answer))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Written by hand, a send's answer is what `SendResult`'s `Serialize`
    /// (the OpenAPI document's schema) writes, for masked phones, text that
    /// must be escaped, and the ends of the numbers.
    #[test]
    fn the_answer_is_the_serialized_result() {
        let phones = [
            "+86138****8000",
            "+33******78",
            "",
            "a\"quote\\and\ncontrol\u{1}",
            "é\u{7f}",
        ];
        for phone in phones {
            for (code_ttl_secs, resend_after_secs) in [(0, 0), (300, 60), (u64::MAX, u64::MAX)] {
                for captcha_required in [false, true] {
                    let result = SendResult {
                        status: "sent",
                        phone: phone.to_string(),
                        code_ttl_secs,
                        resend_after_secs,
                        captcha_required,
                    };
                    assert_eq!(
                        send_result_json(&result),
                        serde_json::to_string(&result).expect("serializes"),
                    );
                }
            }
        }
    }
}
