//! Typed settings: the compiled-in defaults, a TOML file and
//! `TOLLGATE__SECTION__KEY` environment variables, layered in that order and
//! validated once at start-up. Every error names the offending key.

mod admin;
mod bytes;
mod duration;
mod env;
mod fraction;
mod lists;
mod load;
mod login;
mod parsed;
pub mod redis_url;
mod secret;
#[cfg(test)]
mod shipped_config;
mod sms;

use sms::{default_locale, default_provider_timeout};
mod validate;
pub mod warnings;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};

pub use crate::domain::Algorithm;
pub use admin::{AdminSettings, AdminToken, NamedAdminToken, OidcSettings, CALLBACK_PATH};
pub use fraction::{percent, Fraction};
pub use lists::ListSettings;
pub use load::{SettingsError, MAX_CONFIG_BYTES};
pub use login::{LockScope, LoginSettings};
pub use secret::{Secret, SecretUrl};
pub use sms::{PumpingSettings, SmsProviderKind, SmsProviderSettings, SmsSettings};

const DEFAULTS: &str = include_str!("defaults.toml");

/// The whole configuration, one field per TOML section (DESIGN.md §5).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
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
    /// `[admin]`: single sign-on for admins (`[admin.oidc]`).
    #[serde(default)]
    pub admin: AdminSettings,
}

impl Settings {
    /// The shadow-mode switches, as a config file names them, each with
    /// whether it is on: any of them on refuses nothing it covers.
    pub fn shadow_switches(&self) -> [(&'static str, bool); 3] {
        [
            ("shadow.enabled", self.shadow.enabled),
            ("sms.shadow", self.sms.shadow),
            ("login.shadow", self.login.shadow),
        ]
    }
}

/// `[server]`: the listener and the credentials callers must present.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
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
    /// CIDRs (or single addresses) of proxies whose `client_ip_header` is
    /// believed (docs/security.md).
    #[serde(with = "parsed::proxy_cidrs")]
    pub trusted_proxies: Vec<ipnet::IpNet>,
    /// The one header that names the client behind a trusted proxy:
    /// `x-forwarded-for` (the default; the right-most hop no trusted proxy
    /// wrote), `forwarded` (RFC 7239, read the same way), or another name
    /// for a header the proxy sets to one address (`x-real-ip`,
    /// `cf-connecting-ip`; not a standard request header such as `host`,
    /// which never holds one). Every other client-address header is ignored.
    #[serde(with = "parsed::client_ip_header")]
    pub client_ip_header: crate::domain::forwarding::ClientIpHeader,
    /// Proxies trusted by their position rather than their address, for
    /// load balancers whose addresses cannot be listed (Envoy's
    /// `xff_num_trusted_hops`): the peer and `n - 1` more list entries from
    /// the right. Only when nothing can reach tollgate around them; default 0.
    pub trusted_proxy_hops: u32,
    /// Failed admin authentications one client address may make per window
    /// before every admin route answers it 429; default 20 per 10 minutes.
    pub admin_auth_limit: LimitSetting,
    /// The same per IPv6 /48 (whatever `sms.network_bits` says): one /48
    /// holds 65,536 /64s, each with `admin_auth_limit` of its own; default
    /// 100 per 10 minutes.
    pub admin_auth_network_limit: LimitSetting,
    /// When non-empty, `/sms/*` and `/login/*` need `Authorization: Bearer <key>`.
    pub api_keys: Vec<Secret>,
    /// With `api_keys`, browsers may still call `/sms/send` and
    /// `/sms/verify` without any `Authorization` header, as they do without
    /// keys: their own address counts, and `ip` and `captcha_passed` are
    /// not theirs to send. A wrong key is still 401; default false.
    pub keyless_sms: bool,
    /// Bearer tokens for `/admin`: plain strings (each an admin named
    /// after its position, `token:1`, who may do everything) or
    /// `{ name, token, role }`; empty means only single sign-on admins, if
    /// `[admin.oidc]` is set, and otherwise that every admin route answers 401.
    pub admin_tokens: Vec<AdminToken>,
    /// Longest a client may take to send one request, head and body, counted
    /// from the connection's accept or from the previous answer on it (so
    /// keep-alive idling and reading that answer count too). A body still
    /// arriving then is answered 408 `request_timeout`; a connection still
    /// short of a whole head, or not reading its answer, is closed. Default
    /// 10 s (docs/connections.md).
    #[serde(with = "duration")]
    pub request_timeout: Duration,
    /// On SIGTERM, how long open connections may take to finish before they
    /// are closed; the audit queue is written out after it. Keep it and the
    /// audit drain inside the unit's `TimeoutStopSec` (30 s). Default 10 s,
    /// rounded up to whole seconds.
    #[serde(with = "duration")]
    pub shutdown_timeout: Duration,
    /// Most connections the public listener (`bind`) holds at once; more wait
    /// in the kernel's backlog. Unset (the default): derived from the
    /// descriptor limit (docs/connections.md).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_connections: Option<u32>,
    /// Most connections the admin listener (`admin_bind`) holds at once,
    /// kept apart from the public listener's. Unset (the default): derived
    /// from the descriptor limit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub admin_max_connections: Option<u32>,
    /// Most connections one client address (an IPv6 /64) holds on the public
    /// listener; one more is closed at once. Addresses in `trusted_proxies`
    /// are not capped by it. Unset (the default): derived from
    /// `max_connections`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_connections_per_ip: Option<u32>,
    /// Most connections one client address holds on the admin listener.
    /// Unset (the default): half of `admin_max_connections`, at least 8
    /// (or the whole cap when it is smaller), so that one peer never holds
    /// it all and a browser's parallel connections always fit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub admin_max_connections_per_ip: Option<u32>,
    /// HTTP worker threads of each listener. Unset (the default): one per
    /// CPU the process may run on. Fewer leave cores to a Redis or a
    /// PostgreSQL on the same machine (docs/connections.md).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workers: Option<u32>,
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
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
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
    /// Most bytes the in-process store's subjects are counted to hold (each
    /// in-process store: the `memory` backend's, or the `local`/`allow`
    /// fallback's) before the least recently touched are evicted; never a
    /// locked one. `"128MiB"` by default (the process then grows by up to about
    /// 210 MiB: allocator overhead comes on top, see `docs/store.md`); at least 1 MiB.
    #[serde(with = "bytes")]
    pub memory_limit: u64,
    /// Replace subject ids (phones, names, addresses) in key names with a
    /// keyed hash. Off by default: turning it on renames every key, so the
    /// counters, locks and codes kept under the old names are not found.
    pub hash_subject_ids: bool,
    /// The key of that hash; empty: derived from `sms.code_secret` (then
    /// changing that secret renames every key too).
    pub hash_secret: Secret,
}

impl StoreSettings {
    /// The key of the subject-id hash: `hash_secret`, else one derived from
    /// `code_secret`, else (the in-process store only, whose keys die with
    /// the process) a random one.
    pub fn subject_hash_key(&self, code_secret: &Secret) -> Vec<u8> {
        use hmac::{Hmac, KeyInit, Mac};
        if !self.hash_secret.is_empty() {
            return self.hash_secret.expose().as_bytes().to_vec();
        }
        if code_secret.is_empty() {
            return rand::random::<[u8; 32]>().to_vec();
        }
        // Its own key, not the code key itself: what hashes ids never seals codes.
        let mut mac =
            <Hmac<sha2::Sha256> as KeyInit>::new_from_slice(code_secret.expose().as_bytes())
                .expect("HMAC accepts keys of any length");
        mac.update(b"tollgate subject-id hash key");
        mac.finalize().into_bytes().to_vec()
    }
}

/// `[audit]`: the audit database and the queue, batches and spool in front of it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AuditSettings {
    /// `sqlite://file?mode=rwc` or `postgres://...`.
    pub database_url: SecretUrl,
    /// Events per insert while the queue is calm; default 500. Under a flood
    /// (the last batch filled up) a batch gathers up to four times this
    /// within `flush_interval`, as a backlog takes up to eight.
    pub batch_size: usize,
    /// Longest a queued event waits for its batch to fill before it is written;
    /// default 200 ms.
    #[serde(with = "duration")]
    pub flush_interval: Duration,
    /// Longest one insert of a batch may go unanswered before the writer
    /// leaves the batch to the journal and `/readyz` says 503: a database
    /// that hangs, or a network that drops its packets, must not hold the
    /// trail while readiness keeps its last good word; default 10 s.
    #[serde(with = "duration")]
    pub write_timeout: Duration,
    /// Longest one admin read of the trail (a page of events, a page of a
    /// CSV export) may run on PostgreSQL before it answers 503: a filter
    /// no index serves reads every partition; and each read of the stored
    /// list entries (start-up's first one included); default 10 s.
    #[serde(with = "duration")]
    pub read_timeout: Duration,
    /// Directory of the audit journal: every event is appended there before
    /// its request is answered, and replayed from there when the database
    /// missed it; default `tollgate-spool`.
    pub spool_dir: String,
    /// How often the journal is fsync'd: what a machine crash can lose (a
    /// process crash loses nothing); default 200 ms.
    #[serde(with = "duration")]
    pub journal_sync_interval: Duration,
    /// Most bytes the journal holds on disk. It grows only while the
    /// database misses events (down, or behind a flood of refusals any
    /// client can cause); past it events are not journaled and wait in
    /// memory only (a `kill -9` then loses them); default `"1GiB"`, at
    /// least 1 MiB.
    #[serde(with = "bytes")]
    pub journal_max_bytes: u64,
    /// Events held in memory for the writer; past that they wait in the
    /// journal for a replay; default 10000.
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
    /// Most events this window admits within `span`, a span no longer
    /// than the window: a log, `limit`; a meter, `limit` at once and one
    /// per `window / limit` after (an hour's 15/1h meter admits 29 in an
    /// hour).
    pub fn admits_within(&self, span: Duration) -> u64 {
        let limit = u64::from(self.limit);
        match self.algorithm {
            Algorithm::SlidingLog => limit,
            Algorithm::Gcra => {
                // One back at each `window / limit` after the burst, the
                // span's end not included.
                let refills = (span.as_millis() * u128::from(limit))
                    .div_ceil(self.window.as_millis().max(1))
                    .saturating_sub(1);
                limit.saturating_add(u64::try_from(refills).unwrap_or(u64::MAX))
            }
        }
    }

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
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CaptchaSettings {
    /// `none` (the default), `turnstile`, `hcaptcha` or `recaptcha`.
    pub kind: CaptchaKind,
    /// The provider's secret key, sent with each token; required unless
    /// `kind = "none"`.
    pub secret: Secret,
    /// Overrides the provider's siteverify address; printed and logged
    /// masked, as `sms.provider.url`.
    pub verify_url: SecretUrl,
    /// Upper bound of one siteverify call; a timeout counts as not passed.
    #[serde(with = "duration", default = "default_provider_timeout")]
    pub timeout: Duration,
    /// Tokens the provider may refuse per client address (IPv6 per /64)
    /// before its tokens are refused without asking the provider (429
    /// `rate_limited`); 20 per 10 minutes by default. Bounds the siteverify
    /// calls one address can cost.
    #[serde(default = "default_failed_token_limit")]
    pub failed_token_limit: LimitSetting,
    /// reCAPTCHA v3's score (0.0 a bot, 1.0 a person) below which a token is
    /// refused; default 0.5, Google's own advice. Read only with
    /// `kind = "recaptcha"` and from answers that carry a score (v2's carry
    /// none); hCaptcha's enterprise score is a risk, not this, and not read.
    #[serde(default = "default_min_score")]
    pub min_score: Fraction,
    /// Hostnames a token must have been solved on (the answer's `hostname`,
    /// compared without case); empty, the default, takes any.
    #[serde(default)]
    pub hostnames: Vec<String>,
    /// Actions a token must name (the answer's `action`: reCAPTCHA v3's and
    /// Turnstile's), on both routes unless a route has its own list below;
    /// empty, the default, takes any.
    #[serde(default)]
    pub actions: Vec<String>,
    /// Actions a token for `/sms/send` must name, in place of `actions`:
    /// then a token made on the login page does not pass a send.
    #[serde(default)]
    pub sms_actions: Vec<String>,
    /// Actions a token for `/login/attempt` must name, in place of `actions`.
    #[serde(default)]
    pub login_actions: Vec<String>,
}

impl CaptchaSettings {
    /// The action lists, each with its key, for the checks that read them all.
    pub fn action_lists(&self) -> [(&'static str, &[String]); 3] {
        [
            ("captcha.actions", &self.actions),
            ("captcha.sms_actions", &self.sms_actions),
            ("captcha.login_actions", &self.login_actions),
        ]
    }

    /// With one route's own action list set and the other's not: the key
    /// left unset and the one set, when `actions` (which the unset route
    /// reads) takes a token the set route's list names, or any token.
    pub fn route_open_to_the_others_tokens(&self) -> Option<(&'static str, &'static str)> {
        let (open, own, own_list) =
            match (self.sms_actions.is_empty(), self.login_actions.is_empty()) {
                (true, false) => (
                    "captcha.sms_actions",
                    "captcha.login_actions",
                    &self.login_actions,
                ),
                (false, true) => (
                    "captcha.login_actions",
                    "captcha.sms_actions",
                    &self.sms_actions,
                ),
                _ => return None,
            };
        let takes_them =
            self.actions.is_empty() || own_list.iter().any(|a| self.actions.contains(a));
        (self.kind != CaptchaKind::None && takes_them).then_some((open, own))
    }
}

fn default_min_score() -> Fraction {
    Fraction::new(0.5).expect("0.5 lies between 0 and 1")
}

fn default_failed_token_limit() -> LimitSetting {
    LimitSetting::new(20, Duration::from_secs(600))
}

/// `[email]`: SMTP for lockout notices and the admin alert digest.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
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
    /// are alerted (a lock alerts at once); default 100, at most 100,000.
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
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ShadowSettings {
    /// Decide and audit (`shadow = true`) but let everything through.
    pub enabled: bool,
}
