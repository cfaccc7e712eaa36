//! Logging: JSON lines when stderr is not a terminal (production), readable
//! lines on a terminal. `RUST_LOG` filters, `info` by default.
//!
//! actix-http logs a malformed request (a header with a NUL byte, say) at
//! ERROR from `actix_http::h1::dispatcher`, after answering it 400: a
//! client's mistake, which anyone could use to fill the log with errors. That
//! target is off unless `RUST_LOG` names `actix_http`.
//!
//! The request id: each request runs inside [`scope_request_id`], and the
//! lines a request logs at `info` and above name it with
//! `request_id = %telemetry::request_id()`. At `debug` each request also gets
//! a span, `request`, from `routes::request_id`: its id, method, route
//! pattern and status, which every
//! line it logs carries (and `routes::http_metrics` logs `request done` in
//! it). A span per request at the default level cost about a tenth of the
//! in-process store's throughput (the registry entry and its fields
//! formatted as JSON), for lines that are rarely written; the task-local
//! costs nothing measurable, and a disabled span only a level check.

pub mod log_budget;

use std::io::IsTerminal;

use tracing_subscriber::{fmt, EnvFilter};

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

/// `request`, run with `id` as the request id that [`request_id`] answers.
pub fn scope_request_id<F: std::future::Future>(
    id: String,
    request: F,
) -> tokio::task::futures::TaskLocalFuture<String, F> {
    REQUEST_ID.scope(id, request)
}

/// The id of the request being served on this task, or `-` outside one.
pub fn request_id() -> RequestIdField {
    RequestIdField(current_request_id())
}

/// The id of the request being served on this task, if any.
pub fn current_request_id() -> Option<String> {
    REQUEST_ID.try_with(Clone::clone).ok()
}

/// Displays as the request id (or `-`), for a log line's `request_id` field.
pub struct RequestIdField(Option<String>);

impl std::fmt::Display for RequestIdField {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.0.as_deref().unwrap_or("-"))
    }
}
