//! The API key, checked before the body is read. A handler takes
//! [`BackendKey`] or [`PublicKey`] before its `json::Body`: actix polls a
//! handler's extractors in order and answers the first error, so a caller
//! with a wrong key or none is answered 401 whatever it sent. It learns
//! nothing of the body's schema (no 400 naming a field), and its body is
//! neither waited for nor parsed.

use std::future::{ready, Ready};

use actix_web::dev::Payload;
use actix_web::{web, FromRequest, HttpRequest};

use super::caller::KeyCheck;
use super::AppState;
use crate::error::ApiError;

/// `/login/*`: the login backend's routes, never a keyless browser's.
pub struct BackendKey(pub KeyCheck);

/// `/sms/send` and `/sms/verify`: with `server.keyless_sms`, a browser's
/// request without `Authorization` passes as [`KeyCheck::Keyless`].
pub struct PublicKey(pub KeyCheck);

fn check(req: &HttpRequest, keyless: bool) -> Result<KeyCheck, ApiError> {
    let state = req
        .app_data::<web::Data<AppState>>()
        .ok_or_else(|| ApiError::Internal(anyhow::anyhow!("no application state")))?;
    state.access.check_key(req, keyless)
}

impl FromRequest for BackendKey {
    type Error = ApiError;
    type Future = Ready<Result<Self, ApiError>>;

    fn from_request(req: &HttpRequest, _: &mut Payload) -> Self::Future {
        ready(check(req, false).map(Self))
    }
}

impl FromRequest for PublicKey {
    type Error = ApiError;
    type Future = Ready<Result<Self, ApiError>>;

    fn from_request(req: &HttpRequest, _: &mut Payload) -> Self::Future {
        ready(check(req, true).map(Self))
    }
}
