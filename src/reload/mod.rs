//! Reloading while serving: on SIGHUP, and when the config file or a
//! templates directory changes (`server.watch_config`, on by default), the
//! config file is read again and the decision settings (`[sms]`, `[login]`,
//! `[captcha]`, `[shadow]`), the config file's list entries (`[lists]`) and
//! the SMS and email templates are swapped in without dropping a request:
//! requests in flight finish with what they started with. A bad file or
//! template is logged and everything old stays. Other sections need a restart.

mod watch;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Notify;

use crate::delivery::{TemplateDirs, TemplateLoadError, Templates, TemplatesCell};
use crate::guard::{Policy, PolicyCell};
use crate::lists::Lists;
use crate::settings::Settings;
use watch::{fingerprint, FileWatch};

/// Changes closer together than this are one reload: an editor's save, or a
/// ConfigMap's swap, is several file events.
const SETTLE: Duration = Duration::from_millis(200);

#[derive(Debug, thiserror::Error)]
pub enum ReloadError {
    #[error(transparent)]
    Settings(#[from] crate::settings::SettingsError),
    #[error("template {0}")]
    Templates(#[from] TemplateLoadError),
    #[error("cannot build the captcha client: {0}")]
    Captcha(#[from] reqwest::Error),
}

/// What a reload replaces, each swapped whole.
#[derive(Clone)]
pub struct Reloadable {
    pub policy: Arc<PolicyCell>,
    pub lists: Arc<Lists>,
    pub templates: Arc<TemplatesCell>,
}

impl Reloadable {
    /// Read `file` (over the defaults and the environment, as at start-up)
    /// and the templates it names; swap them all in only when every part is
    /// good. Returns the settings read.
    pub fn reload(&self, file: Option<&Path>) -> Result<Settings, ReloadError> {
        let settings = Settings::load(file)?;
        let templates = Templates::load(&TemplateDirs::of(&settings))?;
        let policy = Policy::from_settings(&settings)?;
        self.policy.replace(policy);
        self.lists.replace_config(&settings.lists);
        self.templates.replace(templates);
        Ok(settings)
    }
}

/// Why a reload ran, as logged.
#[derive(Debug, Clone, Copy)]
enum Cause {
    Hangup,
    FileChanged,
}

/// Reload on SIGHUP and, when `watch` is set, on changes to `file` and the
/// templates directories `settings` names. A change that leaves every watched
/// file's content as it was (a `touch`, a read) reloads nothing.
pub fn spawn(
    reloadable: Reloadable,
    file: Option<PathBuf>,
    settings: &Settings,
) -> std::io::Result<()> {
    let mut hangups = Hangups::new()?;
    let changed = Arc::new(Notify::new());
    let mut dirs = TemplateDirs::of(settings);
    let mut watch = match settings.server.watch_config {
        true => Some(FileWatch::new(changed.clone()).map_err(std::io::Error::other)?),
        false => None,
    };
    if let Some(watch) = &mut watch {
        watch.arm(file.as_deref(), &dirs);
    }
    tokio::spawn(async move {
        let mut last = fingerprint(file.as_deref(), &dirs);
        loop {
            let cause = tokio::select! {
                () = hangups.next() => Cause::Hangup,
                () = settled(&changed) => Cause::FileChanged,
            };
            let now = fingerprint(file.as_deref(), &dirs);
            if matches!(cause, Cause::FileChanged) && now == last {
                continue;
            }
            last = now;
            match reloadable.reload(file.as_deref()) {
                Ok(settings) => {
                    tracing::info!(cause = ?cause, "settings reloaded");
                    dirs = TemplateDirs::of(&settings);
                    last = fingerprint(file.as_deref(), &dirs);
                }
                Err(e) => {
                    tracing::error!(cause = ?cause, error = %e, "config rejected, keeping the old settings")
                }
            }
            // Watch again: the templates directories may have moved, and a
            // directory replaced whole is not the one watched any more.
            if let Some(watch) = &mut watch {
                watch.arm(file.as_deref(), &dirs);
            }
        }
    });
    Ok(())
}

/// The first change, then quiet for `SETTLE`.
async fn settled(changed: &Notify) {
    changed.notified().await;
    while tokio::time::timeout(SETTLE, changed.notified())
        .await
        .is_ok()
    {}
}

/// SIGHUPs, where there are signals.
struct Hangups {
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
