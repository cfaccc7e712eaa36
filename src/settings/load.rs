//! Loading: the embedded defaults, then the file, then `TOLLGATE__…`
//! variables, validated once; and the error that names the offending key.

use std::path::Path;

use figment::providers::{Format, Toml};
use figment::{Figment, Profile, Provider};

use super::env::TypedEnv;
use super::{Settings, DEFAULTS};

/// Why the settings were refused, at start-up or on SIGHUP.
#[derive(Debug, thiserror::Error)]
pub enum SettingsError {
    /// The file named by `--config` / `TOLLGATE_CONFIG` is not there.
    #[error("config file {0} does not exist")]
    MissingFile(String),
    /// A source could not be read or merged, and no single key is to blame
    /// (a TOML syntax error, say).
    #[error("{0}")]
    Load(Box<figment::Error>),
    /// A value is missing, malformed or out of range.
    #[error("invalid setting `{key}`: {message}")]
    Invalid {
        /// The setting, as a config file spells it (`sms.code_ttl`).
        key: String,
        /// What is wrong with it.
        message: String,
    },
}

impl SettingsError {
    pub(crate) fn invalid(key: &str, message: impl Into<String>) -> Self {
        Self::Invalid {
            key: key.to_string(),
            message: message.into(),
        }
    }
}

impl Settings {
    /// The embedded defaults, validated.
    pub fn defaults() -> Result<Self, SettingsError> {
        Self::from_figment(Figment::from(Toml::string(DEFAULTS)))
    }

    /// Defaults, then `file` (when given), then `TOLLGATE__SECTION__KEY` variables.
    pub fn load(file: Option<&Path>) -> Result<Self, SettingsError> {
        let mut figment = Figment::from(Toml::string(DEFAULTS));
        if let Some(path) = file {
            if !path.is_file() {
                return Err(SettingsError::MissingFile(path.display().to_string()));
            }
            figment = figment.merge(Toml::file(path));
        }
        let defaults = Toml::string(DEFAULTS)
            .data()
            .map_err(|e| SettingsError::Load(Box::new(e)))?
            .remove(&Profile::Default)
            .unwrap_or_default();
        figment = figment.merge(TypedEnv::new(defaults));
        Self::from_figment(figment)
    }

    fn from_figment(figment: Figment) -> Result<Self, SettingsError> {
        let settings: Settings = figment.extract().map_err(load_error)?;
        settings.validate()?;
        Ok(settings)
    }

    /// The effective settings as TOML, secrets shown as `"***"`.
    pub fn to_redacted_toml(&self) -> String {
        toml::to_string_pretty(self).unwrap_or_else(|e| format!("# cannot print settings: {e}"))
    }
}

/// `["email", "admin_alerts_to", "1"]` → `email.admin_alerts_to[1]`.
fn config_key(path: &[String]) -> String {
    let mut key = String::new();
    for part in path {
        if part.bytes().all(|b| b.is_ascii_digit()) && !key.is_empty() {
            key.push_str(&format!("[{part}]"));
        } else {
            if !key.is_empty() {
                key.push('.');
            }
            key.push_str(&part.to_lowercase());
        }
    }
    key
}

/// Names the key as a config file spells it (`sms.code_ttl`), whether the bad
/// value came from the file or from `TOLLGATE__SMS__CODE_TTL`.
fn load_error(error: figment::Error) -> SettingsError {
    if error.path.is_empty() {
        return SettingsError::Load(Box::new(error));
    }
    let key = config_key(&error.path);
    let source = error
        .metadata
        .as_ref()
        .map(|m| format!(" (from {})", m.name))
        .unwrap_or_default();
    SettingsError::Invalid {
        key,
        message: format!("{}{source}", error.kind),
    }
}
