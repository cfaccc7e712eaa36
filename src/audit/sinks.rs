//! An audit sink for tests.

use std::sync::Arc;

use async_trait::async_trait;
use parking_lot::Mutex;

use super::{AuditEvent, AuditSink};

/// Keeps every event in memory so tests can read them back.
#[derive(Debug, Default, Clone)]
pub struct CapturingSink {
    events: Arc<Mutex<Vec<AuditEvent>>>,
}

impl CapturingSink {
    /// Every event recorded so far, in order.
    pub fn events(&self) -> Vec<AuditEvent> {
        self.events.lock().clone()
    }
}

#[async_trait]
impl AuditSink for CapturingSink {
    fn record(&self, event: AuditEvent) {
        self.events.lock().push(event);
    }

    async fn flush(&self) {}
}
