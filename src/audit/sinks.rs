//! Sinks around the durable one: observers that watch the trail as it is
//! written (admin alerts), and a capturing sink for tests.

use std::sync::Arc;

use async_trait::async_trait;
use parking_lot::Mutex;

use super::{AuditEvent, AuditObserver, AuditSink};

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

/// Shows every event to the observers, then hands it to the sink. Never
/// waits: an observer only looks.
pub struct ObservedSink {
    inner: Arc<dyn AuditSink>,
    observers: Vec<Arc<dyn AuditObserver>>,
}

impl ObservedSink {
    /// Show each event to every one of `observers`, in order, then hand it to
    /// `inner`.
    pub fn new(inner: Arc<dyn AuditSink>, observers: Vec<Arc<dyn AuditObserver>>) -> Self {
        Self { inner, observers }
    }
}

#[async_trait]
impl AuditSink for ObservedSink {
    fn record(&self, event: AuditEvent) {
        for observer in &self.observers {
            observer.observe(&event);
        }
        self.inner.record(event);
    }

    async fn flush(&self) {
        self.inner.flush().await;
    }

    fn health(&self) -> super::AuditHealth {
        self.inner.health()
    }
}
