//! `audit.retention`: rows older than it are purged, at start-up and hourly.

use std::time::Duration;

use super::AuditDb;

const EVERY: Duration = Duration::from_secs(3600);

/// Delete rows older than `retention`; returns how many.
pub async fn purge(db: &AuditDb, retention: Duration) -> Result<u64, super::AuditError> {
    let retention = chrono::Duration::from_std(retention).unwrap_or(chrono::Duration::MAX);
    let before = chrono::Utc::now()
        .checked_sub_signed(retention)
        .unwrap_or(chrono::DateTime::<chrono::Utc>::MIN_UTC);
    db.purge_before(before).await
}

/// Purge now and then hourly until the task is aborted (at shutdown);
/// failures are logged and retried on the next tick.
pub fn spawn(db: AuditDb, retention: Duration) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(EVERY);
        loop {
            tick.tick().await;
            match purge(&db, retention).await {
                Ok(0) => {}
                Ok(n) => tracing::info!(rows = n, "purged audit rows past audit.retention"),
                Err(e) => tracing::warn!(error = %e, "audit retention purge failed; will retry"),
            }
        }
    })
}
