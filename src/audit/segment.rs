//! A journal segment: one file of `audit.spool_dir`, what the writer knows
//! of its events (appended, committed, sealed, to replay), and reading it
//! back for a replay.

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

/// What a segment holds, read back for a replay.
#[derive(Debug, Default)]
pub struct Lines {
    /// The lines read as events, in file order.
    pub events: Vec<AuditEvent>,
    /// Lines not readable as events here, but for a torn last one
    /// (written by a newer release, a byte spoilt on disk, a line cut
    /// short before the last): the file is kept for them.
    pub unread: usize,
}

/// The events of a segment. Its last line, when cut short (a torn append:
/// its request was never answered; a machine crash's zeroed tail after
/// it), is skipped with a warning; any other line that is no event, a
/// line cut short before the last included (a byte spoilt on disk looks
/// so as often as not), is counted in [`Lines::unread`], so that the file
/// is set aside rather than deleted.
pub fn read_lines(path: &Path) -> io::Result<Lines> {
    // Whoever may write the spool directory could put a FIFO there under
    // a journal's name: opening it would wait for a writer for good, and
    // the audit writer's replay with it. A device is no journal either.
    // No bound but the journal's own (`audit.journal_max_bytes`).
    let bytes = crate::regular_file::read(path, u64::MAX)?;
    // A machine crash can leave a file's last blocks zeroed: its length
    // was written, its data not yet.
    let lines: Vec<&[u8]> = bytes
        .split(|b| *b == b'\n')
        .map(|line| &line[..line.iter().rposition(|b| *b != 0).map_or(0, |i| i + 1)])
        .collect();
    let last = lines
        .iter()
        .rposition(|line| !line.iter().all(u8::is_ascii_whitespace));
    let mut read = Lines::default();
    let (mut torn, mut first_unread) = (None, None);
    for (n, line) in lines.iter().enumerate() {
        if line.iter().all(u8::is_ascii_whitespace) {
            continue;
        }
        match serde_json::from_slice(line) {
            Ok(event) => read.events.push(event),
            Err(e) if e.is_eof() && Some(n) == last => torn = Some((n + 1, e)),
            Err(e) => {
                read.unread += 1;
                first_unread.get_or_insert((n + 1, e));
            }
        }
    }
    if let Some((line, error)) = torn {
        tracing::warn!(file = %path.display(), line, %error, "skipping a torn journal line (its request was never answered)");
    }
    // One line a file, whatever it holds: a spoilt file of a million lines
    // must not write a million.
    if let Some((line, error)) = first_unread {
        tracing::error!(file = %path.display(), lines = read.unread, first = line, %error, "journal lines this release cannot read");
    }
    Ok(read)
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

    /// A torn last line (an append cut short) and zeros a crash left at
    /// the end are skipped; any other line that is no event here, one cut
    /// short before the last included, is counted, for the file to be
    /// kept.
    #[test]
    fn only_a_torn_last_line_is_skipped_and_every_other_unreadable_one_counts() {
        let event = serde_json::to_string(&AuditEvent::new(
            crate::domain::Action::LoginAttempt,
            crate::audit::AuditDecision::Deny,
            "user_locked",
            &crate::domain::Subject::new(crate::domain::SubjectKind::User, "u"),
        ))
        .unwrap();
        let newer = event.replace("\"login_attempt\"", "\"teleport\"");
        assert_ne!(newer, event);
        let read = |text: Vec<u8>| {
            let dir = tempfile::tempdir().unwrap();
            let path = dir.path().join("segment.jsonl");
            std::fs::write(&path, text).unwrap();
            let lines = read_lines(&path).unwrap();
            (lines.events.len(), lines.unread)
        };
        let torn = &event[..event.len() - 7];
        let mut zeroed = format!("\n{event}\n{torn}").into_bytes();
        zeroed.extend_from_slice(&[0; 100]);
        assert_eq!(read(zeroed), (1, 0), "torn, then zeros");
        assert_eq!(read(format!("\n{event}\n{torn}\n\n").into_bytes()), (1, 0));
        assert_eq!(
            read(format!("\n{torn}\n{event}").into_bytes()),
            (1, 1),
            "cut short, but not last"
        );
        assert_eq!(read(format!("\n{event}\n{newer}\n").into_bytes()), (1, 1));
        assert_eq!(
            read(format!("\n{event}\n{{\"id\": 7}}").into_bytes()),
            (1, 1)
        );
        assert_eq!(read(b"\n\xff\xfe{}".to_vec()), (0, 1), "spoilt bytes");
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

    /// A FIFO under a journal's name is refused at once, not waited on.
    #[test]
    fn a_fifo_is_no_journal_and_is_not_waited_on() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("replay-fifo.jsonl");
        let made = std::process::Command::new("mkfifo")
            .arg(&path)
            .status()
            .expect("mkfifo runs");
        assert!(made.success());
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let _ = tx.send(read_lines(&path).map(|lines| lines.events.len()));
        });
        let read = rx
            .recv_timeout(std::time::Duration::from_secs(5))
            .expect("the read waits on the FIFO");
        let error = read.expect_err("a FIFO is read");
        assert_eq!(error.kind(), io::ErrorKind::InvalidInput);
    }
}
