//! Typed settings: the compiled-in defaults, a TOML file and
//! `TOLLGATE__SECTION__KEY` environment variables, layered in that order and
//! validated once at start-up. Every error names the offending key.

mod duration;
mod secret;
mod validate;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use figment::providers::{Env, Format, Toml};
use figment::Figment;
use serde::{Deserialize, Serialize};

pub use secret::{Secret, SecretUrl};

const DEFAULTS: &str = include_str!("defaults.toml");

#[derive(Debug, thiserror::Error)]
pub enum SettingsError {
    #[error("config file {0} does not exist")]
    MissingFile(String),
    #[error("{0}")]
    Load(Box<figment::Error>),
    #[error("invalid setting `{key}`: {message}")]
    Invalid { key: String, message: String },
}

impl SettingsError {
    pub(crate) fn invalid(key: &str, message: impl Into<String>) -> Self {
        Self::Invalid {
            key: key.to_string(),
            message: message.into(),
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Settings {
    pub server: ServerSettings,
    pub store: StoreSettings,
    pub audit: AuditSettings,
    pub sms: SmsSettings,
    pub login: LoginSettings,
    pub captcha: CaptchaSettings,
    pub email: EmailSettings,
    pub shadow: ShadowSettings,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServerSettings {
    /// Address the HTTP server listens on.
    pub bind: SocketAddr,
    /// CIDRs (or single addresses) of proxies whose `X-Forwarded-For` is honoured.
    pub trusted_proxies: Vec<String>,
    /// When non-empty, `/sms/*` and `/login/*` need `Authorization: Bearer <key>`.
    pub api_keys: Vec<Secret>,
    /// Bearer tokens for `/admin`; empty means every admin route answers 401.
    pub admin_tokens: Vec<Secret>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum StoreBackend {
    Memory,
    Redis,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OnStoreError {
    /// Fail closed: answer 503 `store_unavailable`.
    Deny,
    /// Fail open: let the request through uncounted.
    Allow,
    /// Decide with the in-process store until Redis answers again.
    Local,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StoreSettings {
    pub backend: StoreBackend,
    /// `redis://host:port` or `redis-cluster://h1:p1,h2:p2`.
    pub redis_url: SecretUrl,
    /// Prefix of every Redis key; several deployments may share one Redis.
    pub key_prefix: String,
    pub on_error: OnStoreError,
    /// Upper bound of one Redis call.
    #[serde(with = "duration")]
    pub timeout: Duration,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AuditSettings {
    /// `sqlite://file?mode=rwc` or `postgres://...`.
    pub database_url: SecretUrl,
    pub batch_size: usize,
    #[serde(with = "duration")]
    pub flush_interval: Duration,
    pub spool_dir: String,
    pub queue_capacity: usize,
    #[serde(with = "duration")]
    pub retention: Duration,
}

/// One sliding window of a rule: at most `limit` events per `window`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LimitSetting {
    pub limit: u32,
    #[serde(with = "duration")]
    pub window: Duration,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SmsSettings {
    pub code_length: u32,
    #[serde(with = "duration")]
    pub code_ttl: Duration,
    /// HMAC key for stored codes. Empty: one random key is created in the store
    /// and shared by every instance; set it in production.
    pub code_secret: Secret,
    pub max_verify_attempts: u32,
    /// ISO 3166 alpha-2 codes; empty allows every region.
    pub allowed_regions: Vec<String>,
    pub denied_regions: Vec<String>,
    /// Sends per phone or IP within `captcha_window` after which a captcha is needed.
    pub captcha_after: u32,
    #[serde(with = "duration")]
    pub captcha_window: Duration,
    pub phone_limits: Vec<LimitSetting>,
    pub ip_limits: Vec<LimitSetting>,
    /// Leading digits of the E.164 number (country code included) forming the prefix subject.
    pub prefix_digits: u32,
    pub prefix_limits: Vec<LimitSetting>,
    pub global_limits: Vec<LimitSetting>,
    pub provider: SmsProviderSettings,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SmsProviderKind {
    Log,
    Webhook,
    Twilio,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SmsProviderSettings {
    pub kind: SmsProviderKind,
    /// Webhook target, or the Twilio API base URL.
    pub url: String,
    pub account_sid: String,
    pub auth_token: Secret,
    pub from: String,
    /// Extra headers of webhook requests.
    pub headers: BTreeMap<String, Secret>,
    /// Upper bound of one provider call (connect, send, answer); never retried.
    #[serde(with = "duration", default = "default_provider_timeout")]
    pub timeout: Duration,
}

fn default_provider_timeout() -> Duration {
    Duration::from_secs(5)
}

fn default_locale() -> String {
    "en".to_string()
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LoginSettings {
    pub captcha_after: u32,
    #[serde(with = "duration")]
    pub captcha_window: Duration,
    pub lock_after: u32,
    #[serde(with = "duration")]
    pub lock_window: Duration,
    #[serde(with = "duration")]
    pub lock_duration: Duration,
    #[serde(with = "duration")]
    pub lock_max_duration: Duration,
    pub reset_on_success: bool,
    pub ip_captcha_after: u32,
    pub ip_block_after: u32,
    #[serde(with = "duration")]
    pub ip_window: Duration,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CaptchaKind {
    None,
    Turnstile,
    Hcaptcha,
    Recaptcha,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CaptchaSettings {
    pub kind: CaptchaKind,
    pub secret: Secret,
    /// Overrides the provider's siteverify address.
    pub verify_url: String,
    /// Upper bound of one siteverify call; a timeout counts as not passed.
    #[serde(with = "duration", default = "default_provider_timeout")]
    pub timeout: Duration,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EmailSettings {
    /// `smtp://host:port`; empty disables email.
    pub smtp_url: SecretUrl,
    pub from: String,
    pub admin_alerts_to: Vec<String>,
    pub alert_threshold: u32,
    #[serde(with = "duration")]
    pub alert_window: Duration,
    #[serde(with = "duration")]
    pub alert_interval: Duration,
    /// Locale of the admin alert digests (`templates/email/<locale>/`).
    #[serde(default = "default_locale")]
    pub admin_locale: String,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ShadowSettings {
    /// Decide and audit (`shadow = true`) but let everything through.
    pub enabled: bool,
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
        figment = figment.merge(Env::prefixed("TOLLGATE__").split("__"));
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

/// Names the key as a config file spells it (`sms.code_ttl`), whether the bad
/// value came from the file or from `TOLLGATE__SMS__CODE_TTL`.
fn load_error(error: figment::Error) -> SettingsError {
    if error.path.is_empty() {
        return SettingsError::Load(Box::new(error));
    }
    let key = error.path.join(".").to_lowercase();
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
