//! `[sms]`: codes, regions, the limits of `/sms/send`, the pumping guard and
//! the SMS provider.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::{duration, Fraction, LimitSetting, Secret, SecretUrl};

/// `[sms]`: one-time codes, region lists and the limits of `/sms/send`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
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
    /// ISO 3166 alpha-2 codes, and `"001"` for the numbers of no region
    /// (`domain::NO_REGION`); empty allows every region.
    pub allowed_regions: Vec<String>,
    /// Regions (as `allowed_regions` names them) that never get a code;
    /// wins over `allowed_regions`.
    pub denied_regions: Vec<String>,
    /// Sends per phone or IP within `captcha_window` after which a captcha is
    /// needed (an IPv6 network's: `network_captcha_after`).
    pub captcha_after: u32,
    /// The window `captcha_after` counts in; default 1 hour.
    #[serde(with = "duration")]
    pub captcha_window: Duration,
    /// Sends per phone number; default 1/60s, 5/1h and 10/24h.
    pub phone_limits: Vec<LimitSetting>,
    /// Sends per client IP (IPv6 counted per /64); default 20/1h.
    pub ip_limits: Vec<LimitSetting>,
    /// Leading bits of an IPv6 client's address that form its network, the
    /// subject `network_captcha_after` and `network_limits` count: 32 to
    /// 64, default 48 (one site, or one free tunnel-broker allocation, of
    /// 65,536 /64s). IPv4 clients have no network.
    pub network_bits: u8,
    /// Sends per IPv6 network within `captcha_window` after which each send
    /// from it needs a captcha; 0 turns the tier off. Default 100.
    pub network_captcha_after: u32,
    /// Sends per IPv6 network; default none: a full window refuses every
    /// client of the network, where the captcha tier only asks them.
    pub network_limits: Vec<LimitSetting>,
    /// Leading digits of the E.164 number (country code included) forming the prefix subject.
    pub prefix_digits: u32,
    /// Sends per number prefix (see `prefix_digits`), against SMS pumping
    /// through one number range; default 50/1h.
    pub prefix_limits: Vec<LimitSetting>,
    /// Sends across all phones together; default 1000/1m.
    pub global_limits: Vec<LimitSetting>,
    /// Failed `/sms/verify` tries per client IP (a wrong code, or none
    /// pending; a right code is given back); default 30/1h, empty: none.
    /// A full window refuses before the code is looked at.
    pub verify_ip_limits: Vec<LimitSetting>,
    /// Failed `/sms/verify` tries per IPv6 network (`network_bits`), counted
    /// as `verify_ip_limits` are; default 7680/1h (a /56's worth of /64s at
    /// 30), empty: none. Bounds what one /48's 65,536 /64s can try, and the
    /// stand-in codes they write.
    pub verify_network_limits: Vec<LimitSetting>,
    /// Failed deliveries per client address (IPv6 per /64) given back
    /// whole, so that a provider's outage costs no user a window; past it a
    /// failed send keeps counting in the address's windows, since some
    /// failures are the caller's pick (a number the account may not text).
    /// Default 5 per hour.
    #[serde(default = "default_failed_delivery_limit")]
    pub failed_delivery_limit: LimitSetting,
    /// The same budget per IPv6 network (`network_bits`), so that one
    /// /48's 65,536 /64s do not each have their own; default 1280 per hour
    /// (a /56's worth of /64s at 5), so that one /64 cannot spend the
    /// budget of every other /64 of its network.
    #[serde(default = "default_failed_delivery_network_limit")]
    pub failed_delivery_network_limit: LimitSetting,
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
/// (`sms.prefix_digits`) whose codes are seldom verified is blocked for a
/// while, and a country whose sends surge far above its normal with its
/// codes seldom verified needs a captcha first (docs/pumping.md).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
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
    /// How long a block (or a country's captcha) lasts; an admin unblock
    /// lifts it. Default 12 hours.
    #[serde(with = "duration")]
    pub block_duration: Duration,
    /// Codes sent to a country within `window` below which it never needs
    /// a captcha (nor is blocked), whatever its normal; default 500.
    pub country_min_sends: u32,
    /// How many times its normal (its average sends per window over
    /// `country_history`) a country's sends must reach to need a captcha;
    /// at least 1. Default 5.
    pub country_surge: f64,
    /// How far back a country's normal looks; at least `window`. Default 7
    /// days.
    #[serde(with = "duration")]
    pub country_history: Duration,
    /// Block a country whose sends since its captcha began (each passed
    /// one) surge again, still unverified; false: a captcha is the most a
    /// country gets. Default true.
    pub country_block: bool,
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
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SmsProviderSettings {
    /// `log` (the default), `webhook` or `twilio`.
    pub kind: SmsProviderKind,
    /// Webhook target, or the Twilio API base URL; printed and logged with
    /// its password and secret query values masked.
    pub url: SecretUrl,
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

impl SmsProviderSettings {
    /// `headers` as a webhook request carries them, values marked
    /// sensitive (never logged); a name or a value HTTP cannot carry is
    /// named by its key (`sms.provider.headers.<name>`). Start-up and the
    /// webhook sender both read them here.
    pub fn header_map(&self) -> Result<reqwest::header::HeaderMap, (String, &'static str)> {
        use reqwest::header::{HeaderMap, HeaderName, HeaderValue};
        let mut map = HeaderMap::new();
        for (name, value) in &self.headers {
            let key = || format!("sms.provider.headers.{name}");
            let header_name = HeaderName::from_bytes(name.as_bytes())
                .map_err(|_| (key(), "is not a valid HTTP header name"))?;
            let mut header_value = HeaderValue::from_str(value.expose())
                .map_err(|_| (key(), "is not a valid HTTP header value"))?;
            header_value.set_sensitive(true);
            map.insert(header_name, header_value);
        }
        Ok(map)
    }
}

pub(super) fn default_provider_timeout() -> Duration {
    Duration::from_secs(5)
}

pub(super) fn default_locale() -> String {
    "en".to_string()
}

fn default_failed_delivery_limit() -> LimitSetting {
    LimitSetting::new(5, Duration::from_secs(3600))
}

fn default_failed_delivery_network_limit() -> LimitSetting {
    LimitSetting::new(1280, Duration::from_secs(3600))
}
