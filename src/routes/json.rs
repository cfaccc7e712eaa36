//! JSON bodies: size limit, content type and parse errors all answered as
//! DESIGN.md's JSON errors, never actix's default text.

use actix_web::dev::Payload;
use actix_web::error::JsonPayloadError;
use actix_web::web::{self, JsonConfig};
use actix_web::{FromRequest, HttpMessage, HttpRequest};
use futures::future::{ready, Either, Ready};
use futures::TryFutureExt;
use serde::de::DeserializeOwned;

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

/// The JSON body of a public POST route (`routes::post`), read by
/// actix's JSON extractor once the content type is checked: a body that
/// does not say `application/json` (parameters such as `charset` allowed)
/// answers 415 before it is read. actix's extractor alone also takes any
/// `*/json` and `*/*+json` (`text/json`, `image/json`), which no client of
/// this API sends.
///
/// The check was a `from_fn` layer on each JSON resource; in the extractor
/// it runs at the same point (the handlers' other arguments cannot fail)
/// without a boxed future and its moves per request.
pub struct Body<T>(pub T);

impl<T> Body<T> {
    pub fn into_inner(self) -> T {
        self.0
    }
}

impl<T> std::ops::Deref for Body<T> {
    type Target = T;

    fn deref(&self) -> &T {
        &self.0
    }
}

type Read<T> =
    futures::future::MapOk<<web::Json<T> as FromRequest>::Future, fn(web::Json<T>) -> Body<T>>;

impl<T: DeserializeOwned + 'static> FromRequest for Body<T> {
    type Error = actix_web::Error;
    type Future = Either<Ready<Result<Self, actix_web::Error>>, Read<T>>;

    fn from_request(req: &HttpRequest, payload: &mut Payload) -> Self::Future {
        if !is_application_json(req) {
            return Either::Left(ready(Err(ApiError::UnsupportedMediaType.into())));
        }
        let read: fn(web::Json<T>) -> Body<T> = |json| Body(json.into_inner());
        Either::Right(web::Json::<T>::from_request(req, payload).map_ok(read))
    }
}

/// The content-type check of [`Body`] inside a handler, for one that must
/// authenticate its caller before it says anything about the body.
pub fn check_application_json(req: &HttpRequest) -> Result<(), ApiError> {
    if is_application_json(req) {
        Ok(())
    } else {
        Err(ApiError::UnsupportedMediaType)
    }
}

fn is_application_json(req: &HttpRequest) -> bool {
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
