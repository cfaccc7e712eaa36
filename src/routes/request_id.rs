//! A request id per request, taken from `x-request-id` (when it is a sane
//! token) or made up, echoed in the response and named by the lines the
//! request logs (and by its span, [`RequestSpan`]).

use actix_web::body::MessageBody;
use actix_web::dev::{ServiceRequest, ServiceResponse};
use actix_web::http::header::{HeaderName, HeaderValue};
use actix_web::middleware::Next;
use actix_web::HttpMessage;
use tracing::Span;
use tracing_actix_web::RootSpanBuilder;

/// The request's id, in the request's extensions for handlers (and the
/// request span) to read. `tracing_actix_web::RequestId`, which its
/// middleware also makes, is a different, unused value.
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

/// Take the request's id or make one, run the request with it as the
/// task's id, and echo it in `x-request-id`. Runs outside the request span,
/// which reads the id from the extensions.
pub async fn middleware(
    req: ServiceRequest,
    next: Next<impl MessageBody>,
) -> Result<ServiceResponse<impl MessageBody>, actix_web::Error> {
    let id = incoming(&req).unwrap_or_else(|| uuid::Uuid::now_v7().to_string());
    req.extensions_mut().insert(RequestId(id.clone()));
    // The id is a task-local that request-path log lines name (see
    // `telemetry`), whatever the level.
    let mut response = crate::telemetry::with_request_id(id.clone(), next.call(req)).await?;
    if let Ok(value) = HeaderValue::from_str(&id) {
        response.headers_mut().insert(HEADER, value);
    }
    Ok(response)
}

/// The span `TracingLogger` opens per request, at `debug`: the request id
/// ([`RequestId`]), the method, the route pattern (never the path,
/// which can hold a phone number or a user name) and, at the end, the
/// status. Nothing else of the request: no address, no body.
pub struct RequestSpan;

impl RootSpanBuilder for RequestSpan {
    fn on_request_start(request: &ServiceRequest) -> Span {
        // The fields are computed only when the span is enabled.
        tracing::debug_span!(
            "request",
            request_id = %request
                .extensions()
                .get::<RequestId>()
                .map_or("-", |id| id.0.as_str()),
            method = %request.method(),
            route = request.match_pattern().as_deref().unwrap_or(super::http_metrics::UNMATCHED),
            status = tracing::field::Empty,
        )
    }

    fn on_request_end<B: MessageBody>(
        span: Span,
        outcome: &Result<ServiceResponse<B>, actix_web::Error>,
    ) {
        let status = match outcome {
            Ok(response) => response.status(),
            Err(error) => error.as_response_error().status_code(),
        };
        span.record("status", status.as_u16());
    }
}
