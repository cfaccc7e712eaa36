use std::sync::Arc;

use async_trait::async_trait;
use parking_lot::Mutex;

use super::{AuditEvent, AuditSink};

/// Writes each event to the log. Not durable; for development.
#[derive(Debug, Default)]
pub struct LogSink;

#[async_trait]
impl AuditSink for LogSink {
    fn record(&self, event: AuditEvent) {
        tracing::info!(
            target: "tollgate::audit",
            action = %event.action,
            decision = event.decision.as_str(),
            reason = %event.reason,
            subject_kind = %event.subject_kind,
            rule = event.rule.as_deref(),
            shadow = event.shadow,
            "audit event"
        );
    }

    async fn flush(&self) {}
}

/// Keeps every event in memory so tests can read them back.
#[derive(Debug, Default, Clone)]
pub struct CapturingSink {
    events: Arc<Mutex<Vec<AuditEvent>>>,
}

impl CapturingSink {
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
