//! The journal's own thread: fsyncs the open segment every
//! `audit.journal_sync_interval` (what a machine crash can lose), seals
//! segments as they fill or age, and rechecks a directory that failed.

use std::io;
use std::sync::Arc;
use std::time::Duration;

use super::journal::Journal;

/// What the sync thread is asked to do besides its periodic fsync.
pub enum SyncCommand {
    /// Seal the open segment now (it holds an event the writer must replay).
    Rotate,
    /// fsync now, then answer.
    Sync(tokio::sync::oneshot::Sender<()>),
}

/// The thread that fsyncs every `every`, seals segments as they fill or age,
/// and rechecks a failed directory. Ends (after a last fsync) when every
/// sender is dropped.
pub fn spawn_sync(
    journal: Arc<Journal>,
    every: Duration,
) -> io::Result<std::sync::mpsc::Sender<SyncCommand>> {
    use std::sync::mpsc::RecvTimeoutError;
    let (sender, commands) = std::sync::mpsc::channel();
    std::thread::Builder::new()
        .name("audit-journal".into())
        .spawn(move || loop {
            let mut acks = Vec::new();
            let mut force = false;
            let last = match commands.recv_timeout(every) {
                Ok(SyncCommand::Rotate) => {
                    force = true;
                    false
                }
                Ok(SyncCommand::Sync(ack)) => {
                    acks.push(ack);
                    false
                }
                Err(RecvTimeoutError::Timeout) => false,
                Err(RecvTimeoutError::Disconnected) => true,
            };
            if let Err(e) = journal.rotate(force) {
                journal.failed("sync", &e);
            }
            if let Err(e) = journal.sync() {
                journal.failed("sync", &e);
            }
            journal.recheck();
            journal.report_size();
            for ack in acks {
                let _ = ack.send(());
            }
            if last {
                break;
            }
        })?;
    Ok(sender)
}
