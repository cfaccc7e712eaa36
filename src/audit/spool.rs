//! The spool: an append-only, fsync'd file of events the database could not
//! take yet. Events go to `spool.jsonl`; a replay first renames it to
//! `replay-<ms>-<seq>.jsonl` (so appends go on into a fresh file), inserts the
//! renamed files oldest first and deletes each only once all its events are in
//! the database. Inserts skip ids already present, so a crash mid-replay
//! replays again without duplicates: every event lands exactly once.

use std::fs::{self, File, OpenOptions};
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::Mutex;

use super::AuditEvent;

const ACTIVE: &str = "spool.jsonl";

/// The spool of one sink, in `audit.spool_dir`.
pub struct Spool {
    dir: PathBuf,
    active: Mutex<Option<File>>,
    seq: AtomicU64,
}

impl Spool {
    /// A spool in `dir`; nothing is created before the first append.
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        Self {
            dir: dir.into(),
            active: Mutex::new(None),
            seq: AtomicU64::new(0),
        }
    }

    /// Append events durably (written and fsync'd before returning).
    pub fn append(&self, events: &[AuditEvent]) -> std::io::Result<()> {
        let mut lines = Vec::with_capacity(events.len() * 300);
        for event in events {
            serde_json::to_writer(&mut lines, event)?;
            lines.push(b'\n');
        }
        let mut active = self.active.lock();
        if active.is_none() {
            fs::create_dir_all(&self.dir)?;
            *active = Some(
                OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(self.dir.join(ACTIVE))?,
            );
        }
        let file = active.as_mut().expect("opened above");
        file.write_all(&lines)?;
        file.sync_data()
    }

    /// Move what has been appended so far out of the way for a replay and
    /// list every file waiting to be replayed, oldest first.
    pub fn take_for_replay(&self) -> std::io::Result<Vec<PathBuf>> {
        {
            let mut active = self.active.lock();
            *active = None;
            let current = self.dir.join(ACTIVE);
            if current.exists() {
                let millis = chrono::Utc::now().timestamp_millis();
                let seq = self.seq.fetch_add(1, Ordering::SeqCst);
                fs::rename(
                    &current,
                    self.dir.join(format!("replay-{millis:015}-{seq:06}.jsonl")),
                )?;
            }
        }
        self.pending()
    }

    /// Files waiting for a replay (from this run or a previous one).
    pub fn pending(&self) -> std::io::Result<Vec<PathBuf>> {
        let mut files: Vec<PathBuf> = match fs::read_dir(&self.dir) {
            Ok(entries) => entries
                .filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| {
                    p.file_name()
                        .and_then(|n| n.to_str())
                        .is_some_and(|n| n.starts_with("replay-") && n.ends_with(".jsonl"))
                })
                .collect(),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
            Err(e) => return Err(e),
        };
        files.sort();
        Ok(files)
    }

    /// Whether anything waits on disk.
    pub fn has_backlog(&self) -> bool {
        self.dir.join(ACTIVE).exists() || self.pending().is_ok_and(|p| !p.is_empty())
    }
}

/// The events of one spool file. A torn last line (a crash mid-append, before
/// the fsync returned) is skipped with a warning: it was never acknowledged.
pub fn read_events(path: &Path) -> std::io::Result<Vec<AuditEvent>> {
    let mut events = Vec::new();
    for (n, line) in BufReader::new(File::open(path)?).lines().enumerate() {
        let line = line?;
        if line.trim().is_empty() {
            continue;
        }
        match serde_json::from_str(&line) {
            Ok(event) => events.push(event),
            Err(e) => {
                tracing::warn!(file = %path.display(), line = n + 1, error = %e, "skipping an unreadable spool line")
            }
        }
    }
    Ok(events)
}
