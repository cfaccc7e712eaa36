//! A request id per request, taken from `x-request-id` (when it is a sane
//! token) or made up, echoed in the response and named by the lines the
//! request logs, the request's span (at `debug`), opened here too, its
//! timing (`http_metrics::Timing`) and its body deadline
//! (`connections::deadline`): one middleware layer for the four.
//! `tracing-actix-web`'s `TracingLogger` did the span as a layer of its own,
//! with a second, unused request id (a UUID made per request): about 2 % of
//! a login's instructions; the timing's and the deadline's own layers some
//! 300 more each.

use std::future::{ready, Future, Ready};
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use actix_web::body::{EitherBody, MessageBody};
use actix_web::dev::{forward_ready, Service, ServiceRequest, ServiceResponse, Transform};
use actix_web::http::header::{HeaderName, HeaderValue};
use pin_project_lite::pin_project;
use tokio::task::futures::TaskLocalFuture;
use tracing::instrument::Instrumented;
use tracing::{Instrument, Span};

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

/// The layer: wraps every route of a listener (`startup::listeners`).
///
/// Written by hand, not with actix's `from_fn`: that boxes the service it
/// wraps, so that every request's call below it was one more boxed future
/// and `Rc` clone; here the answer is a named future, [`Answer`], with the
/// inner service's own future inside it.
pub struct RequestIdLayer;

impl<S, B> Transform<S, ServiceRequest> for RequestIdLayer
where
    S: Service<ServiceRequest, Response = ServiceResponse<B>, Error = actix_web::Error>,
    B: MessageBody + 'static,
{
    type Response = ServiceResponse<EitherBody<B>>;
    type Error = actix_web::Error;
    type Transform = RequestIdService<S>;
    type InitError = ();
    type Future = Ready<Result<Self::Transform, Self::InitError>>;

    fn new_transform(&self, service: S) -> Self::Future {
        ready(Ok(RequestIdService { service }))
    }
}

/// [`RequestIdLayer`] around the service `S`.
pub struct RequestIdService<S> {
    service: S,
}

impl<S, B> Service<ServiceRequest> for RequestIdService<S>
where
    S: Service<ServiceRequest, Response = ServiceResponse<B>, Error = actix_web::Error>,
    B: MessageBody + 'static,
{
    type Response = ServiceResponse<EitherBody<B>>;
    type Error = actix_web::Error;
    type Future = Answer<S::Future>;

    forward_ready!(service);

    /// Take the request's id or make one, run the request with it as the
    /// task's id inside the request's span, its body bounded by the
    /// connection's deadline; [`Answer`] echoes the id in `x-request-id`.
    fn call(&self, mut req: ServiceRequest) -> Self::Future {
        let id = incoming(&req).unwrap_or_else(new_id);
        let span = request_span(&req, &id);
        let timing = super::http_metrics::Timing::start(&req);
        let deadline = crate::connections::deadline::enter(&mut req);
        // The header is made before the id moves into the task's scope.
        let header = HeaderValue::from_str(&id).ok();
        // The id is a task-local that request-path log lines name (see
        // `telemetry`), whatever the level, and audit rows copy
        // (`routes::caller`): not also a request extension, whose box and
        // map entry every request paid for.
        let inner =
            crate::telemetry::scope_request_id(id, self.service.call(req)).instrument(span.clone());
        Answer {
            inner,
            span,
            after: Some(After {
                timing,
                deadline,
                header,
            }),
        }
    }
}

/// What the answer needs once the inner service has answered.
struct After {
    timing: super::http_metrics::Timing,
    deadline: Option<crate::connections::deadline::Entered>,
    header: Option<HeaderValue>,
}

pin_project! {
    /// The answer of [`RequestIdService`]: the inner service's, timed,
    /// bounded by the body deadline, its status on the span and the id
    /// echoed.
    pub struct Answer<F> {
        #[pin]
        inner: Instrumented<TaskLocalFuture<String, F>>,
        span: Span,
        after: Option<After>,
    }
}

impl<F, B> Future for Answer<F>
where
    F: Future<Output = Result<ServiceResponse<B>, actix_web::Error>>,
    B: MessageBody + 'static,
{
    type Output = Result<ServiceResponse<EitherBody<B>>, actix_web::Error>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        // Polled again after its answer: a bug of the caller's, which gets
        // an error rather than the panic of polling the inner future again.
        if this.after.is_none() {
            return Poll::Ready(Err(polled_after_answer()));
        }
        let outcome = ready!(this.inner.poll(cx));
        let Some(After {
            timing,
            deadline,
            header,
        }) = this.after.take()
        else {
            return Poll::Ready(Err(polled_after_answer()));
        };
        // The 408 of a body out of time is the answer timed, logged and echoed.
        let outcome = crate::connections::deadline::leave(deadline, outcome);
        this.span.in_scope(|| timing.finish(&outcome));
        record_status(this.span, &outcome);
        let mut response = outcome?;
        if let Some(value) = header {
            response.headers_mut().insert(HEADER, value);
        }
        Poll::Ready(Ok(response))
    }
}

fn polled_after_answer() -> actix_web::Error {
    actix_web::error::ErrorInternalServerError("request-id layer polled after its answer")
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
