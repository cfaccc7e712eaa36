//! The journal's own thread: fsyncs the open segment every
//! `audit.journal_sync_interval` (what a machine crash can lose), seals
//! segments as they fill or age, adopts the segments of runs that died
//! beside this one, and rechecks a directory that failed.

use std::io;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::journal::{Journal, ADOPT_EVERY};

/// What the sync thread is asked to do besides its periodic fsync.
pub enum SyncCommand {
    /// Seal the open segment now (it holds an event the writer must replay).
    Rotate,
    /// fsync now, then answer.
    Sync(tokio::sync::oneshot::Sender<()>),
}

/// The thread that fsyncs every `every`, seals segments as they fill or age,
/// adopts what dead runs left, and rechecks a failed directory. Ends (after
/// a last fsync) when every sender is dropped.
pub fn spawn_sync(
    journal: Arc<Journal>,
    every: Duration,
) -> io::Result<std::sync::mpsc::Sender<SyncCommand>> {
    use std::sync::mpsc::RecvTimeoutError;
    let (sender, commands) = std::sync::mpsc::channel();
    std::thread::Builder::new()
        .name("audit-journal".into())
        .spawn(move || {
            let mut adopted = Instant::now();
            loop {
                let (force, ack, last) = match commands.recv_timeout(every) {
                    Ok(SyncCommand::Rotate) => (true, None, false),
                    Ok(SyncCommand::Sync(ack)) => (false, Some(ack), false),
                    Err(RecvTimeoutError::Timeout) => (false, None, false),
                    Err(RecvTimeoutError::Disconnected) => (false, None, true),
                };
                tend(&journal, force, (!last).then_some(&mut adopted));
                if let Some(ack) = ack {
                    let _ = ack.send(());
                }
                if last {
                    break;
                }
            }
        })?;
    Ok(sender)
}

/// One pass: seal (now when `force`), fsync, adopt when [`ADOPT_EVERY`] has
/// passed since `adopted` (none on the last pass: nothing would replay
/// it), and recheck a failed directory unless this pass failed.
fn tend(journal: &Journal, force: bool, adopted: Option<&mut Instant>) {
    let mut failed = false;
    if let Err(e) = journal.rotate(force) {
        journal.failed("sync", &e);
        failed = true;
    }
    if let Err(e) = journal.sync() {
        journal.failed("sync", &e);
        failed = true;
    }
    if let Some(adopted) = adopted.filter(|at| at.elapsed() >= ADOPT_EVERY) {
        *adopted = Instant::now();
        journal.adopt();
    }
    // Not in the pass that failed: the probe's new file would pass where
    // the segment's fsync just failed, and `/readyz` would never show it.
    if !failed {
        journal.recheck();
    }
    journal.report_size();
}
