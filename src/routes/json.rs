//! JSON bodies: size limit, content type and parse errors all answered as
//! DESIGN.md's JSON errors, never actix's default text.

use actix_web::error::JsonPayloadError;
use actix_web::web::JsonConfig;

use super::BODY_LIMIT;
use crate::error::ApiError;

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
