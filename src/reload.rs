//! SIGHUP: re-read the config file and swap in the decision settings
//! (`[sms]`, `[login]`, `[shadow]`) without dropping a request. A bad file is
//! logged and the old settings stay.

use std::path::PathBuf;
use std::sync::Arc;

use crate::guard::{Policy, PolicyCell};
use crate::settings::Settings;

pub fn reload_into(
    policy: &PolicyCell,
    file: Option<&std::path::Path>,
) -> Result<(), crate::settings::SettingsError> {
    let settings = Settings::load(file)?;
    policy.replace(Policy::from_settings(&settings));
    Ok(())
}

#[cfg(unix)]
pub fn spawn_on_sighup(policy: Arc<PolicyCell>, file: Option<PathBuf>) -> std::io::Result<()> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut hangups = signal(SignalKind::hangup())?;
    tokio::spawn(async move {
        while hangups.recv().await.is_some() {
            match reload_into(&policy, file.as_deref()) {
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
pub fn spawn_on_sighup(_policy: Arc<PolicyCell>, _file: Option<PathBuf>) -> std::io::Result<()> {
    Ok(())
}
