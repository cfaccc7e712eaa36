//! `audit.retention`: rows older than it go, at start-up and hourly.
//!
//! PostgreSQL drops whole daily partitions (a cut of any size takes a
//! moment and no writer waits for it) and makes the partitions of the
//! retention period and the days ahead; SQLite deletes in small batches.
//! Rows are kept until their whole day (PostgreSQL) or hour (SQLite) is
//! past retention, so that a day's rows and its rollups go together.

use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use metrics::{counter, gauge};

use super::db::{partitions, RetentionCut};
use super::{AuditDb, AuditError};
use crate::metrics::{AUDIT_RETENTION_ROWS, AUDIT_RETENTION_SECONDS};

const EVERY: Duration = Duration::from_secs(3600);

/// How far this host's clock and the database's may differ before the log
/// says so.
const CLOCK_SKEW_TOLD: chrono::Duration = chrono::Duration::minutes(5);

/// Where `retention` ends at `now`: rows before it are past it.
pub fn cutoff(now: DateTime<Utc>, retention: Duration) -> DateTime<Utc> {
    let retention = chrono::Duration::from_std(retention).unwrap_or(chrono::Duration::MAX);
    now.checked_sub_signed(retention)
        .unwrap_or(DateTime::<Utc>::MIN_UTC)
}

/// Make the partitions of the retention period (PostgreSQL), then cut what
/// is past it; what was cut. `now` is this host's clock; the cut is made
/// at the earlier of it and the database's, so that one instance whose
/// clock is far ahead (a bad RTC at boot, an NTP step) cannot drop the
/// whole shared trail: a clock behind only delays a cut.
pub async fn apply(
    db: &AuditDb,
    retention: Duration,
    now: DateTime<Utc>,
) -> Result<RetentionCut, AuditError> {
    let now = match db.clock().await? {
        Some(database) => earlier_clock(now, database),
        None => now,
    };
    let cutoff = cutoff(now, retention);
    // A failure here must not keep the trim and the cut from running: it is
    // returned once they have.
    let prepared = db.prepare_partitions(partitions::day(cutoff), now).await;
    let started = Instant::now();
    // Summaries first, a day per statement: the cut then finds few rollup
    // rows to delete in its one statement per table (the first 30 M-row run
    // deleted millions there, under a flood, and spooled).
    db.trim_summaries(now).await?;
    let cut = db.cut_before(cutoff).await?;
    if !cut.skipped {
        gauge!(AUDIT_RETENTION_SECONDS).set(started.elapsed().as_secs_f64());
        let how = if cut.partitions.is_empty() {
            "delete"
        } else {
            "partition"
        };
        counter!(AUDIT_RETENTION_ROWS, "how" => how).increment(cut.rows);
    }
    prepared?;
    Ok(cut)
}

/// The earlier of this host's clock and the database's, told in the log
/// when they differ by more than [`CLOCK_SKEW_TOLD`].
fn earlier_clock(host: DateTime<Utc>, database: DateTime<Utc>) -> DateTime<Utc> {
    let skew = host.signed_duration_since(database);
    if skew.abs() > CLOCK_SKEW_TOLD {
        tracing::error!(
            skew_seconds = skew.num_seconds(),
            "this host's clock and the audit database's differ: audit retention cuts at the earlier"
        );
    }
    host.min(database)
}

fn log(cut: &RetentionCut) {
    if cut.skipped {
        tracing::debug!("audit retention: another instance holds the lock");
    } else if cut.rows > 0 || !cut.partitions.is_empty() {
        tracing::info!(
            rows = cut.rows,
            partitions = ?cut.partitions,
            before = ?cut.before,
            "cut audit rows past audit.retention"
        );
    }
}

/// Cut now and then hourly until the task is aborted (at shutdown);
/// failures are logged and retried on the next tick.
pub fn spawn(db: AuditDb, retention: Duration) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(EVERY);
        loop {
            tick.tick().await;
            match apply(&db, retention, Utc::now()).await {
                Ok(cut) => log(&cut),
                Err(e) => tracing::warn!(error = %e, "audit retention cut failed; will retry"),
            }
        }
    })
}
