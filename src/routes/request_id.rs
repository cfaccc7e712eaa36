//! A request id per request, taken from `x-request-id` (when it is a sane
//! token) or made up, echoed in the response and named by the lines the
//! request logs (and by its span, `telemetry::RequestSpan`).

use actix_web::body::MessageBody;
use actix_web::dev::{ServiceRequest, ServiceResponse};
use actix_web::http::header::{HeaderName, HeaderValue};
use actix_web::middleware::Next;
use actix_web::HttpMessage;

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
