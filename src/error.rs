//! The one error type at the HTTP edge: each variant is an error code of
//! DESIGN.md §3 with its status and JSON body, all mapped here.

use actix_web::http::{header, StatusCode};
use actix_web::{HttpResponse, ResponseError};
use serde::Serialize;
use utoipa::ToSchema;

use crate::audit::query::ParamError;
use crate::domain::{PhoneError, SubjectError, UsernameError};
use crate::guard::admin::UnblockError;
use crate::guard::ceil_secs;
use crate::guard::login::LoginRefusal;
use crate::guard::sms::SmsRefusal;
use crate::store::StoreError;

/// Every error an HTTP answer can carry; `Display` is the answer's `message`.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// 400: malformed JSON, a missing, empty or unknown field, a bad query; the
    /// text says which.
    #[error("{0}")]
    InvalidRequest(String),
    /// 400: the phone number does not parse; the text says why.
    #[error("{0}")]
    InvalidPhone(String),
    /// 400: a subject id from outside (a login name) is longer than 256
    /// characters once normalised; the text says which.
    #[error("{0}")]
    SubjectTooLong(String),
    /// 429: a rule refused.
    #[error("too many requests ({rule})")]
    RateLimited {
        /// The rule's name (`phone 5/1h`), in the message and the `rule` field.
        rule: String,
        /// How long to wait; it goes out rounded up to whole seconds, in
        /// `Retry-After` and `retry_after_secs`.
        retry_after_ms: u64,
    },
    /// 403: a captcha tier applies and no captcha was passed.
    #[error("a captcha is required")]
    CaptchaRequired,
    /// 403: the phone's region may not receive codes.
    #[error("sending to this region is not allowed")]
    RegionBlocked,
    /// 403: the IP, phone or user is on the block list.
    #[error("this {0} is on the block list")]
    Blocklisted(&'static str),
    /// 403: the phone's number prefix or country is blocked by the SMS
    /// pumping guard. The answer says no more (not the figures, which would
    /// tell an attacker how many codes to verify).
    #[error("sending codes to this number range is suspended: too few of its codes are verified")]
    PumpingSuspected,
    /// 401, with `WWW-Authenticate: Bearer`.
    #[error("missing or wrong credentials")]
    Unauthorized,
    /// A browser-side caller asserted what only the backend may (see
    /// `routes::caller`); says what it may not do.
    #[error("{0}")]
    Forbidden(&'static str),
    /// 503: the store failed under `store.on_error = "deny"`; the cause is logged.
    #[error("the rate-limit store is unavailable")]
    StoreUnavailable(#[source] StoreError),
    /// 503 `store_unavailable` after an unblock was done and audited: the
    /// state after it could not be read (a retry unblocks and audits again).
    #[error("the unblock was done and audited, but the store did not answer the read of the state after it")]
    UnblockedStateUnread(#[source] StoreError),
    /// 503: the audit database cannot be reached (admin event queries).
    #[error("the audit database is unavailable")]
    AuditUnavailable,
    /// 503: the OpenID provider (its discovery document or keys) cannot be
    /// reached, so an admin's JWT cannot be checked.
    #[error("the identity provider is unavailable")]
    IdentityProviderUnavailable,
    /// 502: the SMS provider refused the message or did not answer;
    /// `number_refused` when it refused to text the number itself,
    /// `may_arrive` when it took the message and did not answer in time.
    #[error("{}", if *number_refused { "the SMS provider refused to text this number" } else if *may_arrive { "the SMS provider did not answer in time: the message may still arrive" } else { "the SMS provider did not accept the message" })]
    DeliveryFailed {
        /// The provider refused the number: a resend to it is refused again.
        number_refused: bool,
        /// The provider may deliver the message late: its code verifies
        /// then, and the send counted (a resend meets the phone's windows).
        may_arrive: bool,
    },
    /// 404: no such route.
    #[error("not found")]
    NotFound,
    /// 404: a subject no limit counts (a prefix or network of another
    /// length than the running settings'): nothing to unblock. Not 400: the
    /// name is well formed, and which lengths count is the deployment's.
    #[error("{0}")]
    NotCounted(String),
    /// Carries the methods the route does allow, for the `Allow` header.
    #[error("method not allowed; this route accepts {0}")]
    MethodNotAllowed(&'static str),
    /// 413: the body is over the limit, in bytes.
    #[error("request body is larger than {0} bytes")]
    PayloadTooLarge(usize),
    /// 415: the body is not `application/json`, has no `Content-Type`, or
    /// is compressed (`Content-Encoding`).
    #[error("request body must be uncompressed application/json")]
    UnsupportedMediaType,
    /// 408: the body did not arrive within `server.request_timeout`; the
    /// connection is closed after the answer.
    #[error("the request was not received within the time allowed")]
    RequestTimeout,
    /// 500: anything unexpected. The cause chain is logged; the answer says no more.
    #[error("internal error")]
    Internal(#[source] anyhow::Error),
}

/// Every `error` code the API answers with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum ErrorCode {
    /// 400: the request is malformed.
    InvalidRequest,
    /// 400: the phone number does not parse.
    InvalidPhone,
    /// 400: a login name is longer than 256 characters once normalised
    /// (NFKC can make one character many).
    SubjectTooLong,
    /// 429: a rule refused; see `retry_after_secs` and `rule`.
    RateLimited,
    /// 403: a captcha must be passed first.
    CaptchaRequired,
    /// 403: the phone's region may not receive codes.
    RegionBlocked,
    /// 403: the IP, phone or user is on the block list.
    Blocklisted,
    /// 403: the phone's number range is blocked as a likely SMS pumping target.
    PumpingSuspected,
    /// 401: missing or wrong credentials.
    Unauthorized,
    /// 403: the caller may not do this.
    Forbidden,
    /// 503: the rate-limit store is unavailable.
    StoreUnavailable,
    /// 503: the audit database is unavailable.
    AuditUnavailable,
    /// 503 from `/readyz`: the store, the audit database or the audit
    /// journal is not ready (the admin listener's `/readyz` says which).
    NotReady,
    /// 503: the OpenID provider cannot be reached.
    IdentityProviderUnavailable,
    /// 502: the SMS provider did not accept the message.
    DeliveryFailed,
    /// 404: no such route.
    NotFound,
    /// 405: the route does not take this method.
    MethodNotAllowed,
    /// 413: the body is too large.
    PayloadTooLarge,
    /// 415: the body is not JSON.
    UnsupportedMediaType,
    /// 408: the request did not arrive in time (`server.request_timeout`).
    RequestTimeout,
    /// `/metrics` only: no metrics recorder could be installed.
    MetricsUnavailable,
    /// 500: something unexpected; details are only in the log.
    InternalError,
}

/// The body of every error answer: `error` and `message`, plus
/// `retry_after_secs` and `rule` on `rate_limited` and `captcha_required: true`
/// on `captcha_required`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, ToSchema)]
#[schema(
    as = Error,
    example = json!({"error": "rate_limited", "message": "too many requests (phone 5/1h)", "retry_after_secs": 1800, "rule": "phone 5/1h"})
)]
pub struct ErrorBody {
    /// Machine-readable error code.
    pub error: ErrorCode,
    /// Human-readable text; not meant for parsing.
    pub message: String,
    /// `rate_limited` only: whole seconds until a retry can pass (also the `Retry-After` header).
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false, minimum = 1, example = 1800)]
    pub retry_after_secs: Option<u64>,
    /// `rate_limited` only: the rule that denied, `<subject kind> <limit>/<window>`.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false, example = "phone 5/1h")]
    pub rule: Option<String>,
    /// `captcha_required` only: always `true`.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    pub captcha_required: Option<bool>,
    /// `delivery_failed` only: `true` when the provider refused to text this
    /// number (ask the user to check it: a resend counts against the address).
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    pub number_refused: Option<bool>,
    /// `delivery_failed` only: `true` when the provider took the message and
    /// did not answer in time. It may still arrive, and its code verifies
    /// then; the send counted, so a resend meets the phone's windows.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    pub may_arrive: Option<bool>,
}

impl ErrorBody {
    /// A body with only `error` and `message`.
    pub fn new(error: ErrorCode, message: impl Into<String>) -> Self {
        Self {
            error,
            message: message.into(),
            retry_after_secs: None,
            rule: None,
            captcha_required: None,
            number_refused: None,
            may_arrive: None,
        }
    }
}

impl ApiError {
    /// The `error` code of the answer.
    pub fn code(&self) -> ErrorCode {
        match self {
            ApiError::InvalidRequest(_) => ErrorCode::InvalidRequest,
            ApiError::InvalidPhone(_) => ErrorCode::InvalidPhone,
            ApiError::SubjectTooLong(_) => ErrorCode::SubjectTooLong,
            ApiError::RateLimited { .. } => ErrorCode::RateLimited,
            ApiError::CaptchaRequired => ErrorCode::CaptchaRequired,
            ApiError::RegionBlocked => ErrorCode::RegionBlocked,
            ApiError::Blocklisted(_) => ErrorCode::Blocklisted,
            ApiError::PumpingSuspected => ErrorCode::PumpingSuspected,
            ApiError::Unauthorized => ErrorCode::Unauthorized,
            ApiError::Forbidden(_) => ErrorCode::Forbidden,
            ApiError::StoreUnavailable(_) | ApiError::UnblockedStateUnread(_) => {
                ErrorCode::StoreUnavailable
            }
            ApiError::AuditUnavailable => ErrorCode::AuditUnavailable,
            ApiError::IdentityProviderUnavailable => ErrorCode::IdentityProviderUnavailable,
            ApiError::DeliveryFailed { .. } => ErrorCode::DeliveryFailed,
            ApiError::NotFound | ApiError::NotCounted(_) => ErrorCode::NotFound,
            ApiError::MethodNotAllowed(_) => ErrorCode::MethodNotAllowed,
            ApiError::PayloadTooLarge(_) => ErrorCode::PayloadTooLarge,
            ApiError::UnsupportedMediaType => ErrorCode::UnsupportedMediaType,
            ApiError::RequestTimeout => ErrorCode::RequestTimeout,
            ApiError::Internal(_) => ErrorCode::InternalError,
        }
    }
}

impl ResponseError for ApiError {
    fn status_code(&self) -> StatusCode {
        match self {
            ApiError::InvalidRequest(_)
            | ApiError::InvalidPhone(_)
            | ApiError::SubjectTooLong(_) => StatusCode::BAD_REQUEST,
            ApiError::RateLimited { .. } => StatusCode::TOO_MANY_REQUESTS,
            ApiError::CaptchaRequired
            | ApiError::RegionBlocked
            | ApiError::Blocklisted(_)
            | ApiError::PumpingSuspected
            | ApiError::Forbidden(_) => StatusCode::FORBIDDEN,
            ApiError::Unauthorized => StatusCode::UNAUTHORIZED,
            ApiError::StoreUnavailable(_)
            | ApiError::UnblockedStateUnread(_)
            | ApiError::AuditUnavailable
            | ApiError::IdentityProviderUnavailable => StatusCode::SERVICE_UNAVAILABLE,
            ApiError::DeliveryFailed { .. } => StatusCode::BAD_GATEWAY,
            ApiError::NotFound | ApiError::NotCounted(_) => StatusCode::NOT_FOUND,
            ApiError::MethodNotAllowed(_) => StatusCode::METHOD_NOT_ALLOWED,
            ApiError::PayloadTooLarge(_) => StatusCode::PAYLOAD_TOO_LARGE,
            ApiError::UnsupportedMediaType => StatusCode::UNSUPPORTED_MEDIA_TYPE,
            ApiError::RequestTimeout => StatusCode::REQUEST_TIMEOUT,
            ApiError::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    fn error_response(&self) -> HttpResponse {
        let status = self.status_code();
        let mut body = ErrorBody::new(self.code(), self.to_string());
        let mut response = HttpResponse::build(status);
        match self {
            ApiError::RateLimited {
                rule,
                retry_after_ms,
            } => {
                let secs = ceil_secs(*retry_after_ms).max(1);
                body.retry_after_secs = Some(secs);
                body.rule = Some(rule.clone());
                response.insert_header((header::RETRY_AFTER, secs.to_string()));
            }
            ApiError::MethodNotAllowed(allowed) => {
                response.insert_header((header::ALLOW, *allowed));
            }
            ApiError::CaptchaRequired => body.captcha_required = Some(true),
            ApiError::DeliveryFailed {
                number_refused,
                may_arrive,
            } => {
                body.number_refused = number_refused.then_some(true);
                body.may_arrive = may_arrive.then_some(true);
            }
            ApiError::Unauthorized => {
                response.insert_header((header::WWW_AUTHENTICATE, "Bearer"));
            }
            // The rest of the body may still be on its way: nothing after it
            // on this connection could be read as a request.
            ApiError::RequestTimeout => {
                response.force_close();
            }
            ApiError::StoreUnavailable(cause) => {
                tracing::error!(request_id = %crate::telemetry::request_id(), error = %cause, "store unavailable, failing closed");
            }
            ApiError::UnblockedStateUnread(cause) => {
                tracing::error!(request_id = %crate::telemetry::request_id(), error = %cause, "unblocked, but the state after it could not be read");
            }
            ApiError::Internal(cause) => {
                tracing::error!(request_id = %crate::telemetry::request_id(), error = ?cause, "internal error");
            }
            _ => {}
        }
        response.json(body)
    }
}

/// A missing phone is a malformed request; any other a bad number.
impl From<ParamError> for ApiError {
    fn from(e: ParamError) -> Self {
        ApiError::InvalidRequest(e.to_string())
    }
}

impl From<SubjectError> for ApiError {
    fn from(e: SubjectError) -> Self {
        match e {
            SubjectError::Phone(phone) => phone.into(),
            SubjectError::User(user) => user.into(),
            other => ApiError::InvalidRequest(other.to_string()),
        }
    }
}

impl From<PhoneError> for ApiError {
    fn from(e: PhoneError) -> Self {
        match e {
            PhoneError::Empty => ApiError::InvalidRequest(e.to_string()),
            other => ApiError::InvalidPhone(other.to_string()),
        }
    }
}

/// A name too long once normalised has its own code; the rest are malformed.
impl From<UsernameError> for ApiError {
    fn from(e: UsernameError) -> Self {
        match e {
            UsernameError::TooLongNormalised => ApiError::SubjectTooLong(e.to_string()),
            other => ApiError::InvalidRequest(other.to_string()),
        }
    }
}

impl From<StoreError> for ApiError {
    fn from(e: StoreError) -> Self {
        ApiError::StoreUnavailable(e)
    }
}

impl From<UnblockError> for ApiError {
    fn from(e: UnblockError) -> Self {
        match e {
            UnblockError::CountsNothing(why) => ApiError::NotCounted(why),
            UnblockError::Store(e) => e.into(),
        }
    }
}

impl From<LoginRefusal> for ApiError {
    fn from(refusal: LoginRefusal) -> Self {
        match refusal {
            LoginRefusal::Blocklisted(kind) => ApiError::Blocklisted(kind.as_str()),
            LoginRefusal::Store(e) => ApiError::StoreUnavailable(e),
        }
    }
}

impl From<SmsRefusal> for ApiError {
    fn from(refusal: SmsRefusal) -> Self {
        match refusal {
            SmsRefusal::RegionBlocked { .. } => ApiError::RegionBlocked,
            SmsRefusal::Blocklisted(kind) => ApiError::Blocklisted(kind.as_str()),
            SmsRefusal::CaptchaRequired => ApiError::CaptchaRequired,
            SmsRefusal::PumpingSuspected => ApiError::PumpingSuspected,
            SmsRefusal::RateLimited {
                rule,
                retry_after_ms,
            } => ApiError::RateLimited {
                rule,
                retry_after_ms,
            },
            SmsRefusal::DeliveryFailed(cause) => {
                tracing::warn!(request_id = %crate::telemetry::request_id(), error = %cause, "sms delivery failed");
                ApiError::DeliveryFailed {
                    number_refused: cause.refused_the_number(),
                    may_arrive: cause.may_have_been_delivered(),
                }
            }
            SmsRefusal::Store(e) => ApiError::StoreUnavailable(e),
        }
    }
}
