//! A journal segment: one file of `audit.spool_dir`, what the writer knows
//! of its events (appended, committed, sealed, to replay), and reading it
//! back for a replay.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use super::AuditEvent;

/// One segment file and what the writer knows of its events.
#[derive(Debug)]
pub struct Segment {
    path: PathBuf,
    pub(super) appended: AtomicU64,
    /// Its size on disk.
    pub(super) bytes: AtomicU64,
    committed: AtomicU64,
    pub(super) sealed: AtomicBool,
    /// Some event of it must be read back from disk (always so for a
    /// segment an earlier process left: what it holds is known only once
    /// read).
    replay: AtomicBool,
}

impl Segment {
    pub(super) fn new(path: PathBuf, leftover: bool, bytes: u64) -> Self {
        Self {
            path,
            appended: AtomicU64::new(0),
            bytes: AtomicU64::new(bytes),
            committed: AtomicU64::new(0),
            sealed: AtomicBool::new(leftover),
            replay: AtomicBool::new(leftover),
        }
    }

    /// The file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// An event of it will not reach the database from memory.
    pub fn mark_for_replay(&self) {
        if !self.replay.load(Ordering::Relaxed) {
            self.replay.store(true, Ordering::Relaxed);
        }
    }

    /// Read back whole and in the database: settled, so that a failed
    /// deletion is tried again without reading it again.
    pub fn replayed(&self) {
        self.committed
            .store(self.appended.load(Ordering::Acquire), Ordering::Release);
        self.replay.store(false, Ordering::Relaxed);
    }

    /// `n` of its events are in the database.
    pub fn committed(&self, n: u64) {
        self.committed.fetch_add(n, Ordering::AcqRel);
    }

    /// Whether it must be read back from disk.
    pub fn needs_replay(&self) -> bool {
        self.replay.load(Ordering::Relaxed)
    }

    /// Every event of it is in the database. One waiting for a replay is
    /// not, whatever the counts say (a leftover's are both 0).
    pub fn settled(&self) -> bool {
        // At or past: a replayed segment counts every event in, and those
        // of its events still queued then commit from memory as well.
        !self.needs_replay()
            && self.committed.load(Ordering::Acquire) >= self.appended.load(Ordering::Acquire)
    }

    pub(super) fn is_sealed(&self) -> bool {
        self.sealed.load(Ordering::Acquire)
    }
}

/// The events of a segment. An unreadable line (a torn append) is skipped
/// with a warning: its request was never answered.
pub fn read_events(path: &Path) -> io::Result<Vec<AuditEvent>> {
    let bytes = fs::read(path)?;
    let mut events = Vec::new();
    for (n, line) in bytes.split(|b| *b == b'\n').enumerate() {
        if line.iter().all(u8::is_ascii_whitespace) {
            continue;
        }
        match serde_json::from_slice(line) {
            Ok(event) => events.push(event),
            Err(e) => {
                tracing::warn!(file = %path.display(), line = n + 1, error = %e, "skipping an unreadable journal line")
            }
        }
    }
    Ok(events)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with_events(n: u64) -> Segment {
        let segment = Segment::new(PathBuf::from("journal-x-000000.jsonl"), false, 0);
        segment.appended.store(n, Ordering::Release);
        segment
    }

    #[test]
    fn a_segment_is_settled_once_every_event_committed() {
        let segment = with_events(2);
        segment.committed(1);
        assert!(!segment.settled());
        segment.committed(1);
        assert!(segment.settled());
    }

    #[test]
    fn a_segment_waiting_for_its_replay_is_not_settled() {
        let segment = with_events(2);
        segment.committed(2);
        segment.mark_for_replay();
        assert!(!segment.settled());
    }

    /// Replayed whole while some of its events were still queued: those
    /// commit from memory as well, past the count, and it stays settled
    /// (its deletion, if it failed, is tried again rather than forgotten).
    #[test]
    fn a_replayed_segment_stays_settled_as_its_queued_events_commit() {
        let segment = with_events(3);
        segment.committed(1);
        segment.mark_for_replay();
        segment.replayed();
        assert!(segment.settled());
        segment.committed(2);
        assert!(segment.settled());
    }
}
