//! A console form's body: read as actix reads `web::Bytes` (the route's
//! `PayloadConfig` limit), but a body over the limit, or one that breaks
//! off, answers the console's HTML error page, not actix's plain text.

use actix_web::dev::Payload;
use actix_web::error::{InternalError, PayloadError};
use actix_web::web::Bytes;
use actix_web::{FromRequest, HttpRequest};
use futures::future::LocalBoxFuture;

use super::super::pages::Refusal;
use super::FORM_LIMIT;
use crate::error::ApiError;

/// The body of a console form post.
pub(in crate::routes::admin) struct FormBody(pub Bytes);

impl FromRequest for FormBody {
    type Error = actix_web::Error;
    type Future = LocalBoxFuture<'static, Result<Self, Self::Error>>;

    fn from_request(req: &HttpRequest, payload: &mut Payload) -> Self::Future {
        let read = Bytes::from_request(req, payload);
        let req = req.clone();
        Box::pin(async move {
            read.await.map(FormBody).map_err(|e| {
                let refusal = match e.as_error::<PayloadError>() {
                    Some(PayloadError::Overflow) => ApiError::PayloadTooLarge(FORM_LIMIT),
                    _ => ApiError::InvalidRequest("the form's body could not be read".into()),
                };
                let page = Refusal::Api(refusal).page(&req);
                InternalError::from_response(e, page).into()
            })
        })
    }
}
