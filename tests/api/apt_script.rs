//! `scripts/apt.sh update` against the real apt-get: it waits for another
//! apt to let go of the package lists' lock, where a plain `apt-get update`
//! fails at once. apt-get reads its configuration from `APT_CONFIG`, so here
//! the lists, their lock and the cache are a temporary directory's and the
//! sources are none: no root, no network, and the system's apt untouched,
//! but the lock is apt's own (an `fcntl` write lock, which `flock` would not
//! conflict with) and the message matched is apt's own.

use std::fs::File;
use std::io::{BufRead, BufReader};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

const WAITING: &str = "apt: waiting for another apt to let go of the package lists";
/// apt.sh looks again every 5 s; this is many looks.
const PATIENCE: Duration = Duration::from_secs(60);

/// A private apt state: empty sources, lists and cache in `dir`.
struct AptState {
    dir: tempfile::TempDir,
    config: PathBuf,
}

impl AptState {
    fn new(sources: &str) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        for sub in ["lists/partial", "cache/archives/partial", "sources.list.d"] {
            std::fs::create_dir_all(root.join(sub)).unwrap();
        }
        std::fs::write(root.join("sources.list"), sources).unwrap();
        let config = root.join("apt.conf");
        let path = |sub: &str| root.join(sub).display().to_string();
        std::fs::write(
            &config,
            format!(
                "Dir::Etc::sourcelist \"{}\";\nDir::Etc::sourceparts \"{}\";\n\
                 Dir::State::Lists \"{}\";\nDir::Cache \"{}\";\n",
                path("sources.list"),
                path("sources.list.d"),
                path("lists"),
                path("cache"),
            ),
        )
        .unwrap();
        Self { dir, config }
    }

    fn lists_lock(&self) -> PathBuf {
        self.dir.path().join("lists/lock")
    }

    /// `scripts/apt.sh update` on this state, its stderr read line by line.
    fn update(&self, wait_secs: Option<&str>) -> (Child, mpsc::Receiver<String>) {
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/apt.sh");
        let mut command = Command::new(script);
        command
            .arg("update")
            .env("APT_CONFIG", &self.config)
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        match wait_secs {
            Some(secs) => command.env("TOLLGATE_APT_WAIT_SECS", secs),
            None => command.env_remove("TOLLGATE_APT_WAIT_SECS"),
        };
        let mut child = command
            .spawn()
            .expect("scripts/apt.sh runs (apt-get must be installed: a Debian system)");
        let stderr = child.stderr.take().unwrap();
        let (lines, received) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if lines.send(line).is_err() {
                    break;
                }
            }
        });
        (child, received)
    }
}

/// Holds `path` locked as apt locks it until dropped: an `fcntl` write lock
/// (per process, so the apt-get the script starts conflicts with it).
struct AptLock {
    _held: File,
}

impl AptLock {
    fn take(path: &Path) -> Self {
        let file = File::options()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(path)
            .unwrap();
        // SAFETY: a zeroed `flock` is a valid value; every field is plain data.
        let mut lock: libc::flock = unsafe { std::mem::zeroed() };
        lock.l_type = libc::F_WRLCK as libc::c_short;
        lock.l_whence = libc::SEEK_SET as libc::c_short;
        // SAFETY: the descriptor is open for as long as `file`, and `lock`
        // outlives the call.
        let taken = unsafe { libc::fcntl(file.as_raw_fd(), libc::F_SETLK, &lock) };
        assert_eq!(
            taken,
            0,
            "locking {path:?}: {}",
            std::io::Error::last_os_error()
        );
        Self { _held: file }
    }
}

/// Lines until one contains `wanted` (answered with everything read), or
/// `PATIENCE` passes or the script's stderr closes (a panic naming them).
fn read_until(lines: &mpsc::Receiver<String>, wanted: &str) -> Vec<String> {
    let deadline = Instant::now() + PATIENCE;
    let mut read = Vec::new();
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match lines.recv_timeout(left) {
            Ok(line) => {
                let found = line.contains(wanted);
                read.push(line);
                if found {
                    return read;
                }
            }
            Err(gone) => panic!("no line with {wanted:?} ({gone:?}); read {read:#?}"),
        }
    }
}

/// The script's exit status and the rest of its stderr, within `PATIENCE`.
fn finish(mut child: Child, lines: &mpsc::Receiver<String>) -> (bool, Vec<String>) {
    let deadline = Instant::now() + PATIENCE;
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("scripts/apt.sh still running after {PATIENCE:?}");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let rest = std::iter::from_fn(|| lines.recv_timeout(Duration::from_secs(5)).ok()).collect();
    (status.success(), rest)
}

#[test]
fn update_waits_for_the_package_lists_lock_then_succeeds() {
    let apt = AptState::new("");
    let lock = AptLock::take(&apt.lists_lock());
    let (mut child, lines) = apt.update(None);
    read_until(&lines, WAITING);
    assert!(
        child.try_wait().unwrap().is_none(),
        "the script ended while the lock was held"
    );
    drop(lock);
    let (ok, rest) = finish(child, &lines);
    assert!(ok, "failed once the lock was let go: {rest:#?}");
}

#[test]
fn update_gives_up_when_the_lock_is_held_past_the_wait() {
    let apt = AptState::new("");
    let _lock = AptLock::take(&apt.lists_lock());
    let (child, lines) = apt.update(Some("1"));
    let mut said = read_until(&lines, WAITING);
    let (ok, rest) = finish(child, &lines);
    said.extend(rest);
    assert!(!ok, "succeeded with the lists locked: {said:#?}");
    assert!(
        said.iter().any(|line| line.contains("Could not get lock")),
        "apt's own words: {said:#?}"
    );
    assert!(
        said.iter()
            .any(|line| line == "apt: the package lists stayed locked for 1s"),
        "{said:#?}"
    );
}

/// Anything but the lock fails at once with apt's message, no waiting.
#[test]
fn update_fails_at_once_on_any_other_error() {
    let apt = AptState::new("deb\n");
    let (child, lines) = apt.update(None);
    let (ok, said) = finish(child, &lines);
    assert!(!ok, "a malformed source list passed: {said:#?}");
    assert!(
        said.iter().any(|line| line.contains("Malformed")),
        "apt's message passed on: {said:#?}"
    );
    assert!(!said.iter().any(|line| line == WAITING), "{said:#?}");
}
