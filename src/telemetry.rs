//! Logging: JSON lines when stdout is not a terminal (production), readable
//! lines on a terminal. `RUST_LOG` filters, `info` by default.

use std::io::IsTerminal;

use tracing_subscriber::{fmt, EnvFilter};

pub fn init() {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
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
