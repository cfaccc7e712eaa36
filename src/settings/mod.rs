//! Typed settings: the compiled-in defaults, a TOML file and
//! `TOLLGATE__SECTION__KEY` environment variables, layered in that order and
//! validated once at start-up. Every error names the offending key.

mod duration;
mod fraction;
mod lists;
mod load;
mod login;
mod parsed;
mod secret;
#[cfg(test)]
mod shipped_config;
mod validate;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};

pub use crate::domain::Algorithm;
pub use fraction::{percent, Fraction};
pub use lists::ListSettings;
pub use load::SettingsError;
pub use login::{LockScope, LoginSettings};
pub use secret::{Secret, SecretUrl};

const DEFAULTS: &str = include_str!("defaults.toml");

/// The whole configuration, one field per TOML section (DESIGN.md §5).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Settings {
    /// `[server]`: where to listen and who may call.
    pub server: ServerSettings,
    /// `[store]`: where windows, locks and codes are kept.
    pub store: StoreSettings,
    /// `[audit]`: the audit database and the path events take to it.
    pub audit: AuditSettings,
    /// `[sms]`: codes, regions and send limits. Reloaded on SIGHUP.
    pub sms: SmsSettings,
    /// `[login]`: failed-login thresholds. Reloaded on SIGHUP.
    pub login: LoginSettings,
    /// `[captcha]`: how a captcha proof is checked. Reloaded on SIGHUP.
    pub captcha: CaptchaSettings,
    /// `[email]`: SMTP, lockout notices and admin alerts.
    pub email: EmailSettings,
    /// `[shadow]`: decide and audit without enforcing. Reloaded on SIGHUP.
    pub shadow: ShadowSettings,
    /// `[lists]`: allow and block entries. Reloaded on SIGHUP.
    #[serde(default)]
    pub lists: ListSettings,
}

/// `[server]`: the listener and the credentials callers must present.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServerSettings {
    /// Address the HTTP server listens on.
    pub bind: SocketAddr,
    /// When set, `/admin`, `/admin/api/*` and `/metrics` are served on this
    /// address only (with `/healthz` and `/readyz`), and `bind` serves the
    /// rest; unset (the default), everything is on `bind`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub admin_bind: Option<SocketAddr>,
    /// Origins whose pages may call `/sms/send` and `/sms/verify` from the
    /// browser (`https://app.example.com`, or `*`); empty (the default): no
    /// CORS headers at all.
    #[serde(default)]
    pub cors_origins: Vec<String>,
    /// Reload when the config file or a templates directory changes, as on
    /// SIGHUP (default true).
    pub watch_config: bool,
    /// CIDRs (or single addresses) of proxies whose `X-Forwarded-For` is honoured.
    #[serde(with = "parsed::cidrs")]
    pub trusted_proxies: Vec<ipnet::IpNet>,
    /// When non-empty, `/sms/*` and `/login/*` need `Authorization: Bearer <key>`.
    pub api_keys: Vec<Secret>,
    /// Bearer tokens for `/admin`; empty means every admin route answers 401.
    pub admin_tokens: Vec<Secret>,
}

/// Where the window store lives (`store.backend`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum StoreBackend {
    /// In this process: one instance only, and state is lost on restart. The
    /// default.
    Memory,
    /// Redis or Redis Cluster at `store.redis_url`, shared by every instance.
    Redis,
}

/// What a decision does when a store call fails or times out (`store.on_error`).
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

/// `[store]`: the window store and what to do when it fails.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StoreSettings {
    /// `memory` (the default) or `redis`.
    pub backend: StoreBackend,
    /// `redis://host:port` or `redis-cluster://h1:p1,h2:p2`.
    pub redis_url: SecretUrl,
    /// Prefix of every Redis key; several deployments may share one Redis.
    pub key_prefix: String,
    /// `deny` (the default), `allow` or `local`.
    pub on_error: OnStoreError,
    /// Upper bound of one Redis call.
    #[serde(with = "duration")]
    pub timeout: Duration,
}

/// `[audit]`: the audit database and the queue, batches and spool in front of it.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AuditSettings {
    /// `sqlite://file?mode=rwc` or `postgres://...`.
    pub database_url: SecretUrl,
    /// Most events per insert; default 500.
    pub batch_size: usize,
    /// Longest a queued event waits for its batch to fill before it is written;
    /// default 200 ms.
    #[serde(with = "duration")]
    pub flush_interval: Duration,
    /// Directory of the spool file that holds events while the database is down
    /// or the queue is full; default `tollgate-spool`.
    pub spool_dir: String,
    /// Events held in memory before further ones go to the spool; default 10000.
    pub queue_capacity: usize,
    /// Rows older than this are deleted, at start-up and hourly; default 90 days.
    #[serde(with = "duration")]
    pub retention: Duration,
}

/// One sliding window of a rule: at most `limit` events per `window`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LimitSetting {
    /// Most events one window counts; must be positive.
    pub limit: u32,
    /// Length of the sliding window, e.g. `"60s"` or `"1h"`.
    #[serde(with = "duration")]
    pub window: Duration,
    /// Count and audit this window's would-be refusals (`shadow = true`),
    /// but refuse nothing by it: to try a new rule while the others enforce.
    #[serde(default, skip_serializing_if = "is_false")]
    pub shadow: bool,
    /// `sliding_log` (exact; the default) or `gcra` (a meter: `limit` at
    /// once, then one per `window / limit`, one value per subject).
    #[serde(default, skip_serializing_if = "Algorithm::is_default")]
    pub algorithm: Algorithm,
}

impl LimitSetting {
    /// At most `limit` events per `window`, enforced.
    pub fn new(limit: u32, window: Duration) -> Self {
        Self {
            limit,
            window,
            shadow: false,
            algorithm: Algorithm::SlidingLog,
        }
    }
}

fn is_false(value: &bool) -> bool {
    !*value
}

/// `[sms]`: one-time codes, region lists and the limits of `/sms/send`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SmsSettings {
    /// Digits per code, 4 to 10; default 6.
    pub code_length: u32,
    /// How long a sent code can be verified; default 5 minutes.
    #[serde(with = "duration")]
    pub code_ttl: Duration,
    /// HMAC key for stored codes. Empty: one random key is created in the store
    /// and shared by every instance; set it in production.
    pub code_secret: Secret,
    /// Wrong tries per code; the last one burns it (429 until a new send).
    /// Default 5.
    pub max_verify_attempts: u32,
    /// ISO 3166 alpha-2 codes; empty allows every region.
    pub allowed_regions: Vec<String>,
    /// ISO 3166 alpha-2 codes that never get a code; wins over `allowed_regions`.
    pub denied_regions: Vec<String>,
    /// Sends per phone or IP within `captcha_window` after which a captcha is needed.
    pub captcha_after: u32,
    /// The window `captcha_after` counts in; default 1 hour.
    #[serde(with = "duration")]
    pub captcha_window: Duration,
    /// Sends per phone number; default 1/60s, 5/1h and 10/24h.
    pub phone_limits: Vec<LimitSetting>,
    /// Sends per client IP (IPv6 counted per /64); default 20/1h.
    pub ip_limits: Vec<LimitSetting>,
    /// Leading digits of the E.164 number (country code included) forming the prefix subject.
    pub prefix_digits: u32,
    /// Sends per number prefix (see `prefix_digits`), against SMS pumping
    /// through one number range; default 50/1h.
    pub prefix_limits: Vec<LimitSetting>,
    /// Sends across all phones together; default 1000/1m.
    pub global_limits: Vec<LimitSetting>,
    /// Shadow mode for `/sms/*` alone: decide and audit, refuse nothing.
    #[serde(default)]
    pub shadow: bool,
    /// `[sms.pumping]`: blocking number ranges whose codes are not verified.
    pub pumping: PumpingSettings,
    /// `[sms.provider]`: who delivers the codes.
    pub provider: SmsProviderSettings,
    /// A directory of `<locale>.txt` files laid over the compiled-in SMS
    /// texts; unset (the default), the compiled-in ones alone. Checked at
    /// start-up and reloaded with the decision settings.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub templates_dir: Option<PathBuf>,
}

/// `[sms.pumping]`: the SMS pumping guard. Toll fraud sends codes to number
/// ranges an attacker is paid for and never verifies them; a number prefix
/// (`sms.prefix_digits`) or a country whose codes are seldom verified is
/// blocked for a while.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PumpingSettings {
    /// Count sends and verifies per prefix and country, and block; default true.
    pub enabled: bool,
    /// Codes sent to a prefix (or country) within `window` below which it is
    /// never blocked; default 20.
    pub min_sends: u32,
    /// The share of those codes that must be verified, `0.2` or `"20%"`; a
    /// prefix below it (not at it) is blocked. Default 0.2.
    pub min_conversion: Fraction,
    /// How far back sends and verifies are counted; default 1 hour.
    #[serde(with = "duration")]
    pub window: Duration,
    /// How long a block lasts; an admin unblock lifts it. Default 12 hours.
    #[serde(with = "duration")]
    pub block_duration: Duration,
}

/// Who delivers SMS (`sms.provider.kind`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SmsProviderKind {
    /// Prints the message, code included, to the log: development only. The
    /// default.
    Log,
    /// POSTs the message as JSON to `sms.provider.url`.
    Webhook,
    /// Twilio's Messages API, with `account_sid`, `auth_token` and `from`.
    Twilio,
}

/// `[sms.provider]`: the SMS provider and its credentials.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SmsProviderSettings {
    /// `log` (the default), `webhook` or `twilio`.
    pub kind: SmsProviderKind,
    /// Webhook target, or the Twilio API base URL.
    pub url: String,
    /// Twilio account SID; required with `twilio`.
    pub account_sid: String,
    /// Twilio auth token; required with `twilio`.
    pub auth_token: Secret,
    /// Twilio sender number (the `From` field); required with `twilio`.
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

/// Who verifies captcha tokens (`captcha.kind`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CaptchaKind {
    /// Nobody: the caller checks captchas itself and sends
    /// `captcha_passed: true`. The default.
    None,
    /// Cloudflare Turnstile.
    Turnstile,
    /// hCaptcha.
    Hcaptcha,
    /// Google reCAPTCHA.
    Recaptcha,
}

/// `[captcha]`: the provider that checks captcha tokens.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CaptchaSettings {
    /// `none` (the default), `turnstile`, `hcaptcha` or `recaptcha`.
    pub kind: CaptchaKind,
    /// The provider's secret key, sent with each token; required unless
    /// `kind = "none"`.
    pub secret: Secret,
    /// Overrides the provider's siteverify address.
    pub verify_url: String,
    /// Upper bound of one siteverify call; a timeout counts as not passed.
    #[serde(with = "duration", default = "default_provider_timeout")]
    pub timeout: Duration,
}

/// `[email]`: SMTP for lockout notices and the admin alert digest.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EmailSettings {
    /// `smtp://host:port`; empty disables email.
    pub smtp_url: SecretUrl,
    /// Sender address of every email; default `tollgate@localhost`.
    #[serde(with = "parsed::mailbox")]
    pub from: lettre::message::Mailbox,
    /// Where the admin alert digest goes; empty turns alerts off.
    #[serde(with = "parsed::mailboxes")]
    pub admin_alerts_to: Vec<lettre::message::Mailbox>,
    /// Denials of one SMS rule within `alert_window` above which the admins
    /// are alerted (a lock alerts at once); default 100.
    pub alert_threshold: u32,
    /// The window of `alert_threshold`; default 5 minutes.
    #[serde(with = "duration")]
    pub alert_window: Duration,
    /// Least time between two alert digests; default 1 hour.
    #[serde(with = "duration")]
    pub alert_interval: Duration,
    /// Locale of the admin alert digests (`templates/email/<locale>/`).
    #[serde(default = "default_locale")]
    pub admin_locale: String,
    /// A directory of `<locale>/lock_notice.txt` and
    /// `<locale>/alert_digest.txt` laid over the compiled-in emails; unset
    /// (the default), the compiled-in ones alone.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub templates_dir: Option<PathBuf>,
}

/// `[shadow]`: try the rules out on live traffic without enforcing them.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ShadowSettings {
    /// Decide and audit (`shadow = true`) but let everything through.
    pub enabled: bool,
}
