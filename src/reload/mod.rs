//! Reloading while serving: on SIGHUP, and when the config file or a
//! templates directory changes (`server.watch_config`, on by default), the
//! config file is read again and the decision settings (`[sms]`, `[login]`,
//! `[captcha]`, `[shadow]`), the SMS provider (`[sms.provider]`), the config
//! file's list entries (`[lists]`) and the SMS and email templates are
//! swapped in without dropping a request: requests in flight finish with
//! what they started with. A bad file or template is logged and everything
//! old stays. Other sections need a restart, and a reload that changes them
//! says so ([`restart::pending`]).

mod loosened;
mod restart;
mod sender;
mod watch;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use crate::delivery::{SetupError, TemplateDirs, TemplateLoadError, Templates, TemplatesCell};
use crate::guard::{Policy, PolicyCell};
use crate::lists::Lists;
use crate::settings::{Settings, SettingsError};
pub use sender::SenderSlot;
use watch::{fingerprint, Changes, FileWatch};

/// Changes closer together than this are one reload: an editor's save, or a
/// ConfigMap's swap, is several file events.
const SETTLE: Duration = Duration::from_millis(200);

/// How long a file written in place and not closed (as far as the events
/// tell) stays quiet before it is read: a writer that pauses mid-write
/// this long is rare, and a setup whose events forward writes but no
/// close (some shared or virtual file systems) must still reload.
const UNCLOSED_SETTLE: Duration = Duration::from_secs(5);

/// Why a reload kept everything old.
#[derive(Debug, thiserror::Error)]
pub enum ReloadError {
    /// The config file cannot be read, or a setting in it is wrong.
    #[error(transparent)]
    Settings(#[from] crate::settings::SettingsError),
    /// A templates directory or one of its templates cannot be used.
    #[error("template {0}")]
    Templates(#[from] TemplateLoadError),
    /// The config file holds no setting at all (a truncated file, or one
    /// being written in place): reloading it would reset everything.
    #[error("config file {0} is empty (a file being rewritten?); an empty file would reset every setting")]
    EmptyFile(String),
    /// The new `[captcha]` settings do not make an HTTP client.
    #[error("cannot build the captcha client: {0}")]
    Captcha(#[from] reqwest::Error),
    /// The new `[sms.provider]` settings do not make a provider.
    #[error("cannot set up the SMS provider: {0}")]
    SmsProvider(#[from] SetupError),
    /// The file would switch a real SMS provider to `log` (or leaves out
    /// `[sms.provider]`, whose default is `log`).
    #[error("invalid setting `sms.provider.kind`: \"log\" would write every code to the log in place of the provider in force (a [sms.provider] table left out?); restart to switch to it")]
    ToLogProvider,
}

/// What a reload replaces, each swapped whole.
#[derive(Clone)]
pub struct Reloadable {
    /// The decision settings: `[sms]`, `[login]`, `[captcha]`, `[shadow]`.
    pub policy: Arc<PolicyCell>,
    /// The lists; a reload replaces only the config file's entries.
    pub lists: Arc<Lists>,
    /// The SMS and email templates.
    pub templates: Arc<TemplatesCell>,
    /// The SMS provider, made again when `[sms.provider]` changes; `None`
    /// when it was given rather than made from the settings (tests).
    pub sender: Option<SenderSlot>,
}

impl Reloadable {
    /// Read `file` (over the defaults and the environment, as at start-up)
    /// and the templates it names; swap them all in only when every part is
    /// good. Returns the settings read.
    pub fn reload(&self, file: Option<&Path>) -> Result<Settings, ReloadError> {
        self.apply(Self::read(file)?)
    }

    /// The settings `file` holds over the defaults and the environment: a
    /// regular file of at most [`crate::settings::MAX_CONFIG_BYTES`].
    pub fn read(file: Option<&Path>) -> Result<Settings, ReloadError> {
        Ok(match file {
            // The text checked is the text loaded: read once. A file that
            // cannot be read is refused as it is, not read a second time
            // (which a file recreated empty meanwhile would pass unchecked).
            Some(path) => {
                let text =
                    crate::regular_file::read_to_string(path, crate::settings::MAX_CONFIG_BYTES)
                        .map_err(|e| match e.kind() {
                            std::io::ErrorKind::NotFound => {
                                SettingsError::MissingFile(path.display().to_string())
                            }
                            _ => {
                                SettingsError::Load(format!("config file {}: {e}", path.display()))
                            }
                        })?;
                refuse_empty(path, &text)?;
                Settings::load_text(path, &text)?
            }
            None => Settings::load(None)?,
        })
    }

    /// Swap in `settings` and the templates they name, only when every
    /// part is good; returns them.
    pub fn apply(&self, settings: Settings) -> Result<Settings, ReloadError> {
        let templates = Templates::load(&TemplateDirs::of(&settings))?;
        let policy = Policy::from_settings(&restart_only_kept(&settings, &self.policy))?;
        let sender = match &self.sender {
            Some(slot) => slot.remake(&settings.sms.provider)?.map(|new| (slot, new)),
            None => None,
        };
        self.policy.replace(policy);
        if let Some((slot, new)) = sender {
            slot.put(new);
        }
        self.lists.replace_config(settings.lists.entries());
        self.templates.replace(templates);
        Ok(settings)
    }
}

/// `read` with the decision settings a reload cannot apply put back to the
/// running policy's. `sms.prefix_digits` cuts the phone ranges of the
/// prefix windows, the pumping guard and the audit rollups alike: applied
/// to the first two at once, a changed value would start every prefix's
/// windows from zero and leave the rollups cutting ranges the rules no
/// longer name, while the log says it waits for a restart.
/// `sms.network_bits` names every IPv6 network subject (the send, verify,
/// failed-delivery and login network windows): changed mid-window, each
/// would start from zero, and the admin's look-ups at the old length would
/// find nothing.
fn restart_only_kept(read: &Settings, running: &PolicyCell) -> Settings {
    let mut kept = read.clone();
    let running = running.current();
    kept.sms.prefix_digits = running.sms.settings.prefix_digits;
    kept.sms.network_bits = running.sms.settings.network_bits;
    kept
}

/// An empty config file (nothing but blank lines and comments) is valid
/// TOML that would put every setting back to its default, lifting the
/// file's block lists and limits; it is what a writer that truncates the
/// file in place leaves for a moment, so a reload refuses it. (At start-up
/// an empty file means the defaults, as it says.)
fn refuse_empty(path: &Path, text: &str) -> Result<(), ReloadError> {
    let empty = text
        .lines()
        .map(str::trim)
        .all(|line| line.is_empty() || line.starts_with('#'));
    if empty {
        return Err(ReloadError::EmptyFile(path.display().to_string()));
    }
    Ok(())
}

/// Why a reload ran, as logged.
#[derive(Debug, Clone, Copy)]
enum Cause {
    Hangup,
    FileChanged,
}

/// What reloads a running service: SIGHUP and, with `server.watch_config`,
/// changes to the config file and the templates directories. Made in steps
/// around start-up so that nothing sent during it is lost.
pub struct Reloader {
    file: Option<PathBuf>,
    hangups: Hangups,
    changed: Arc<Changes>,
    watch: Option<FileWatch>,
    dirs: TemplateDirs,
    /// The settings the service starts with, for what a reload cannot apply.
    running: Option<Box<Settings>>,
}

impl Reloader {
    /// First thing, before the config is read: from here on SIGHUP is caught
    /// (its default action would end the process, and a service manager may
    /// send it as soon as the process exists) and held until the service
    /// runs, and the config file's directory is watched, so an edit made while
    /// starting is reloaded once it runs. A watch that cannot be set up (no
    /// inotify instance left, say) is logged: SIGHUP still reloads.
    pub fn prepare(file: Option<PathBuf>) -> std::io::Result<Self> {
        let hangups = Hangups::new()?;
        let changed = Arc::new(Changes::default());
        let mut watch = FileWatch::new(changed.clone())
            .inspect_err(
                |e| tracing::warn!(error = %e, "cannot watch for changes; SIGHUP still reloads"),
            )
            .ok();
        let dirs = TemplateDirs::default();
        if let Some(watch) = &mut watch {
            watch.arm(file.as_deref(), &dirs);
        }
        Ok(Self {
            file,
            hangups,
            changed,
            watch,
            dirs,
            running: None,
        })
    }

    /// Once the settings are read, before anything is built from them: watch
    /// the templates directories they name too, or nothing when
    /// `server.watch_config` is off.
    pub fn watch_settings(&mut self, settings: &Settings) {
        self.running = Some(Box::new(settings.clone()));
        self.dirs = TemplateDirs::of(settings);
        if !settings.server.watch_config {
            self.watch = None;
            // Events seen before this are not to reload either.
            self.changed = Arc::new(Changes::default());
        }
        if let Some(watch) = &mut self.watch {
            watch.arm(self.file.as_deref(), &self.dirs);
        }
    }

    /// Serve reloads into `reloadable` from now on. A change that leaves every
    /// watched file's content as the last reload read it (a `touch`, a read)
    /// reloads nothing.
    pub fn start(self, reloadable: Reloadable) {
        let Self {
            file,
            mut hangups,
            changed,
            mut watch,
            mut dirs,
            running,
        } = self;
        tokio::spawn(async move {
            // None until the first reload: what start-up read is not known
            // byte for byte, so the first change always reloads.
            let mut last: Option<u64> = None;
            // The settings in force, to tell what a reload loosens.
            let mut applied: Option<Settings> = running.as_deref().cloned();
            loop {
                let cause = tokio::select! {
                    () = hangups.next() => Cause::Hangup,
                    () = settled(&changed, SETTLE, UNCLOSED_SETTLE) => Cause::FileChanged,
                };
                // Watch again first: a directory replaced whole (a deploy's
                // rename, a swapped link) is not the one watched any more,
                // even when what it holds is the same.
                if let Some(watch) = &mut watch {
                    watch.arm(file.as_deref(), &dirs);
                }
                // Taken before reading, so that a write landing during the
                // reload differs from it and reloads again.
                let now = fingerprint(file.as_deref(), &dirs);
                if matches!(cause, Cause::FileChanged) && last == Some(now) {
                    continue;
                }
                last = Some(now);
                let read = Reloadable::read(file.as_deref());
                // The directories a file names are where its next fix may
                // land, even when it is refused (a template's typo).
                let named = read.as_ref().ok().map(TemplateDirs::of);
                let reloaded = read.and_then(|settings| reloadable.apply(settings));
                crate::metrics::config_reload(reloaded.is_ok());
                match reloaded {
                    Ok(settings) => {
                        let waiting = running
                            .as_deref()
                            .map(|running| restart::pending(running, &settings))
                            .unwrap_or_default();
                        crate::metrics::config_restart_pending(waiting.len());
                        crate::settings::warnings::warn_of_risky_settings(&settings);
                        let looser = applied
                            .as_ref()
                            .map(|before| loosened::loosened(before, &settings))
                            .unwrap_or_default();
                        if !looser.is_empty() {
                            tracing::warn!(
                                cause = ?cause,
                                loosened = %looser.join(", "),
                                "a reload loosened protection"
                            );
                        }
                        if waiting.is_empty() {
                            tracing::info!(cause = ?cause, "settings reloaded");
                        } else {
                            tracing::warn!(
                                cause = ?cause,
                                restart_needed = %waiting.join(", "),
                                "settings reloaded; changes to these take effect at the next start"
                            );
                        }
                        applied = Some(settings);
                    }
                    Err(e) => {
                        tracing::error!(cause = ?cause, error = %e, "config rejected, keeping the old settings")
                    }
                }
                if let Some(named) = named.filter(|named| *named != dirs) {
                    dirs = named;
                    last = None;
                    if let Some(watch) = &mut watch {
                        watch.arm(file.as_deref(), &dirs);
                    }
                }
            }
        });
    }
}

/// The first change, then quiet for `settle`, or for `unclosed_settle`
/// while the last event was a write its writer has not closed.
async fn settled(changed: &Changes, settle: Duration, unclosed_settle: Duration) {
    changed.wake.notified().await;
    loop {
        let quiet = if changed.unclosed() {
            unclosed_settle
        } else {
            settle
        };
        if tokio::time::timeout(quiet, changed.wake.notified())
            .await
            .is_err()
        {
            return;
        }
    }
}

/// SIGHUPs, where there are signals.
pub struct Hangups {
    #[cfg(unix)]
    signal: tokio::signal::unix::Signal,
}

impl Hangups {
    fn new() -> std::io::Result<Self> {
        Ok(Self {
            #[cfg(unix)]
            signal: tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup())?,
        })
    }

    async fn next(&mut self) {
        #[cfg(unix)]
        if self.signal.recv().await.is_some() {
            return;
        }
        std::future::pending::<()>().await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;

    const SHORT: Duration = Duration::from_millis(20);
    const LONG: Duration = Duration::from_millis(400);

    #[tokio::test]
    async fn a_write_not_closed_waits_longer_for_quiet_and_a_close_does_not() {
        let changes = Changes::default();
        changes.saw(true);
        let started = Instant::now();
        settled(&changes, SHORT, LONG).await;
        assert!(started.elapsed() >= LONG, "{:?}", started.elapsed());

        changes.saw(true);
        changes.saw(false);
        let started = Instant::now();
        settled(&changes, SHORT, LONG).await;
        assert!(started.elapsed() < LONG, "{:?}", started.elapsed());
    }
}
