//! JSON bodies: size limit, content type and parse errors all answered as
//! DESIGN.md's JSON errors, never actix's default text. Every JSON body,
//! the public API's and the admin API's, is read by [`Body`].

use std::future::Future;
use std::marker::PhantomData;
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use actix_web::dev::Payload;
use actix_web::http::header::{CONTENT_ENCODING, CONTENT_LENGTH};
use actix_web::web::{Bytes, BytesMut};
use actix_web::{FromRequest, HttpRequest};
use futures::future::{ready, Either, Ready};
use futures::Stream;
use serde::de::DeserializeOwned;

use super::BODY_LIMIT;
use crate::error::ApiError;

/// The JSON body of a POST route. A body that does
/// not say `application/json` (parameters such as `charset` allowed)
/// answers 415 before it is read; one declared or found longer than
/// [`BODY_LIMIT`] 413; one that does not parse 400. actix's extractor alone
/// also takes any `*/json` and `*/*+json` (`text/json`, `image/json`),
/// which no client of this API sends.
///
/// The body is read here rather than by actix's `web::Json`, which parsed
/// the content type again as a media type, looked its `JsonConfig` up,
/// allocated an 8 KiB buffer and wrapped the payload in a decompressor for
/// every request: about 1,500 instructions of a login (callgrind).
///
/// A compressed body (any `Content-Encoding` but `identity`) answers 415
/// unread. actix's decompressor, which inflated each chunk whole before a
/// limit saw it (16 KiB of gzip held some 16 MB and a blocking thread), is
/// no longer built (no `compress-*` feature), so such a body would only
/// fail to parse; the 415 says why. No client of this API compresses a
/// body of a few hundred bytes.
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

impl<T: DeserializeOwned + 'static> FromRequest for Body<T> {
    type Error = actix_web::Error;
    type Future = Either<Ready<Result<Self, actix_web::Error>>, ReadBody<T>>;

    fn from_request(req: &HttpRequest, payload: &mut Payload) -> Self::Future {
        if let Err(refused) = check_media_type(req) {
            return Either::Left(ready(Err(refused.into())));
        }
        // actix-http has checked the header: the payload ends at that length.
        let declared = req
            .headers()
            .get(CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<usize>().ok());
        if declared.is_some_and(|length| length > BODY_LIMIT) {
            return Either::Left(ready(Err(ApiError::PayloadTooLarge(BODY_LIMIT).into())));
        }
        Either::Right(ReadBody {
            payload: payload.take(),
            first: None,
            joined: BytesMut::new(),
            _body: PhantomData,
        })
    }
}

/// Reads a [`Body`]: a body that came in one chunk, as nearly every one
/// does, is parsed where it lies; only a second chunk makes a buffer.
pub struct ReadBody<T> {
    payload: Payload,
    first: Option<Bytes>,
    joined: BytesMut,
    _body: PhantomData<fn() -> T>,
}

impl<T> ReadBody<T> {
    fn take(&mut self, chunk: Bytes) -> Result<(), ApiError> {
        let held = self.first.as_ref().map_or(0, Bytes::len) + self.joined.len();
        if held + chunk.len() > BODY_LIMIT {
            return Err(ApiError::PayloadTooLarge(BODY_LIMIT));
        }
        if held == 0 {
            self.first = Some(chunk);
            return Ok(());
        }
        if let Some(first) = self.first.take() {
            self.joined.extend_from_slice(&first);
        }
        self.joined.extend_from_slice(&chunk);
        Ok(())
    }
}

impl<T: DeserializeOwned> Future for ReadBody<T> {
    type Output = Result<Body<T>, actix_web::Error>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        // Every field is Unpin.
        let this = self.get_mut();
        loop {
            let step = match ready!(Pin::new(&mut this.payload).poll_next(cx)) {
                Some(Ok(chunk)) => this.take(chunk),
                Some(Err(e)) => Err(ApiError::InvalidRequest(format!("unreadable body: {e}"))),
                None => {
                    let body = this.first.as_deref().unwrap_or(&this.joined);
                    let parsed = serde_json::from_slice::<T>(body).map(Body).map_err(|e| {
                        ApiError::InvalidRequest(format!("invalid JSON body: {e}")).into()
                    });
                    return Poll::Ready(parsed);
                }
            };
            if let Err(err) = step {
                return Poll::Ready(Err(err.into()));
            }
        }
    }
}

/// The 415 of [`Body`], before anything is read: a body that is not
/// `application/json`, or is compressed. Also called inside a handler that
/// must authenticate its caller before it says anything about the body,
/// and must then answer 415 before it checks the caller's role.
pub fn check_media_type(req: &HttpRequest) -> Result<(), ApiError> {
    let compressed = req
        .headers()
        .get(CONTENT_ENCODING)
        .is_some_and(|v| !v.as_bytes().eq_ignore_ascii_case(b"identity"));
    if is_application_json(req) && !compressed {
        Ok(())
    } else {
        Err(ApiError::UnsupportedMediaType)
    }
}

/// Whether the media type's essence (before any `;`, white space around
/// it allowed, RFC 9110 §8.3) is `application/json`, in any case. Its
/// parameters are not read: JSON is UTF-8 whatever `charset` says.
fn is_application_json(req: &HttpRequest) -> bool {
    req.headers()
        .get(actix_web::http::header::CONTENT_TYPE)
        .is_some_and(|v| {
            let v = v.as_bytes();
            let essence = v.split(|&b| b == b';').next().unwrap_or(v);
            essence
                .trim_ascii()
                .eq_ignore_ascii_case(b"application/json")
        })
}
