//! A run adopts the segments of runs that are gone (their lock is free)
//! and the old spool's files, at start-up and then every [`ADOPT_EVERY`]:
//! see the journal's module comment.

use std::fs::{self, File, OpenOptions};
use std::io;
use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use metrics::counter;

use super::{try_lock, Journal, Segment};
use crate::metrics::AUDIT_JOURNAL_ERRORS;
use crate::telemetry::log_budget::LogBudget;

impl Journal {
    /// At start-up: rename to this run's names, oldest first, the segments
    /// of runs that are gone and the old spool's files; they become
    /// leftovers to replay. Fails only when the directory cannot be read.
    pub(super) fn adopt_at_start(&self) -> io::Result<()> {
        self.adopt_files(Duration::ZERO)
    }

    /// While running, every [`ADOPT_EVERY`]: the same, but the old spool's
    /// names (`spool.jsonl`, `replay-*.jsonl`), which no lock guards, only
    /// once their last write is [`STALE_AFTER`] old: a file an operator is
    /// copying in, or that a process of a release before segments still
    /// appends to, is not taken half written. Failures are counted and
    /// logged here; they leave the journal's readiness alone (appends are
    /// not what failed).
    pub fn adopt(&self) {
        if let Err(e) = self.adopt_files(STALE_AFTER) {
            self.adopt_failed(&self.dir, &e);
        }
    }

    /// A rename that fails because the file is gone lost a race to another
    /// process adopting at the same time, which has it now; any other
    /// failure skips that file (logged) and goes on. The lock files of runs
    /// that are gone are deleted. This run's own files are never looked at.
    fn adopt_files(&self, ownerless_after: Duration) -> io::Result<()> {
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
        for name in names.iter().filter(|n| is_journal_file(n)) {
            if let Some(owner) = run_of(name) {
                if owner == self.run {
                    continue;
                }
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
            } else if !self.untouched_for(name, ownerless_after) {
                continue;
            }
            if let Err(e) = self.take(name) {
                self.adopt_failed(&self.dir.join(name), &e);
            }
        }
        for (owner, lock) in runs {
            if let Some(Some(_held)) = lock {
                let _ = fs::remove_file(self.dir.join(format!("{owner}.lock")));
            }
        }
        for name in names.iter().filter(|n| is_momentary_file(n)) {
            self.remove_if_stale(name);
        }
        Ok(())
    }

    /// Rename `name` to this run's next segment, a leftover to replay.
    fn take(&self, name: &str) -> io::Result<()> {
        let to = self.segment_path();
        match fs::rename(self.dir.join(name), &to) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(e),
        }
        // Ours now, whatever its size says: a size that cannot be read
        // counts as none (the replay reads the file, not the count).
        let bytes = fs::metadata(&to).map_or(0, |m| m.len());
        self.sealed_bytes.fetch_add(bytes, Ordering::Relaxed);
        self.segments
            .lock()
            .push(Arc::new(Segment::new(to, true, bytes)));
        Ok(())
    }

    /// Whether `name` was last written `age` ago or more (always, for a
    /// zero `age`; never, when its time cannot be read or is ahead).
    fn untouched_for(&self, name: &str, age: Duration) -> bool {
        age.is_zero()
            || fs::metadata(self.dir.join(name))
                .and_then(|m| m.modified())
                .ok()
                .and_then(|modified| SystemTime::now().duration_since(modified).ok())
                .is_some_and(|since| since >= age)
    }

    /// Count and log (one line a minute) what adoption could not do.
    fn adopt_failed(&self, path: &Path, error: &io::Error) {
        counter!(AUDIT_JOURNAL_ERRORS, "op" => "adopt").increment(1);
        if let Some(held_back) = ADOPT_LINES.admit() {
            tracing::warn!(path = %path.display(), %error, held_back, "cannot adopt what a process that is gone left in the audit journal; tried again");
        }
    }

    /// Delete a momentary file a crash left behind: older than
    /// [`STALE_AFTER`] and not locked. A neighbour starting now holds its
    /// `.locking` file locked, or made it a moment ago.
    fn remove_if_stale(&self, name: &str) {
        let path = self.dir.join(name);
        let Ok(file) = OpenOptions::new().write(true).open(&path) else {
            return;
        };
        let age = file
            .metadata()
            .and_then(|m| m.modified())
            .ok()
            .and_then(|modified| SystemTime::now().duration_since(modified).ok());
        if age.is_some_and(|age| age >= STALE_AFTER) && try_lock(&file) {
            let _ = fs::remove_file(&path);
        }
    }

    /// Run `owner`'s lock, held, when its process is gone; `None` while it
    /// lives, or when its lock cannot be opened for another reason than its
    /// absence (another user's run, no descriptor left): its segments are
    /// then left where they are, rather than taken from a run that may live.
    fn claim(&self, owner: &str) -> Option<Option<File>> {
        match OpenOptions::new()
            .write(true)
            .open(self.dir.join(format!("{owner}.lock")))
        {
            Ok(lock) => try_lock(&lock).then_some(Some(lock)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Some(None),
            Err(e) => {
                if let Some(held_back) = LOCK_LINES.admit() {
                    tracing::warn!(run = owner, error = %e, held_back, "cannot open another run's journal lock; leaving its segments");
                }
                None
            }
        }
    }
}

/// How often a running process looks for the segments of a run that died
/// beside it: a survivor takes them, rather than waiting for a process to
/// start on the directory. A listing and a lock a run: cheap.
pub const ADOPT_EVERY: Duration = Duration::from_secs(5);

/// Lines about locks that cannot be opened, asked again every
/// [`ADOPT_EVERY`]: one a minute.
static LOCK_LINES: LogBudget = LogBudget::new(Duration::from_secs(60));
/// Lines about files that cannot be adopted: the same.
static ADOPT_LINES: LogBudget = LogBudget::new(Duration::from_secs(60));

/// A run's momentary files are older than this only when it died holding
/// them (or a write to a failing disk left its probe); a file of the old
/// spool's names untouched this long is no longer being written.
const STALE_AFTER: Duration = Duration::from_secs(60);

/// What a run has on disk for moments: its lock file before the rename
/// (`.<run>.locking`) and the file it probes the directory with
/// (`.probe-<run>`, at start-up and when it rechecks a failed directory).
fn is_momentary_file(name: &str) -> bool {
    name.starts_with(".probe-") || (name.starts_with('.') && name.ends_with(".locking"))
}

/// A file the journal adopts: a run's segment, or the old spool's
/// (`spool.jsonl`, `replay-*.jsonl`). Anything else an operator keeps in
/// the directory is left alone: adopting deletes a file once replayed.
fn is_journal_file(name: &str) -> bool {
    run_of(name).is_some()
        || name == "spool.jsonl"
        || name
            .strip_prefix("replay-")
            .is_some_and(|rest| rest.ends_with(".jsonl"))
}

/// The run a segment's name says wrote it (`journal-<run>-<n>.jsonl`, the
/// run `<start ms>-<pid>-<k>-<8 hex digits>`, or without the hex digits as
/// before them); none for the old spool's files and for any other name
/// (`journal-2024-05.jsonl` is an operator's, not a run's).
fn run_of(name: &str) -> Option<&str> {
    let inner = name.strip_prefix("journal-")?.strip_suffix(".jsonl")?;
    let (run, n) = inner.rsplit_once('-')?;
    let fields: Vec<&str> = run.split('-').collect();
    let decimal = |f: &str| !f.is_empty() && f.bytes().all(|b| b.is_ascii_digit());
    let counters =
        |ms: &str, pid: &str, k: &str| ms.len() >= 13 && decimal(ms) && decimal(pid) && decimal(k);
    let shaped = match fields.as_slice() {
        [ms, pid, k] => counters(ms, pid, k),
        [ms, pid, k, random] => {
            counters(ms, pid, k)
                && random.len() == 8
                && random.bytes().all(|b| b.is_ascii_hexdigit())
        }
        _ => false,
    };
    (shaped && decimal(n)).then_some(run)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_runs_segment_names_a_run() {
        let cases = [
            (
                "journal-1764835200000-1-0-0a1b2c3d-7.jsonl",
                Some("1764835200000-1-0-0a1b2c3d"),
            ),
            (
                "journal-1764835200000-4242-3-12.jsonl",
                Some("1764835200000-4242-3"),
            ),
            ("journal-2024-05.jsonl", None),
            ("journal-2024-05-01-backup.jsonl", None),
            ("journal-1764835200000-1-0-0a1b2c3d-x.jsonl", None),
            ("journal-1764835200000-1-0-zz-7.jsonl", None),
            ("journal-notes.jsonl", None),
            ("spool.jsonl", None),
        ];
        for (name, run) in cases {
            assert_eq!(run_of(name), run, "{name}");
        }
    }
}
