//! The journal: the one durable path of the audit trail. `record` appends
//! every event to the open segment file in `audit.spool_dir` with a single
//! write(2) (O_APPEND) before its request is answered, so once the answer
//! leaves, a `kill -9` cannot lose the event: the kernel's page cache holds
//! it. A thread fsyncs the open segment every `audit.journal_sync_interval`;
//! that interval is what a machine or kernel crash can lose.
//!
//! A segment is sealed when it passes [`SEGMENT_BYTES`] or [`SEGMENT_AGE`]
//! (or when the writer needs it replayed). A sealed segment is deleted once
//! every event in it is in the database: the writer counts commits per
//! segment. When some event never reached the database from memory (the
//! queue was full, the database was down), or a dead process left the
//! segment behind, the writer reads it back and inserts it whole; inserts
//! skip ids already present, so every event lands exactly once.
//!
//! The journal holds at most `audit.journal_max_bytes` (about: concurrent
//! appends may pass it by a line each). It only grows while the database
//! misses events (it is down, or behind a flood), and any client that can
//! cause refusals decides how fast; past the bound an event is not
//! journaled but still queued, so it reaches the database from memory
//! unless the process dies first or memory is full too (`dropped`).
//! Counted as `tollgate_audit_events_total{outcome="unjournaled"}`.
//!
//! Several processes may share a directory: each run names its segments
//! after itself and holds an exclusive `flock` on `<run>.lock`. At start-up
//! a run adopts (renames to its own name, atomically) the segments of every
//! run whose lock is free — a process that is gone — and the files of the
//! old spool (`spool.jsonl`, `replay-*.jsonl`).

use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use metrics::{counter, gauge};
use parking_lot::{Mutex, RwLock};

pub use super::segment::{read_lines, Lines, Segment};
use super::AuditEvent;
use crate::metrics::{AUDIT_EVENTS, AUDIT_JOURNAL_BYTES, AUDIT_JOURNAL_ERRORS};
use crate::telemetry::log_budget::LogBudget;

mod adopt;
pub use adopt::ADOPT_EVERY;
mod json_line;

/// A segment is sealed once it holds this many bytes…
const SEGMENT_BYTES: u64 = 8 << 20;
/// …or once it is this old and holds an event, so that a quiet service
/// does not keep a committed segment on disk for long.
const SEGMENT_AGE: Duration = Duration::from_secs(10);

/// Journal failures an attacker can provoke by the thousand (one per
/// refusal, on a full disk): one line per 10 s, every one counted.
static ERROR_LINES: LogBudget = LogBudget::new(Duration::from_secs(10));
/// Segments that cannot be read for their replay, tried on every pass of
/// the writer: a budget of their own, so that a stuck one does not hold
/// back the line of a failing append or sync.
static UNREADABLE_LINES: LogBudget = LogBudget::new(Duration::from_secs(10));
/// Events past `audit.journal_max_bytes`, as many: the same.
static FULL_LINES: LogBudget = LogBudget::new(Duration::from_secs(10));

/// The segment being appended to.
struct Open {
    file: Arc<File>,
    segment: Arc<Segment>,
    opened: Instant,
}

/// Why an event was not journaled.
enum AppendError {
    /// The journal holds `audit.journal_max_bytes`.
    Full,
    Io(io::Error),
}

impl From<io::Error> for AppendError {
    fn from(error: io::Error) -> Self {
        Self::Io(error)
    }
}

/// The journal of one process, in `audit.spool_dir`.
pub struct Journal {
    dir: PathBuf,
    /// Opened at the first append after start-up or a seal: an append
    /// never finds a sealed file.
    current: RwLock<Option<Open>>,
    /// Every segment still on disk, oldest first.
    segments: Mutex<Vec<Arc<Segment>>>,
    /// Bytes of those segments, the open one aside.
    sealed_bytes: AtomicU64,
    /// `audit.journal_max_bytes`.
    max_bytes: u64,
    /// This run's name, `<start ms>-<pid>-<k>-<random>`; its segments are
    /// `journal-<run>-<n>.jsonl`.
    run: String,
    next: AtomicU64,
    /// Bytes this run wrote to files of refused events.
    refused_bytes: AtomicU64,
    healthy: AtomicBool,
    /// Appended to since the last fsync.
    dirty: AtomicBool,
    /// A segment was created since the directory's last fsync.
    dir_dirty: AtomicBool,
    /// Held for the flock; closing it releases the directory.
    _lock: File,
}

impl Journal {
    /// Take `dir` (made when missing): lock this run's name, check that a
    /// file can be written and synced there, and adopt what processes that
    /// are gone left. Appends stop at `max_bytes` on disk.
    pub fn open(dir: impl Into<PathBuf>, max_bytes: u64) -> io::Result<Self> {
        static RUNS: AtomicU64 = AtomicU64::new(0);
        let dir = dir.into();
        fs::create_dir_all(&dir)?;
        // Random bits too: containers on one shared volume are each
        // process 1, and may start in the same millisecond.
        let run = format!(
            "{:013}-{}-{}-{:08x}",
            chrono::Utc::now().timestamp_millis(),
            std::process::id(),
            RUNS.fetch_add(1, Ordering::Relaxed),
            rand::random::<u32>()
        );
        // Locked under a name no one adopts, then renamed: a process
        // starting beside this one never finds the lock file unlocked,
        // which would make this run look gone to it. Made new, never
        // another's taken over.
        let locking = dir.join(format!(".{run}.locking"));
        let lock = OpenOptions::new()
            .create_new(true)
            .write(true)
            .open(&locking)?;
        if !try_lock(&lock) {
            return Err(io::Error::other("cannot lock this run's journal name"));
        }
        fs::rename(&locking, dir.join(format!("{run}.lock")))?;
        probe(&dir, &run)?;
        let journal = Self {
            dir,
            current: RwLock::new(None),
            segments: Mutex::new(Vec::new()),
            sealed_bytes: AtomicU64::new(0),
            max_bytes,
            run,
            next: AtomicU64::new(0),
            refused_bytes: AtomicU64::new(0),
            healthy: AtomicBool::new(true),
            dirty: AtomicBool::new(false),
            dir_dirty: AtomicBool::new(false),
            _lock: lock,
        };
        journal.adopt_at_start()?;
        Ok(journal)
    }

    fn segment_path(&self) -> PathBuf {
        let n = self.next.fetch_add(1, Ordering::Relaxed);
        self.dir.join(format!("journal-{}-{n:06}.jsonl", self.run))
    }

    /// Append one event with one write(2); the segment it went to, or none
    /// when it could not be journaled (counted and logged here): the
    /// journal is full or failing.
    pub fn append(&self, event: &AuditEvent) -> Option<Arc<Segment>> {
        match self.try_append(event, self.max_bytes) {
            Ok(segment) => Some(segment),
            Err(AppendError::Full) => {
                counter!(AUDIT_EVENTS, "outcome" => "unjournaled").increment(1);
                if let Some(held_back) = FULL_LINES.admit() {
                    tracing::warn!(
                        max_bytes = self.max_bytes,
                        dir = %self.dir.display(),
                        held_back,
                        "the audit journal is full (audit.journal_max_bytes); events wait in memory only"
                    );
                }
                None
            }
            Err(AppendError::Io(e)) => {
                counter!(AUDIT_EVENTS, "outcome" => "unjournaled").increment(1);
                self.failed("append", &e);
                None
            }
        }
    }

    /// Append an event that waited in memory, past `audit.journal_max_bytes`
    /// if need be: a flush (`SIGTERM`'s) puts there what would otherwise
    /// die with the process, at most `audit.queue_capacity` events. None
    /// when the journal fails (counted and logged here).
    pub fn append_past_bound(&self, event: &AuditEvent) -> Option<Arc<Segment>> {
        match self.try_append(event, u64::MAX) {
            Ok(segment) => Some(segment),
            Err(AppendError::Full) => None,
            Err(AppendError::Io(e)) => {
                self.failed("append", &e);
                None
            }
        }
    }

    fn try_append(&self, event: &AuditEvent, max_bytes: u64) -> Result<Arc<Segment>, AppendError> {
        // A newline first, not last: a torn append (a full disk mid-write)
        // then spoils only its own line, never the next one.
        let mut line = Vec::with_capacity(400);
        line.push(b'\n');
        json_line::write(&mut line, event);
        {
            let current = self.current.read();
            if let Some(open) = current.as_ref() {
                return self.write_line(open, &line, max_bytes);
            }
        }
        let mut current = self.current.write();
        if current.is_none() {
            *current = Some(self.create()?);
        }
        match current.as_ref() {
            Some(open) => self.write_line(open, &line, max_bytes),
            None => Err(io::Error::other("no journal segment").into()),
        }
    }

    fn write_line(
        &self,
        open: &Open,
        line: &[u8],
        max_bytes: u64,
    ) -> Result<Arc<Segment>, AppendError> {
        let segment = &open.segment;
        let held =
            self.sealed_bytes.load(Ordering::Relaxed) + segment.bytes.load(Ordering::Relaxed);
        if held.saturating_add(line.len() as u64) > max_bytes {
            return Err(AppendError::Full);
        }
        let written = (&*open.file).write(line)?;
        segment.bytes.fetch_add(written as u64, Ordering::Relaxed);
        if written != line.len() {
            return Err(io::Error::new(
                io::ErrorKind::WriteZero,
                "short write to the audit journal",
            )
            .into());
        }
        segment.appended.fetch_add(1, Ordering::AcqRel);
        if !self.dirty.load(Ordering::Relaxed) {
            self.dirty.store(true, Ordering::Relaxed);
        }
        if !self.healthy.load(Ordering::Relaxed) {
            self.healthy.store(true, Ordering::Relaxed);
        }
        Ok(segment.clone())
    }

    fn create(&self) -> io::Result<Open> {
        let path = self.segment_path();
        let file = OpenOptions::new()
            .create_new(true)
            .append(true)
            .open(&path)?;
        let segment = Arc::new(Segment::new(path, false, 0));
        self.segments.lock().push(segment.clone());
        self.dir_dirty.store(true, Ordering::Relaxed);
        Ok(Open {
            file: Arc::new(file),
            segment,
            opened: Instant::now(),
        })
    }

    /// fsync what was appended since the last call, and the directory when
    /// a segment was created.
    pub fn sync(&self) -> io::Result<()> {
        if self.dirty.swap(false, Ordering::Relaxed) {
            let file = self.current.read().as_ref().map(|o| o.file.clone());
            if let Some(file) = file {
                file.sync_data()?;
            }
        }
        if self.dir_dirty.swap(false, Ordering::Relaxed) {
            File::open(&self.dir)?.sync_all()?;
        }
        Ok(())
    }

    /// Seal the open segment when it is big or old enough, or when `force`
    /// and it holds an event; fsync it once sealed.
    pub fn rotate(&self, force: bool) -> io::Result<()> {
        let sealed = {
            let mut current = self.current.write();
            let due = current.as_ref().is_some_and(|open| {
                open.segment.appended.load(Ordering::Acquire) > 0
                    && (force
                        || open.segment.bytes.load(Ordering::Relaxed) >= SEGMENT_BYTES
                        || open.opened.elapsed() >= SEGMENT_AGE)
            });
            if due {
                current.take()
            } else {
                None
            }
        };
        match sealed {
            Some(open) => {
                self.seal(&open);
                open.file.sync_data()
            }
            None => Ok(()),
        }
    }

    /// Mark a segment taken out of `current` sealed; its bytes now count
    /// among the sealed ones.
    fn seal(&self, open: &Open) {
        let segment = &open.segment;
        self.sealed_bytes
            .fetch_add(segment.bytes.load(Ordering::Relaxed), Ordering::Relaxed);
        segment.sealed.store(true, Ordering::Release);
    }

    /// Bytes on disk (`tollgate_audit_journal_bytes`, set by the sync
    /// thread).
    pub fn bytes(&self) -> u64 {
        let open = self
            .current
            .read()
            .as_ref()
            .map_or(0, |o| o.segment.bytes.load(Ordering::Relaxed));
        self.sealed_bytes.load(Ordering::Relaxed) + open
    }

    /// Publish [`Self::bytes`] as a gauge.
    pub fn report_size(&self) {
        gauge!(AUDIT_JOURNAL_BYTES).set(self.bytes() as f64);
    }

    /// Seal the open segment if every event in it is in the database (a
    /// flush, a shutdown): nothing of this run is then left to replay.
    pub fn seal_if_settled(&self) {
        let mut current = self.current.write();
        if current.as_ref().is_some_and(|o| o.segment.settled()) {
            if let Some(open) = current.take() {
                self.seal(&open);
            }
        }
    }

    /// Whether the open segment has an event that must come from disk.
    pub fn open_needs_replay(&self) -> bool {
        self.current
            .read()
            .as_ref()
            .is_some_and(|o| o.segment.needs_replay())
    }

    /// Whether some segment, open or sealed, has an event that must come
    /// from disk.
    pub fn awaits_replay(&self) -> bool {
        self.segments.lock().iter().any(|s| s.needs_replay())
    }

    /// The sealed segments, oldest first.
    pub fn sealed(&self) -> Vec<Arc<Segment>> {
        self.segments
            .lock()
            .iter()
            .filter(|s| s.is_sealed())
            .cloned()
            .collect()
    }

    /// Delete a sealed segment whose events are all in the database.
    pub fn remove(&self, segment: &Arc<Segment>) -> io::Result<()> {
        match fs::remove_file(segment.path()) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
        self.forget(segment);
        Ok(())
    }

    /// Keep a replayed segment that holds lines this release cannot read:
    /// renamed `<name>.unread`, which no run adopts, and forgotten. Should
    /// the rename fail, it is forgotten all the same under its name, and
    /// the next process adopts and reads it again: never deleted.
    pub fn set_aside(&self, segment: &Arc<Segment>) -> io::Result<PathBuf> {
        let mut to = segment.path().as_os_str().to_owned();
        to.push(".unread");
        let to = PathBuf::from(to);
        let renamed = fs::rename(segment.path(), &to);
        self.forget(segment);
        renamed.map(|()| to)
    }

    /// Keep events the database refused (a constraint an operator added
    /// to the table, say) in a file of their own, `refused-<run>-<n>.jsonl`,
    /// written whole and fsynced before the writer lets their segments go;
    /// adopted by no run. Renamed `replay-<anything>.jsonl` once the table
    /// takes them, it is replayed. None, and nothing written, once this
    /// run's refused files would pass `audit.journal_max_bytes`: a
    /// constraint that refuses what any caller can send (a user name's
    /// length, say) must not fill the disk.
    pub fn keep_refused(&self, events: &[AuditEvent]) -> io::Result<Option<PathBuf>> {
        let mut lines = Vec::with_capacity(events.len() * 400);
        for event in events {
            lines.push(b'\n');
            json_line::write(&mut lines, event);
        }
        let size = lines.len() as u64;
        let before = self.refused_bytes.fetch_add(size, Ordering::Relaxed);
        if before.saturating_add(size) > self.max_bytes {
            self.refused_bytes.fetch_sub(size, Ordering::Relaxed);
            return Ok(None);
        }
        let n = self.next.fetch_add(1, Ordering::Relaxed);
        let path = self.dir.join(format!("refused-{}-{n:06}.jsonl", self.run));
        let written = OpenOptions::new()
            .create_new(true)
            .write(true)
            .open(&path)
            .and_then(|mut file| {
                file.write_all(&lines)?;
                file.sync_all()
            })
            .and_then(|()| File::open(&self.dir)?.sync_all());
        match written {
            Ok(()) => Ok(Some(path)),
            Err(e) => {
                self.refused_bytes.fetch_sub(size, Ordering::Relaxed);
                Err(e)
            }
        }
    }

    /// Take `segment` out of the journal's list, and its bytes out of the
    /// bound.
    fn forget(&self, segment: &Arc<Segment>) {
        let mut segments = self.segments.lock();
        let before = segments.len();
        segments.retain(|s| !Arc::ptr_eq(s, segment));
        if segments.len() < before {
            self.sealed_bytes
                .fetch_sub(segment.bytes.load(Ordering::Relaxed), Ordering::Relaxed);
        }
    }

    /// Whether the last append or sync worked (or, after a failure, a probe
    /// of the directory has since): `/readyz`.
    pub fn healthy(&self) -> bool {
        self.healthy.load(Ordering::Relaxed)
    }

    /// Count and log (rate-limited) a failure, and say not ready until an
    /// append or a probe works again.
    pub fn failed(&self, what: &'static str, error: &io::Error) {
        self.healthy.store(false, Ordering::Relaxed);
        counter!(AUDIT_JOURNAL_ERRORS, "op" => what).increment(1);
        if let Some(held_back) = ERROR_LINES.admit() {
            tracing::error!(
                error = %error,
                op = what,
                dir = %self.dir.display(),
                held_back,
                "cannot write the audit journal (audit.spool_dir); events wait in memory"
            );
        }
    }

    /// A segment to replay could not be read (its owner or mode changed, a
    /// directory in its place): counted and said, tried again on the
    /// writer's next pass. Not a failure of the journal, which still
    /// takes events: readiness is not touched.
    pub fn unreadable(&self, segment: &Path, error: &io::Error) {
        counter!(AUDIT_JOURNAL_ERRORS, "op" => "read").increment(1);
        if let Some(held_back) = UNREADABLE_LINES.admit() {
            tracing::error!(
                error = %error,
                file = %segment.display(),
                held_back,
                "cannot read an audit journal segment to replay it; tried again until it can be, \
                 or is removed (its events are not in the database)"
            );
        }
    }

    /// After a failure: whether the directory takes a file again.
    pub fn recheck(&self) {
        if !self.healthy() && probe(&self.dir, &self.run).is_ok() {
            self.healthy.store(true, Ordering::Relaxed);
            tracing::info!(dir = %self.dir.display(), "the audit journal is writable again");
        }
    }
}

impl Drop for Journal {
    /// A run that leaves no segment leaves no lock file either.
    fn drop(&mut self) {
        if self.segments.lock().is_empty() {
            let _ = fs::remove_file(self.dir.join(format!("{}.lock", self.run)));
        }
    }
}

/// An exclusive, non-blocking flock; whether it was granted.
fn try_lock(file: &File) -> bool {
    // std's lock is flock(2) on Linux: held for the descriptor's life, and
    // released by the kernel when the process dies.
    file.try_lock().is_ok()
}

/// Write, sync and delete a small file in `dir`.
fn probe(dir: &Path, run: &str) -> io::Result<()> {
    // The run's own name: processes probing one directory at once must
    // not delete each other's file.
    let path = dir.join(format!(".probe-{run}"));
    let mut file = OpenOptions::new()
        .create(true)
        .truncate(true)
        .write(true)
        .open(&path)?;
    file.write_all(b"tollgate\n")?;
    file.sync_data()?;
    // Gone already: a neighbour took it for a crash's leftover (a start-up
    // stuck for a minute).
    match fs::remove_file(&path) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}
