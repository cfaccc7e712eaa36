//! The API key, checked before the body is read. A handler takes
//! [`BackendKey`] or [`PublicKey`] before its `json::Body`: actix polls a
//! handler's extractors in order and answers the first error, so a caller
//! with a wrong key or none is answered 401 whatever it sent (and, with no
//! keys configured, a caller of `/login/*` that is not the backend 403). It
//! learns nothing of the body's schema (no 400 naming a field), and its
//! body is neither waited for nor parsed.

use std::future::{ready, Ready};

use actix_web::dev::Payload;
use actix_web::{web, FromRequest, HttpRequest};

use super::caller::{Access, KeyCheck};
use super::AppState;
use crate::error::ApiError;

/// `/login/*`: the login backend's routes, never a browser's: without keys
/// configured, a call straight from loopback (`Access::check_backend`).
/// It hands the handler the application state it looked up to check the
/// key, so that the handler does not look it up again.
pub struct BackendKey {
    pub state: web::Data<AppState>,
    pub key: KeyCheck,
}

/// `/sms/send` and `/sms/verify`: with `server.keyless_sms`, a browser's
/// request without `Authorization` passes as [`KeyCheck::Keyless`]. With
/// the application state, as [`BackendKey`].
pub struct PublicKey {
    pub state: web::Data<AppState>,
    pub key: KeyCheck,
}

/// The application state and what `check` says of the request's key.
fn checked(
    req: &HttpRequest,
    check: impl FnOnce(&Access) -> Result<KeyCheck, ApiError>,
) -> Result<(web::Data<AppState>, KeyCheck), ApiError> {
    let state = req
        .app_data::<web::Data<AppState>>()
        .ok_or_else(|| ApiError::Internal(anyhow::anyhow!("no application state")))?;
    let key = check(&state.access)?;
    Ok((state.clone(), key))
}

impl FromRequest for BackendKey {
    type Error = ApiError;
    type Future = Ready<Result<Self, ApiError>>;

    fn from_request(req: &HttpRequest, _: &mut Payload) -> Self::Future {
        ready(checked(req, |a| a.check_backend(req)).map(|(state, key)| Self { state, key }))
    }
}

impl FromRequest for PublicKey {
    type Error = ApiError;
    type Future = Ready<Result<Self, ApiError>>;

    fn from_request(req: &HttpRequest, _: &mut Payload) -> Self::Future {
        ready(checked(req, |a| a.check_key(req, true)).map(|(state, key)| Self { state, key }))
    }
}
