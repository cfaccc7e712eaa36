//! The audit trail. Guards build typed [`AuditEvent`]s and hand them to an
//! [`AuditSink`], which never blocks the request; [`DbSink`] makes them durable
//! (queue → batch writer → database, spool on disk while it is down).

pub mod db;
mod event;
mod log;
pub mod query;
pub mod retention;
mod sinks;
pub mod spool;
pub mod stats;
mod writer;

pub use db::{AuditDb, AuditError};
pub use event::{now_ms, rfc3339_ms, AuditDecision, AuditEvent};
pub use log::{AuditLog, Page};
pub use sinks::{CapturingSink, ObservedSink};
pub use writer::{DbSink, SinkConfig};

use async_trait::async_trait;

/// Watches the trail as events are recorded (admin alerts). `observe` runs
/// on the request path: an implementation looks and returns at once.
pub trait AuditObserver: Send + Sync {
    fn observe(&self, event: &AuditEvent);
}

/// Where guards hand their audit events. `record` runs on the request path,
/// so an implementation queues and returns at once.
#[async_trait]
pub trait AuditSink: Send + Sync {
    /// Hand over one event. Never waits for a database.
    fn record(&self, event: AuditEvent);

    /// Wait until every event recorded so far is durable: in the database, or
    /// in the spool when the database is down (tests, shutdown).
    async fn flush(&self);

    /// Whether the audit database answers, for `/readyz`.
    async fn ready(&self) -> bool {
        true
    }
}
