//! The audit trail's seam: guards build typed [`AuditEvent`]s and hand them to
//! an [`AuditSink`], which must never block the request.

mod event;
mod sinks;

pub use event::{AuditDecision, AuditEvent};
pub use sinks::{CapturingSink, LogSink};

use async_trait::async_trait;

#[async_trait]
pub trait AuditSink: Send + Sync {
    /// Hand over one event. Never waits for a database.
    fn record(&self, event: AuditEvent);

    /// Wait until every event recorded so far is durable (tests, shutdown).
    async fn flush(&self);
}
