//! The one error type at the HTTP edge: each variant is an error code of
//! DESIGN.md §3 with its status and JSON body, all mapped here.

use actix_web::http::{header, StatusCode};
use actix_web::{HttpResponse, ResponseError};
use serde_json::json;

use crate::guard::ceil_secs;
use crate::guard::sms::SmsRefusal;
use crate::store::StoreError;

#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    #[error("{0}")]
    InvalidRequest(String),
    #[error("{0}")]
    InvalidPhone(String),
    #[error("too many requests ({rule})")]
    RateLimited { rule: String, retry_after_ms: u64 },
    #[error("a captcha is required")]
    CaptchaRequired,
    #[error("sending to this region is not allowed")]
    RegionBlocked,
    #[error("missing or wrong credentials")]
    Unauthorized,
    #[error("the rate-limit store is unavailable")]
    StoreUnavailable(#[source] StoreError),
    #[error("the audit database is unavailable")]
    AuditUnavailable,
    #[error("the SMS provider did not accept the message")]
    DeliveryFailed,
    #[error("not found")]
    NotFound,
    #[error("method not allowed")]
    MethodNotAllowed,
    #[error("request body is larger than {0} bytes")]
    PayloadTooLarge(usize),
    #[error("request body must be application/json")]
    UnsupportedMediaType,
    #[error("internal error")]
    Internal(#[source] anyhow::Error),
}

impl ApiError {
    pub fn code(&self) -> &'static str {
        match self {
            ApiError::InvalidRequest(_) => "invalid_request",
            ApiError::InvalidPhone(_) => "invalid_phone",
            ApiError::RateLimited { .. } => "rate_limited",
            ApiError::CaptchaRequired => "captcha_required",
            ApiError::RegionBlocked => "region_blocked",
            ApiError::Unauthorized => "unauthorized",
            ApiError::StoreUnavailable(_) => "store_unavailable",
            ApiError::AuditUnavailable => "audit_unavailable",
            ApiError::DeliveryFailed => "delivery_failed",
            ApiError::NotFound => "not_found",
            ApiError::MethodNotAllowed => "method_not_allowed",
            ApiError::PayloadTooLarge(_) => "payload_too_large",
            ApiError::UnsupportedMediaType => "unsupported_media_type",
            ApiError::Internal(_) => "internal_error",
        }
    }
}

impl ResponseError for ApiError {
    fn status_code(&self) -> StatusCode {
        match self {
            ApiError::InvalidRequest(_) | ApiError::InvalidPhone(_) => StatusCode::BAD_REQUEST,
            ApiError::RateLimited { .. } => StatusCode::TOO_MANY_REQUESTS,
            ApiError::CaptchaRequired | ApiError::RegionBlocked => StatusCode::FORBIDDEN,
            ApiError::Unauthorized => StatusCode::UNAUTHORIZED,
            ApiError::StoreUnavailable(_) | ApiError::AuditUnavailable => {
                StatusCode::SERVICE_UNAVAILABLE
            }
            ApiError::DeliveryFailed => StatusCode::BAD_GATEWAY,
            ApiError::NotFound => StatusCode::NOT_FOUND,
            ApiError::MethodNotAllowed => StatusCode::METHOD_NOT_ALLOWED,
            ApiError::PayloadTooLarge(_) => StatusCode::PAYLOAD_TOO_LARGE,
            ApiError::UnsupportedMediaType => StatusCode::UNSUPPORTED_MEDIA_TYPE,
            ApiError::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    fn error_response(&self) -> HttpResponse {
        let status = self.status_code();
        let mut body = json!({ "error": self.code(), "message": self.to_string() });
        let mut response = HttpResponse::build(status);
        match self {
            ApiError::RateLimited {
                rule,
                retry_after_ms,
            } => {
                let secs = ceil_secs(*retry_after_ms).max(1);
                body["retry_after_secs"] = json!(secs);
                body["rule"] = json!(rule);
                response.insert_header((header::RETRY_AFTER, secs.to_string()));
            }
            ApiError::CaptchaRequired => body["captcha_required"] = json!(true),
            ApiError::Unauthorized => {
                response.insert_header((header::WWW_AUTHENTICATE, "Bearer"));
            }
            ApiError::StoreUnavailable(cause) => {
                tracing::error!(error = %cause, "store unavailable, failing closed");
            }
            ApiError::Internal(cause) => {
                tracing::error!(error = ?cause, "internal error");
            }
            _ => {}
        }
        response.json(body)
    }
}

impl From<StoreError> for ApiError {
    fn from(e: StoreError) -> Self {
        ApiError::StoreUnavailable(e)
    }
}

impl From<SmsRefusal> for ApiError {
    fn from(refusal: SmsRefusal) -> Self {
        match refusal {
            SmsRefusal::RegionBlocked { .. } => ApiError::RegionBlocked,
            SmsRefusal::CaptchaRequired => ApiError::CaptchaRequired,
            SmsRefusal::RateLimited {
                rule,
                retry_after_ms,
            } => ApiError::RateLimited {
                rule,
                retry_after_ms,
            },
            SmsRefusal::DeliveryFailed(cause) => {
                tracing::warn!(error = %cause, "sms delivery failed");
                ApiError::DeliveryFailed
            }
            SmsRefusal::Store(e) => ApiError::StoreUnavailable(e),
        }
    }
}
