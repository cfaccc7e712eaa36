//! The audit trail. Guards build typed [`AuditEvent`]s and hand them to an
//! [`AuditSink`], which never blocks the request; [`DbSink`] makes them durable
//! (journal on disk before the answer, then queue → batch writer → database;
//! docs/audit.md).

pub mod db;
mod event;
pub mod journal;
mod journal_sync;
mod log;
pub mod query;
mod read_turns;
pub mod retention;
pub mod rollup;
mod segment;
mod sinks;
pub mod stats;
mod writer;

pub use db::{AuditDb, AuditError};
pub use event::{now_ms, rfc3339_ms, AuditDecision, AuditEvent};
pub use journal::Journal;
pub use log::{AuditLog, Page};
pub use sinks::{CapturingSink, ObservedSink};
pub use writer::{stop_asked, writer_panicked, DbSink, SinkConfig};

use async_trait::async_trait;

/// Watches the trail as events are recorded (admin alerts). `observe` runs
/// on the request path: an implementation looks and returns at once.
pub trait AuditObserver: Send + Sync {
    /// Look at one event, before the sink has it.
    fn observe(&self, event: &AuditEvent);
}

/// Where guards hand their audit events. `record` runs on the request path,
/// so an implementation queues and returns at once.
#[async_trait]
pub trait AuditSink: Send + Sync {
    /// Hand over one event. Never waits for a database.
    fn record(&self, event: AuditEvent);

    /// Wait until every event recorded so far has been offered to the
    /// database (written, or left to the journal while it is down) and the
    /// journal is fsync'd (tests, shutdown).
    async fn flush(&self);

    /// What `/readyz` says of the trail, from state: no probe on the
    /// request path.
    fn health(&self) -> AuditHealth {
        AuditHealth::default()
    }
}

/// The trail's readiness, as last observed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AuditHealth {
    /// The audit database answered the writer's last insert or check.
    pub database: bool,
    /// The journal took its last append (or its directory a probe since).
    pub journal: bool,
}

impl Default for AuditHealth {
    fn default() -> Self {
        Self {
            database: true,
            journal: true,
        }
    }
}

impl AuditHealth {
    /// Both are fine.
    pub fn ready(&self) -> bool {
        self.database && self.journal
    }
}
