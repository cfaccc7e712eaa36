//! SIGHUP: re-read the config file and swap in the decision settings
//! (`[sms]`, `[login]`, `[captcha]`, `[shadow]`) and the config file's list
//! entries (`[lists]`) without dropping a request:
//! requests in flight finish with the policy they started with. A bad file is
//! logged and the old settings stay. Other sections need a restart.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::guard::{Policy, PolicyCell};
use crate::lists::Lists;
use crate::settings::Settings;

#[derive(Debug, thiserror::Error)]
pub enum ReloadError {
    #[error(transparent)]
    Settings(#[from] crate::settings::SettingsError),
    #[error("cannot build the captcha client: {0}")]
    Captcha(#[from] reqwest::Error),
}

pub fn reload_into(
    policy: &PolicyCell,
    lists: &Lists,
    file: Option<&Path>,
) -> Result<(), ReloadError> {
    let settings = Settings::load(file)?;
    policy.replace(Policy::from_settings(&settings)?);
    lists.replace_config(&settings.lists);
    Ok(())
}

#[cfg(unix)]
pub fn spawn_on_sighup(
    policy: Arc<PolicyCell>,
    lists: Arc<Lists>,
    file: Option<PathBuf>,
) -> std::io::Result<()> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut hangups = signal(SignalKind::hangup())?;
    tokio::spawn(async move {
        while hangups.recv().await.is_some() {
            match reload_into(&policy, &lists, file.as_deref()) {
                Ok(()) => tracing::info!("SIGHUP: decision settings reloaded"),
                Err(e) => {
                    tracing::error!(error = %e, "SIGHUP: config rejected, keeping the old settings")
                }
            }
        }
    });
    Ok(())
}

#[cfg(not(unix))]
pub fn spawn_on_sighup(
    _policy: Arc<PolicyCell>,
    _lists: Arc<Lists>,
    _file: Option<PathBuf>,
) -> std::io::Result<()> {
    Ok(())
}
