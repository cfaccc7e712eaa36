//! Which file events mean "reload", and what the watched files hold.
//!
//! The config file's *directory* is watched, not the file: editors save by
//! renaming a new file over the old one, and a Kubernetes ConfigMap volume
//! swaps its `..data` link to a new directory, after which the file's path
//! resolves elsewhere; both are events in that directory. The templates
//! directories are watched whole.

use std::collections::hash_map::DefaultHasher;
use std::hash::{Hash, Hasher};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use notify::event::{AccessKind, AccessMode, ModifyKind};
use notify::{Event, EventKind, RecommendedWatcher, RecursiveMode, Watcher};
use parking_lot::RwLock;
use tokio::sync::Notify;

use crate::delivery::TemplateDirs;

/// How deep a templates directory is read for its fingerprint (email
/// templates are one directory down; a loop of links stops here).
const MAX_DEPTH: usize = 3;

/// What is watched: the events on these paths wake the reload task.
#[derive(Debug, Default)]
struct Targets {
    /// The config file's directory and name.
    config: Option<(PathBuf, std::ffi::OsString)>,
    templates: Vec<PathBuf>,
}

impl Targets {
    fn new(file: Option<&Path>, dirs: &TemplateDirs) -> Self {
        // Events name absolute paths.
        let config = file.and_then(|file| {
            let file = std::path::absolute(file).ok()?;
            Some((
                file.parent()?.to_path_buf(),
                file.file_name()?.to_os_string(),
            ))
        });
        let templates = [&dirs.sms, &dirs.email]
            .into_iter()
            .flatten()
            .filter_map(|dir| std::path::absolute(dir).ok())
            .collect();
        Self { config, templates }
    }

    /// The paths to watch, with how.
    fn watched(&self) -> Vec<(PathBuf, RecursiveMode)> {
        let config = self
            .config
            .iter()
            .map(|(dir, _)| (dir.clone(), RecursiveMode::NonRecursive));
        let templates = self
            .templates
            .iter()
            .map(|dir| (dir.clone(), RecursiveMode::Recursive));
        config.chain(templates).collect()
    }

    /// Whether an event on `path` may have changed what a reload reads: the
    /// config file itself, a `..data`-style link beside it, or anything in a
    /// templates directory. Events on other files beside the config (an
    /// SQLite audit file, say) are not.
    fn concerns(&self, path: &Path) -> bool {
        if self.templates.iter().any(|dir| path.starts_with(dir)) {
            return true;
        }
        let Some((dir, name)) = &self.config else {
            return false;
        };
        let beside = path.parent().is_some_and(|parent| same_dir(parent, dir));
        let file_name = path.file_name();
        beside
            && (file_name == Some(name.as_os_str())
                || file_name.is_some_and(|n| n.to_string_lossy().starts_with("..")))
    }
}

/// The same directory, maybe through a link.
fn same_dir(a: &Path, b: &Path) -> bool {
    a == b
        || match (a.canonicalize(), b.canonicalize()) {
            (Ok(a), Ok(b)) => a == b,
            _ => false,
        }
}

/// What the watch tells the reload task: that something changed, and
/// whether the last change was a write in place not yet closed.
#[derive(Debug, Default)]
pub(super) struct Changes {
    /// Woken on every event that concerns the targets.
    pub(super) wake: Notify,
    unclosed: AtomicBool,
    /// Whether this watch ever reported a writer's close: then every
    /// write in place is followed by one, and a write alone waits for it.
    closes_reported: AtomicBool,
}

impl Changes {
    /// Whether the last event was a write in place whose writer has not
    /// closed the file since.
    pub(super) fn unclosed(&self) -> bool {
        self.unclosed.load(Ordering::Relaxed)
    }

    pub(super) fn saw(&self, unclosed_write: bool) {
        self.unclosed.store(unclosed_write, Ordering::Relaxed);
        self.wake.notify_one();
    }
}

/// The OS watch (inotify on Linux) on the config's directory and the
/// templates directories.
pub(super) struct FileWatch {
    watcher: RecommendedWatcher,
    targets: Arc<RwLock<Targets>>,
    armed: Vec<PathBuf>,
}

impl FileWatch {
    /// A watch that wakes `changed` on every event that concerns its targets;
    /// it watches nothing until [`FileWatch::arm`].
    pub(super) fn new(changed: Arc<Changes>) -> notify::Result<Self> {
        let targets = Arc::new(RwLock::new(Targets::default()));
        let seen = targets.clone();
        let watcher = notify::recommended_watcher(move |event: notify::Result<Event>| {
            // An error or an overflowed queue may hide a change: look.
            let event = match event {
                Ok(event) if !event.need_rescan() => event,
                _ => {
                    changed.saw(false);
                    return;
                }
            };
            // Reads, ours included, open and close files: only writes count.
            if let EventKind::Access(kind) = event.kind {
                if kind != AccessKind::Close(AccessMode::Write) {
                    return;
                }
                changed.closes_reported.store(true, Ordering::Relaxed);
            }
            // A write in place counts once the writer closes the file
            // (inotify says so): read after a pause mid-write, a valid
            // prefix would be put in force. Until this watch has reported
            // a close, a write alone waits longer for quiet
            // (`UNCLOSED_SETTLE`): a setup whose events carry writes but
            // no close must still reload. Where no close is ever reported
            // (not Linux), the writes wake the reload as any change.
            let unclosed = cfg!(target_os = "linux")
                && matches!(event.kind, EventKind::Modify(ModifyKind::Data(_)));
            if unclosed && changed.closes_reported.load(Ordering::Relaxed) {
                return;
            }
            let targets = seen.read();
            if event.paths.iter().any(|path| targets.concerns(path)) {
                changed.saw(unclosed);
            }
        })?;
        Ok(Self {
            watcher,
            targets,
            armed: Vec::new(),
        })
    }

    /// Watch `file`'s directory and `dirs`, and nothing else. A path that
    /// cannot be watched (a directory not there yet) is logged and skipped.
    pub(super) fn arm(&mut self, file: Option<&Path>, dirs: &TemplateDirs) {
        for path in self.armed.drain(..) {
            // Gone with its directory, or never armed: nothing to undo.
            let _ = self.watcher.unwatch(&path);
        }
        let targets = Targets::new(file, dirs);
        for (path, mode) in targets.watched() {
            match self.watcher.watch(&path, mode) {
                Ok(()) => self.armed.push(path),
                Err(e) => {
                    tracing::warn!(path = %path.display(), error = %e, "cannot watch for changes; SIGHUP still reloads")
                }
            }
        }
        *self.targets.write() = targets;
    }
}

/// A hash of everything a reload reads from files: the config file and
/// every template file (links followed, the names the loader skips
/// skipped). Equal fingerprints: a reload would change nothing.
pub(super) fn fingerprint(file: Option<&Path>, dirs: &TemplateDirs) -> u64 {
    let mut hasher = DefaultHasher::new();
    if let Some(file) = file {
        read(file, crate::settings::MAX_CONFIG_BYTES).hash(&mut hasher);
    }
    for dir in [&dirs.sms, &dirs.email].into_iter().flatten() {
        hash_tree(dir, MAX_DEPTH, &mut hasher);
    }
    hasher.finish()
}

fn hash_tree(dir: &Path, depth: usize, hasher: &mut DefaultHasher) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        "unreadable".hash(hasher);
        return;
    };
    let mut paths: Vec<PathBuf> = entries
        .filter_map(Result::ok)
        .map(|entry| entry.path())
        .filter(|path| {
            !path
                .file_name()
                .is_some_and(|n| crate::delivery::skipped_template_name(&n.to_string_lossy()))
        })
        .collect();
    paths.sort();
    for path in paths {
        path.hash(hasher);
        if path.is_dir() {
            if depth > 0 {
                hash_tree(&path, depth - 1, hasher);
            }
        } else {
            read(&path, crate::delivery::MAX_TEMPLATE_BYTES).hash(hasher);
        }
    }
}

/// A file's bytes for the fingerprint, or why they cannot be read (a FIFO
/// is not waited on: the watch would stop with it).
fn read(path: &Path, limit: u64) -> Result<Vec<u8>, std::io::ErrorKind> {
    crate::regular_file::read(path, limit).map_err(|e| e.kind())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_config_file_and_links_beside_it_concern_the_config_watch() {
        let dirs = TemplateDirs {
            sms: Some(PathBuf::from("/srv/sms")),
            email: None,
        };
        let targets = Targets::new(Some(Path::new("/etc/tollgate/tollgate.toml")), &dirs);
        assert!(targets.concerns(Path::new("/etc/tollgate/tollgate.toml")));
        assert!(targets.concerns(Path::new("/etc/tollgate/..data")));
        assert!(targets.concerns(Path::new("/srv/sms/fr.txt")));
        assert!(!targets.concerns(Path::new("/etc/tollgate/audit.db")));
        assert!(!targets.concerns(Path::new("/etc/tollgate/tollgate.toml.swp")));
        assert!(!targets.concerns(Path::new("/etc/other/tollgate.toml")));
        assert_eq!(
            targets.watched(),
            [
                (PathBuf::from("/etc/tollgate"), RecursiveMode::NonRecursive),
                (PathBuf::from("/srv/sms"), RecursiveMode::Recursive),
            ]
        );
    }

    #[test]
    fn a_config_named_without_a_directory_is_watched_in_the_working_directory() {
        let targets = Targets::new(Some(Path::new("tollgate.toml")), &TemplateDirs::default());
        let cwd = std::env::current_dir().unwrap();
        assert_eq!(targets.watched(), [(cwd, RecursiveMode::NonRecursive)]);
    }

    #[test]
    fn the_fingerprint_follows_contents_not_reads() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("tollgate.toml");
        let sms = dir.path().join("sms");
        std::fs::create_dir(&sms).unwrap();
        std::fs::write(&file, "[sms]\n").unwrap();
        std::fs::write(sms.join("fr.txt"), "Code {{ code }}").unwrap();
        let dirs = TemplateDirs {
            sms: Some(sms.clone()),
            email: None,
        };
        let before = fingerprint(Some(&file), &dirs);
        assert_eq!(before, fingerprint(Some(&file), &dirs));
        std::fs::write(sms.join("fr.txt"), "Votre code {{ code }}").unwrap();
        let after = fingerprint(Some(&file), &dirs);
        assert_ne!(before, after);
        std::fs::write(sms.join(".hidden"), "x").unwrap();
        assert_eq!(after, fingerprint(Some(&file), &dirs));
        std::fs::write(&file, "[login]\n").unwrap();
        assert_ne!(after, fingerprint(Some(&file), &dirs));
    }
}
