//! A request id per request, taken from `x-request-id` (when it is a sane
//! token) or made up, echoed in the response and named by the lines the
//! request logs (a span per request at `debug`).

use std::time::Instant;

use actix_web::body::MessageBody;
use actix_web::dev::{ServiceRequest, ServiceResponse};
use actix_web::http::header::{HeaderName, HeaderValue};
use actix_web::middleware::Next;
use actix_web::HttpMessage;
use tracing::Instrument;

/// The request's id, in the request's extensions for handlers to read.
#[derive(Debug, Clone)]
pub struct RequestId(pub String);

const HEADER: HeaderName = HeaderName::from_static("x-request-id");

fn incoming(req: &ServiceRequest) -> Option<String> {
    let value = req.headers().get(&HEADER)?.to_str().ok()?;
    let sane = !value.is_empty()
        && value.len() <= 128
        && value
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_.:".contains(&b));
    sane.then(|| value.to_string())
}

/// Take the request's id or make one, run the request in its span and
/// with it as the task's id, and echo it in `x-request-id`.
pub async fn middleware(
    req: ServiceRequest,
    next: Next<impl MessageBody>,
) -> Result<ServiceResponse<impl MessageBody>, actix_web::Error> {
    let id = incoming(&req).unwrap_or_else(|| uuid::Uuid::now_v7().to_string());
    req.extensions_mut().insert(RequestId(id.clone()));
    // The id is a task-local that request-path log lines name (see
    // `telemetry`); the span and the line per request are at debug level, so
    // the default level formats nothing for a request that goes well. The line
    // names the route pattern, never the path (a path can hold a phone number).
    let span = tracing::debug_span!("request", request_id = %id);
    let started = Instant::now();
    let mut response =
        crate::telemetry::with_request_id(id.clone(), next.call(req).instrument(span.clone()))
            .await?;
    if let Ok(value) = HeaderValue::from_str(&id) {
        response.headers_mut().insert(HEADER, value);
    }
    if tracing::enabled!(tracing::Level::DEBUG) {
        span.in_scope(|| {
            tracing::debug!(
                method = %response.request().method(),
                route = response.request().match_pattern().as_deref().unwrap_or("-"),
                status = response.status().as_u16(),
                elapsed_us = started.elapsed().as_micros() as u64,
                "request done"
            )
        });
    }
    Ok(response)
}
