//! A request id per request, taken from `x-request-id` (when it is a sane
//! token) or made up, echoed in the response and named by the lines the
//! request logs, the request's span (at `debug`), opened here too, its
//! timing (`http_metrics::Timing`) and its body deadline
//! (`connections::deadline`): one middleware layer for the four.
//! `tracing-actix-web`'s `TracingLogger` did the span as a layer of its own,
//! with a second, unused request id (a UUID made per request): about 2 % of
//! a login's instructions; the timing's and the deadline's own layers some
//! 300 more each.

use actix_web::body::{EitherBody, MessageBody};
use actix_web::dev::{ServiceRequest, ServiceResponse};
use actix_web::http::header::{HeaderName, HeaderValue};
use actix_web::middleware::Next;
use actix_web::HttpMessage;
use tracing::{Instrument, Span};

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

/// A fresh id: a UUIDv7, hyphenated, written straight into its string
/// (`to_string` goes through the formatting machinery, some 800
/// instructions a request).
fn new_id() -> String {
    let mut buf = uuid::Uuid::encode_buffer();
    crate::uuid_v7::now()
        .hyphenated()
        .encode_lower(&mut buf)
        .to_owned()
}

/// Take the request's id or make one, run the request with it as the
/// task's id inside the request's span, its body bounded by the
/// connection's deadline, and echo the id in `x-request-id`.
pub async fn middleware<B: MessageBody + 'static>(
    mut req: ServiceRequest,
    next: Next<B>,
) -> Result<ServiceResponse<EitherBody<B>>, actix_web::Error> {
    let id = incoming(&req).unwrap_or_else(new_id);
    let span = request_span(&req, &id);
    let timing = super::http_metrics::Timing::start(&req);
    let deadline = crate::connections::deadline::enter(&mut req);
    // The header is made before the id moves into the task's scope: one
    // copy for the extensions, none more.
    let header = HeaderValue::from_str(&id).ok();
    req.extensions_mut().insert(RequestId(id.clone()));
    // The id is a task-local that request-path log lines name (see
    // `telemetry`), whatever the level.
    let outcome = crate::telemetry::with_request_id(id, next.call(req))
        .instrument(span.clone())
        .await;
    // The 408 of a body out of time is the answer timed, logged and echoed.
    let outcome = crate::connections::deadline::leave(deadline, outcome);
    span.in_scope(|| timing.finish(&outcome));
    record_status(&span, &outcome);
    let mut response = outcome?;
    if let Some(value) = header {
        response.headers_mut().insert(HEADER, value);
    }
    Ok(response)
}

/// The span of a request, at `debug`: its id, the method, the route
/// pattern (never the path, which can hold a phone number or a user name)
/// and, at the end, the status. Nothing else of the request: no address, no
/// body. The fields are computed only when the span is enabled.
fn request_span(request: &ServiceRequest, id: &str) -> Span {
    tracing::debug_span!(
        "request",
        request_id = %id,
        method = %request.method(),
        route = request.match_pattern().as_deref().unwrap_or(super::http_metrics::UNMATCHED),
        status = tracing::field::Empty,
    )
}

fn record_status<B>(span: &Span, outcome: &Result<ServiceResponse<B>, actix_web::Error>) {
    if span.is_disabled() {
        return;
    }
    let status = match outcome {
        Ok(response) => response.status(),
        Err(error) => error.as_response_error().status_code(),
    };
    span.record("status", status.as_u16());
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_new_id_is_a_hyphenated_uuid_v7() {
        let id = new_id();
        let parsed = uuid::Uuid::parse_str(&id).expect("a UUID");
        assert_eq!(parsed.get_version_num(), 7);
        assert_eq!(id, parsed.hyphenated().to_string());
        assert_ne!(new_id(), id);
    }
}
