//! The audit sink `[audit]` configures: the journal, the database (migrated
//! when it answers) and the writer between them, and the retention task.

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use tokio::task::JoinHandle;

use crate::audit::{retention, AuditDb, AuditSink, DbSink, Journal, SinkConfig};
use crate::settings::Settings;

const MIGRATE_WAIT: Duration = Duration::from_secs(5);

/// Open the journal and the database and start the writer; the retention
/// task goes to `background`.
pub(super) async fn open(
    settings: &Settings,
    background: &mut Vec<JoinHandle<()>>,
) -> anyhow::Result<(Arc<dyn AuditSink>, AuditDb)> {
    let config = &settings.audit;
    let db = AuditDb::connect_lazy(config.database_url.expose())
        .context("cannot set up the audit database")?;
    // The journal first: an unusable spool directory is a
    // start-up error, not something found when the database fails.
    let journal =
        Journal::open(&config.spool_dir, config.journal_max_bytes).with_context(|| {
            format!(
                "audit.spool_dir {:?} is not usable (it must be a writable directory)",
                config.spool_dir
            )
        })?;
    // Migrate before serving when the database answers; when it is
    // down the writer migrates once it is back, and events wait in
    // the journal meanwhile.
    // (The retention task, started below, makes the partitions of the
    // whole retention period at once; migrating makes the days around today.)
    // On a task of its own: a migration that outlasts the wait goes on to
    // its end. Dropped, it would be rolled back only once PostgreSQL had
    // done all its work under its locks, and the writer would start over.
    let migration = tokio::spawn({
        let db = db.clone();
        async move { db.migrate().await }
    });
    let database_ready = match tokio::time::timeout(MIGRATE_WAIT, migration).await {
        Ok(Ok(Ok(()))) => true,
        Ok(Ok(Err(e))) => {
            tracing::warn!(error = %e, "audit database not migrated yet; events spool until it is (they wait in the journal)");
            false
        }
        Ok(Err(e)) => {
            tracing::warn!(error = %e, "audit database migration failed; events spool until the writer migrates it (they wait in the journal)");
            false
        }
        Err(_) => {
            tracing::warn!("audit database did not answer or is still migrating; events spool until it is ready (they wait in the journal)");
            false
        }
    };
    let sink = DbSink::start(
        db.clone(),
        journal,
        SinkConfig {
            batch_size: config.batch_size,
            flush_interval: config.flush_interval,
            write_timeout: config.write_timeout,
            queue_capacity: config.queue_capacity,
            journal_sync_interval: config.journal_sync_interval,
            retention: config.retention,
            prefix_digits: settings.sms.prefix_digits,
        },
        database_ready,
    )
    .context("cannot start the audit journal thread")?;
    background.push(retention::spawn(db.clone(), config.retention));
    Ok((sink, db))
}
