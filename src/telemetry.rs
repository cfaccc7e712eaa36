//! Logging: JSON lines when stderr is not a terminal (production), readable
//! lines on a terminal. `RUST_LOG` filters, `info` by default.
//!
//! actix-http logs a malformed request (a header with a NUL byte, say) at
//! ERROR from `actix_http::h1::dispatcher`, after answering it 400: a
//! client's mistake, which anyone could use to fill the log with errors. That
//! target is off unless `RUST_LOG` names `actix_http`.
//!
//! The request id: each request runs inside [`with_request_id`], and the
//! lines a request logs at `info` and above name it with
//! `request_id = %telemetry::request_id()`. At `debug` each request also gets
//! a span, `request`, from `tracing-actix-web`'s `TracingLogger` and
//! [`RequestSpan`]: its id, method, route pattern and status, which every
//! line it logs carries (and `routes::http_metrics` logs `request done` in
//! it). A span per request at the default level cost about a tenth of the
//! in-process store's throughput (the registry entry and its fields
//! formatted as JSON), for lines that are rarely written; the task-local
//! costs nothing measurable, and a disabled span only a level check.

use std::io::IsTerminal;

use actix_web::body::MessageBody;
use actix_web::dev::{ServiceRequest, ServiceResponse};
use actix_web::HttpMessage;
use tracing::Span;
use tracing_actix_web::RootSpanBuilder;
use tracing_subscriber::{fmt, EnvFilter};

use crate::routes::request_id::RequestId;

/// Install the global subscriber, writing to stderr; a second call keeps the
/// first one.
pub fn init() {
    let given = std::env::var("RUST_LOG").unwrap_or_default();
    let mut filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    if !given.contains("actix_http") {
        if let Ok(quiet) = "actix_http::h1::dispatcher=off".parse() {
            filter = filter.add_directive(quiet);
        }
    }
    let builder = fmt().with_env_filter(filter).with_writer(std::io::stderr);
    let result = if std::io::stderr().is_terminal() {
        builder.try_init()
    } else {
        builder
            .json()
            .flatten_event(true)
            .with_current_span(true)
            .with_span_list(false)
            .try_init()
    };
    // A second init (tests start several apps) keeps the first subscriber.
    let _ = result;
}

tokio::task_local! {
    static REQUEST_ID: String;
}

/// Run `request` with `id` as the request id that [`request_id`] answers.
pub async fn with_request_id<F: std::future::Future>(id: String, request: F) -> F::Output {
    REQUEST_ID.scope(id, request).await
}

/// The id of the request being served on this task, or `-` outside one.
pub fn request_id() -> RequestIdField {
    RequestIdField(REQUEST_ID.try_with(Clone::clone).ok())
}

/// Displays as the request id (or `-`), for a log line's `request_id` field.
pub struct RequestIdField(Option<String>);

impl std::fmt::Display for RequestIdField {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.0.as_deref().unwrap_or("-"))
    }
}

/// The span `TracingLogger` opens per request, at `debug`: the request id
/// (`routes::request_id`), the method, the route pattern (never the path,
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
            route = request.match_pattern().as_deref().unwrap_or(crate::routes::http_metrics::UNMATCHED),
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
