//! CORS for the routes browsers call directly (`/sms/send`, `/sms/verify`):
//! the origins of `server.cors_origins` may call them, preflights are
//! answered, and no credentials are ever allowed (the API takes none a
//! browser would send), so `*` is safe where it is configured.

use actix_cors::{Cors, CorsError};
use actix_web::body::{EitherBody, MessageBody};
use actix_web::dev::{ServiceRequest, ServiceResponse};
use actix_web::http::header;
use actix_web::middleware::{Condition, Next};
use actix_web::ResponseError;

use crate::error::ApiError;

/// The origins allowed to call the browser-facing routes.
#[derive(Debug, Clone, Default)]
pub struct CorsOrigins(Vec<String>);

impl CorsOrigins {
    /// `origins` as `server.cors_origins` gives them (checked at start-up).
    pub fn new(origins: &[String]) -> Self {
        Self(origins.to_vec())
    }

    /// Whether any origin is configured (CORS is on).
    pub fn enabled(&self) -> bool {
        !self.0.is_empty()
    }

    /// The middleware for one resource: none without configured origins,
    /// so that nothing changes for callers that are not browsers.
    pub fn middleware(&self) -> Condition<Cors> {
        let mut cors = Cors::default()
            .allowed_methods(["POST"])
            .allowed_headers([header::CONTENT_TYPE, header::AUTHORIZATION])
            .expose_headers([
                header::RETRY_AFTER,
                header::HeaderName::from_static("ratelimit"),
                header::HeaderName::from_static("ratelimit-policy"),
            ])
            .max_age(600);
        for origin in &self.0 {
            cors = if origin == "*" {
                cors.allow_any_origin().send_wildcard()
            } else {
                cors.allowed_origin(origin)
            };
        }
        Condition::new(self.enabled(), cors)
    }
}

/// actix-cors answers a refused preflight or origin itself, 400 in plain
/// text; the API's errors are JSON (`{error, message}`) everywhere, so such
/// an answer becomes the 400 `invalid_request` naming the CORS error, with
/// the headers actix-cors set (`Vary`) kept.
pub async fn json_refusals(
    req: ServiceRequest,
    next: Next<impl MessageBody>,
) -> Result<ServiceResponse<EitherBody<impl MessageBody>>, actix_web::Error> {
    let res = next.call(req).await?;
    let refusal = res
        .response()
        .error()
        .and_then(|e| e.as_error::<CorsError>())
        .map(|cors| ApiError::InvalidRequest(format!("CORS: {cors}")));
    let Some(refusal) = refusal else {
        return Ok(res.map_into_left_body());
    };
    let headers = res.headers().clone();
    Ok(res
        .into_response(refusal.error_response())
        .map_body(|head, body| {
            for (name, value) in headers.iter() {
                if !head.headers.contains_key(name) {
                    head.headers.insert(name.clone(), value.clone());
                }
            }
            body
        })
        .map_into_right_body())
}
