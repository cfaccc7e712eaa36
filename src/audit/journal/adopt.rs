//! At start-up a run adopts the segments of runs that are gone (their lock
//! is free) and the old spool's files: see the journal's module comment.

use std::fs::{self, File, OpenOptions};
use std::io;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use super::{try_lock, Journal, Segment};

impl Journal {
    /// Rename to this run's names, oldest first, the segments of runs that
    /// are gone and the old spool's files; they become leftovers to replay.
    /// A rename that fails because the file is gone lost a race to another
    /// process starting at the same time, which has it now. The lock files
    /// of runs that are gone are deleted.
    pub(super) fn adopt(&self) -> io::Result<()> {
        let mut names: Vec<String> = fs::read_dir(&self.dir)?
            .filter_map(|e| e.ok()?.file_name().into_string().ok())
            .collect();
        names.sort();
        // Per run: its lock while it is ours to adopt, `None` while it lives.
        let mut runs: std::collections::HashMap<String, Option<Option<File>>> = Default::default();
        for name in &names {
            if let Some(owner) = name.strip_suffix(".lock").filter(|o| *o != self.run) {
                runs.insert(owner.to_string(), self.claim(owner));
            }
        }
        for name in names.iter().filter(|n| n.ends_with(".jsonl")) {
            if let Some(owner) = run_of(name) {
                // A run whose lock file the listing did not show is asked
                // all the same: a directory read while others rename into
                // it may show a live run's segment and miss its lock,
                // which is in place before the run takes any segment.
                let gone = runs
                    .entry(owner.to_string())
                    .or_insert_with(|| self.claim(owner));
                if gone.is_none() {
                    continue; // a live process's segment
                }
            }
            let to = self.segment_path();
            match fs::rename(self.dir.join(name), &to) {
                Ok(()) => {
                    let bytes = match fs::metadata(&to) {
                        Ok(metadata) => metadata.len(),
                        Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
                        Err(e) => return Err(e),
                    };
                    self.sealed_bytes.fetch_add(bytes, Ordering::Relaxed);
                    self.segments
                        .lock()
                        .push(Arc::new(Segment::new(to, true, bytes)));
                }
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => return Err(e),
            }
        }
        for (owner, lock) in runs {
            if let Some(Some(_held)) = lock {
                let _ = fs::remove_file(self.dir.join(format!("{owner}.lock")));
            }
        }
        Ok(())
    }

    /// Run `owner`'s lock, held, when its process is gone; `None` while it
    /// lives.
    fn claim(&self, owner: &str) -> Option<Option<File>> {
        match OpenOptions::new()
            .write(true)
            .open(self.dir.join(format!("{owner}.lock")))
        {
            Ok(lock) => try_lock(&lock).then_some(Some(lock)),
            Err(_) => Some(None),
        }
    }
}

/// The run a segment's name says wrote it (`journal-<run>-<n>.jsonl`); none
/// for the old spool's files.
fn run_of(name: &str) -> Option<&str> {
    let inner = name.strip_prefix("journal-")?.strip_suffix(".jsonl")?;
    Some(&inner[..inner.rfind('-')?])
}
