//! JSON bodies: size limit, content type and parse errors all answered as
//! DESIGN.md's JSON errors, never actix's default text.

use actix_web::body::MessageBody;
use actix_web::dev::{ServiceRequest, ServiceResponse};
use actix_web::error::JsonPayloadError;
use actix_web::http::Method;
use actix_web::middleware::Next;
use actix_web::web::JsonConfig;
use actix_web::HttpMessage;

use super::BODY_LIMIT;
use crate::error::ApiError;

/// The JSON extractor's settings: the 16 KiB body limit, a JSON content
/// type, and every failure answered as an `ApiError`.
pub fn config() -> JsonConfig {
    JsonConfig::default()
        .limit(BODY_LIMIT)
        .content_type_required(true)
        .error_handler(|err, _req| {
            let api = match &err {
                JsonPayloadError::Overflow { .. }
                | JsonPayloadError::OverflowKnownLength { .. } => {
                    ApiError::PayloadTooLarge(BODY_LIMIT)
                }
                JsonPayloadError::ContentType => ApiError::UnsupportedMediaType,
                JsonPayloadError::Deserialize(e) => {
                    ApiError::InvalidRequest(format!("invalid JSON body: {e}"))
                }
                other => ApiError::InvalidRequest(format!("unreadable body: {other}")),
            };
            api.into()
        })
}

/// A POST body must say `application/json` (parameters such as `charset`
/// allowed): actix's JSON extractor alone also takes any `*/json` and
/// `*/*+json` (`text/json`, `image/json`), which no client of this API sends.
pub async fn require_application_json(
    req: ServiceRequest,
    next: Next<impl MessageBody>,
) -> Result<ServiceResponse<impl MessageBody>, actix_web::Error> {
    if req.method() == Method::POST && !is_application_json(&req) {
        return Err(ApiError::UnsupportedMediaType.into());
    }
    next.call(req).await
}

/// [`require_application_json`] inside a handler, for one that must
/// authenticate its caller before it says anything about the body.
pub fn check_application_json(req: &actix_web::HttpRequest) -> Result<(), ApiError> {
    match req.mime_type() {
        Ok(Some(mime))
            if mime.type_() == "application"
                && mime.subtype() == "json"
                && mime.suffix().is_none() =>
        {
            Ok(())
        }
        _ => Err(ApiError::UnsupportedMediaType),
    }
}

fn is_application_json(req: &ServiceRequest) -> bool {
    // What nearly every client sends, without parsing it as a media type
    // (about 1,000 instructions a request).
    let plain = req
        .headers()
        .get(actix_web::http::header::CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"application/json"));
    plain
        || matches!(
            req.mime_type(),
            Ok(Some(mime)) if mime.type_() == "application"
                && mime.subtype() == "json"
                && mime.suffix().is_none()
        )
}
