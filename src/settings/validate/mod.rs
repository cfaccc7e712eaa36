//! Start-up checks the types alone cannot express. Each failure names its key.

use std::time::Duration;

use super::duration::at_least_a_millisecond as duration;
use super::Algorithm;
use super::{
    CaptchaKind, LimitSetting, LockScope, Settings, SettingsError, SmsProviderKind, StoreBackend,
};

mod server;

type Check = Result<(), SettingsError>;

fn positive(key: &str, value: u64) -> Check {
    if value == 0 {
        return Err(SettingsError::invalid(key, "must be positive"));
    }
    Ok(())
}

/// From 1 to `max`: a count a buffer is made of, where a slip of a digit
/// would take the memory it names at start-up, or overflow a product of it.
fn within(key: &str, value: usize, max: usize) -> Check {
    if !(1..=max).contains(&value) {
        return Err(SettingsError::invalid(
            key,
            format!("must be from 1 to {max}"),
        ));
    }
    Ok(())
}

/// The most denials of one rule `email.alert_threshold` may wait for.
const MAX_ALERT_THRESHOLD: usize = 100_000;

/// The most events in one audit batch: a transaction takes up to four.
const MAX_BATCH_SIZE: usize = 100_000;

/// Most of `login.captcha_after` and `login.account_lock_after`.
const MOST_USER_FAILURES_KEPT: u32 = 1000;
/// The most events the audit writer holds in memory (about a kilobyte each).
const MAX_QUEUE_CAPACITY: usize = 10_000_000;

/// The longest `audit.journal_sync_interval`.
const MAX_JOURNAL_SYNC_INTERVAL: Duration = Duration::from_secs(60);
/// The bounds of `audit.write_timeout`: below a second, ordinary batches
/// under load would be given up and the trail never written.
const MIN_WRITE_TIMEOUT: Duration = Duration::from_secs(1);
const MAX_WRITE_TIMEOUT: Duration = Duration::from_secs(3600);
/// The least `audit.journal_max_bytes`: below it, a typo (a bare `1`).
const MIN_JOURNAL_MAX_BYTES: u64 = 1 << 20;

/// The shortest `lists.refresh_interval`: every instance reads the whole
/// table each interval (at 1 ms, a thousand queries a second each).
const MIN_LISTS_REFRESH: Duration = Duration::from_millis(100);

/// The longest a provider's call may take (`sms.provider.timeout`,
/// `captcha.timeout`): a send waits for both, and a slip of a unit (`5m`)
/// would hold every send open for minutes.
const MAX_PROVIDER_TIMEOUT: Duration = Duration::from_secs(30);

/// A provider call's timeout: positive, at most [`MAX_PROVIDER_TIMEOUT`].
fn provider_timeout(key: &str, value: Duration) -> Check {
    duration(key, value)?;
    if value > MAX_PROVIDER_TIMEOUT {
        return Err(SettingsError::invalid(
            key,
            "must be at most 30s (a send waits for the captcha's and the SMS provider's calls)",
        ));
    }
    Ok(())
}

/// The longest `store.timeout`: every decision waits for it on a Redis that
/// stopped answering, the fallback of `store.on_error` starts only after
/// it, and a slip of a unit (`100m` for `100ms`) held requests for hours.
const MAX_STORE_TIMEOUT: Duration = Duration::from_secs(10);

/// The smallest `store.memory_limit`: below it a handful of subjects would
/// evict one another.
const MIN_MEMORY_LIMIT: u64 = 1 << 20;

/// The shortest `sms.code_secret` accepted with Redis (16 random characters
/// are about 95 bits).
const MIN_CODE_SECRET: usize = 16;

/// The most windows one limit list may hold. Redis's `reserve.lua` writes
/// every window of a request out as Lua, and Lua 5.1 refuses a function past
/// 250 registers: some 47 meters on one subject would fail at the first
/// request instead of at start-up.
const MAX_LIMITS: usize = 16;

fn limits(key: &str, list: &[LimitSetting]) -> Check {
    if list.len() > MAX_LIMITS {
        return Err(SettingsError::invalid(
            key,
            format!("at most {MAX_LIMITS} windows (got {})", list.len()),
        ));
    }
    for (i, l) in list.iter().enumerate() {
        positive(&format!("{key}[{i}].limit"), l.limit.into())?;
        duration(&format!("{key}[{i}].window"), l.window)?;
        // The meter's level goes up to limit × window in ms, kept exact in a
        // Lua number (a double) on Redis.
        let meter_max = u128::from(l.limit) * l.window.as_millis();
        if l.algorithm == Algorithm::Gcra && meter_max >= 1 << 53 {
            return Err(SettingsError::invalid(
                &format!("{key}[{i}]"),
                "with gcra, limit × window in milliseconds must stay below 2^53",
            ));
        }
    }
    Ok(())
}

/// Regions as ISO 3166 and the phone metadata name them: a well-formed code
/// neither knows (`UK` for `GB`) would allow or deny no number, unseen.
fn regions(key: &str, list: &[String]) -> Check {
    for (i, r) in list.iter().enumerate() {
        if !crate::domain::phone::is_known_region(r) {
            let hint = if r.eq_ignore_ascii_case("UK") {
                " (the United Kingdom is \"GB\")"
            } else {
                ""
            };
            return Err(SettingsError::invalid(
                &format!("{key}[{i}]"),
                format!(
                    "{r:?} is not an ISO 3166 alpha-2 code or a region of the phone \
                     metadata{hint} (or \"{}\", the numbers of no region)",
                    crate::domain::NO_REGION
                ),
            ));
        }
    }
    Ok(())
}

fn url_scheme(key: &str, url: &str, schemes: &[&str]) -> Check {
    if !schemes.iter().any(|s| url.starts_with(s)) {
        return Err(SettingsError::invalid(
            key,
            format!("must start with one of {}", schemes.join(", ")),
        ));
    }
    Ok(())
}

/// A URL of one of `schemes`, with a host, that parses (the `url` crate,
/// which reqwest and lettre parse with): a typo in a host or a port stops
/// start-up here, naming the key, rather than failing every call later.
/// Never prints the URL, which may hold a password.
fn url_with_host(key: &str, url: &str, schemes: &[&str]) -> Check {
    url_scheme(key, url, schemes)?;
    match url::Url::parse(url) {
        Ok(parsed) if parsed.has_host() => Ok(()),
        Ok(_) => Err(SettingsError::invalid(key, "names no host")),
        Err(e) => Err(SettingsError::invalid(key, format!("is not a URL: {e}"))),
    }
}

/// How an `smtp_url` reaches its server, as lettre reads it.
pub(super) struct SmtpReach {
    /// The URL holds a user name or a password.
    pub login: bool,
    /// `smtps://`, or `tls=required` (STARTTLS or nothing): lettre reads
    /// `smtp://` without it as plain SMTP, and `tls=opportunistic` as
    /// STARTTLS only if offered, which anyone on the path can strip.
    /// lettre goes by the first `tls` pair (`?tls=opportunistic&tls=required`
    /// is opportunistic).
    pub encrypted: bool,
    /// The server is on this host.
    pub loopback: bool,
}

/// `raw` as lettre reads it, or `None` when it is no URL.
pub(super) fn smtp_reach(raw: &str) -> Option<SmtpReach> {
    let url = url::Url::parse(raw).ok()?;
    let login = !url.username().is_empty() || url.password().is_some();
    let encrypted = url.scheme() == "smtps"
        || url
            .query_pairs()
            .find(|(key, _)| key == "tls")
            .is_some_and(|(_, value)| value == "required");
    // `smtp` is no scheme the URL standard knows: its host is opaque text,
    // an address included.
    let loopback = match url.host() {
        Some(url::Host::Domain(d)) => {
            d == "localhost"
                || d.parse::<std::net::IpAddr>()
                    .is_ok_and(|ip| ip.is_loopback())
        }
        Some(url::Host::Ipv4(ip)) => ip.is_loopback(),
        Some(url::Host::Ipv6(ip)) => ip.is_loopback(),
        None => false,
    };
    Some(SmtpReach {
        login,
        encrypted,
        loopback,
    })
}

/// An `smtp_url` with a login sends it encrypted, or to this host (a relay
/// on a loopback address may take it in clear).
fn smtp_login_encrypted(raw: &str) -> Check {
    match smtp_reach(raw) {
        Some(reach) if reach.login && !reach.encrypted && !reach.loopback => {
            Err(SettingsError::invalid(
                "email.smtp_url",
                "sends its login unencrypted: use smtps://… or add ?tls=required (STARTTLS)",
            ))
        }
        _ => Ok(()),
    }
}

/// `audit.database_url` as sqlx reads it when it opens the pool.
fn database_url(url: &str) -> Check {
    use std::str::FromStr;
    let parsed = if url.starts_with("sqlite:") {
        sqlx::sqlite::SqliteConnectOptions::from_str(url).map(drop)
    } else {
        sqlx::postgres::PgConnectOptions::from_str(url).map(drop)
    };
    parsed.map_err(|e| SettingsError::invalid("audit.database_url", format!("is not a URL: {e}")))
}

impl Settings {
    pub(super) fn validate(&self) -> Check {
        server::bearer_secrets(&self.server)?;
        super::admin::validate_tokens(&self.server.admin_tokens)?;
        super::admin::validate_oidc(&self.admin.oidc)?;
        server::proxies(&self.server)?;
        self.check_connections()?;
        self.check_store()?;
        self.check_audit()?;
        self.check_sms()?;
        self.check_routes()?;
        self.check_login()?;
        self.check_captcha()?;
        self.check_lists()?;
        self.check_email()?;
        Ok(())
    }

    /// `[store]`: the key prefix, the timeout, the memory limit, the Redis URL.
    fn check_store(&self) -> Check {
        let store = &self.store;
        if store.key_prefix.is_empty()
            || store.key_prefix.contains(['{', '}'])
            || store.key_prefix.chars().any(char::is_whitespace)
        {
            return Err(SettingsError::invalid(
                "store.key_prefix",
                "must be non-empty, without braces or spaces",
            ));
        }
        duration("store.timeout", store.timeout)?;
        if store.timeout > MAX_STORE_TIMEOUT {
            return Err(SettingsError::invalid(
                "store.timeout",
                "must be at most 10s (every decision waits for it on a Redis that stopped \
                 answering; write milliseconds as `ms`)",
            ));
        }
        if store.memory_limit < MIN_MEMORY_LIMIT {
            return Err(SettingsError::invalid(
                "store.memory_limit",
                format!(
                    "{} is below the least the in-process store can work in, 1MiB \
                     (write a size such as \"256MiB\")",
                    super::bytes::format(store.memory_limit)
                ),
            ));
        }
        if usize::try_from(store.memory_limit).is_err() {
            return Err(SettingsError::invalid(
                "store.memory_limit",
                "is larger than this machine can address",
            ));
        }
        if !store.hash_secret.is_empty() && store.hash_secret.expose().len() < MIN_CODE_SECRET {
            return Err(SettingsError::invalid(
                "store.hash_secret",
                format!("at least {MIN_CODE_SECRET} characters of random text, or empty"),
            ));
        }
        if store.backend == StoreBackend::Redis {
            if store.redis_url.expose().starts_with("redis-sentinel") {
                return Err(SettingsError::invalid(
                    "store.redis_url",
                    "Redis Sentinel is not supported: name the primary (redis:// or rediss://) \
                     or a cluster (redis-cluster://)",
                ));
            }
            url_scheme(
                "store.redis_url",
                store.redis_url.expose(),
                &[
                    "redis://",
                    "rediss://",
                    "redis-cluster://",
                    "rediss-cluster://",
                ],
            )?;
            // fred's own reading, as at connect time (a cluster's every node).
            super::redis_url::fred_config(store.redis_url.expose()).map_err(|why| {
                SettingsError::invalid("store.redis_url", format!("is not a Redis URL: {why}"))
            })?;
        }
        Ok(())
    }

    /// `[audit]`: the database URL, the spool directory and the writer's bounds.
    fn check_audit(&self) -> Check {
        let audit = &self.audit;
        url_scheme(
            "audit.database_url",
            audit.database_url.expose(),
            &["sqlite:", "postgres://", "postgresql://"],
        )?;
        database_url(audit.database_url.expose())?;
        within("audit.batch_size", audit.batch_size, MAX_BATCH_SIZE)?;
        within(
            "audit.queue_capacity",
            audit.queue_capacity,
            MAX_QUEUE_CAPACITY,
        )?;
        duration("audit.flush_interval", audit.flush_interval)?;
        duration("audit.write_timeout", audit.write_timeout)?;
        if !(MIN_WRITE_TIMEOUT..=MAX_WRITE_TIMEOUT).contains(&audit.write_timeout) {
            return Err(SettingsError::invalid(
                "audit.write_timeout",
                "must be from 1s to 1h (shorter gives up ordinary batches; PostgreSQL takes no lock_timeout past 24 days)",
            ));
        }
        duration("audit.read_timeout", audit.read_timeout)?;
        if !(MIN_WRITE_TIMEOUT..=MAX_WRITE_TIMEOUT).contains(&audit.read_timeout) {
            return Err(SettingsError::invalid(
                "audit.read_timeout",
                "must be from 1s to 1h (PostgreSQL takes no statement_timeout past 24 days)",
            ));
        }
        duration("audit.journal_sync_interval", audit.journal_sync_interval)?;
        if audit.journal_sync_interval > MAX_JOURNAL_SYNC_INTERVAL {
            return Err(SettingsError::invalid(
                "audit.journal_sync_interval",
                "must be at most 60s (it is what a machine crash can lose)",
            ));
        }
        if audit.journal_max_bytes < MIN_JOURNAL_MAX_BYTES {
            return Err(SettingsError::invalid(
                "audit.journal_max_bytes",
                format!(
                    "{} is below the least, 1MiB (write a size such as \"1GiB\")",
                    super::bytes::format(audit.journal_max_bytes)
                ),
            ));
        }
        duration("audit.retention", audit.retention)?;
        if audit.spool_dir.is_empty() {
            return Err(SettingsError::invalid(
                "audit.spool_dir",
                "must not be empty",
            ));
        }
        Ok(())
    }

    /// `[sms]`: the code, its secret, the windows, the pumping guard, the provider.
    fn check_sms(&self) -> Check {
        let sms = &self.sms;
        if !(4..=10).contains(&sms.code_length) {
            return Err(SettingsError::invalid(
                "sms.code_length",
                "must be between 4 and 10",
            ));
        }
        duration("sms.code_ttl", sms.code_ttl)?;
        // Without it the key would live in Redis beside the codes it seals:
        // whoever reads Redis could try all 10^6 codes offline.
        if self.store.backend == StoreBackend::Redis
            && sms.code_secret.expose().len() < MIN_CODE_SECRET
        {
            return Err(SettingsError::invalid(
                "sms.code_secret",
                format!(
                    "required with store.backend = \"redis\": at least {MIN_CODE_SECRET} characters \
                     of random text, the same on every instance"
                ),
            ));
        }
        positive("sms.max_verify_attempts", sms.max_verify_attempts.into())?;
        // Each try guesses one code of 10^code_length: past this, one code
        // falls to a guesser more often than one time in 1,000.
        let most_tries = 10u64.pow(sms.code_length) / 1_000;
        if u64::from(sms.max_verify_attempts) > most_tries {
            return Err(SettingsError::invalid(
                "sms.max_verify_attempts",
                format!(
                    "must be at most {most_tries} with sms.code_length = {}: more tries \
                     guess one code in 1,000",
                    sms.code_length
                ),
            ));
        }
        regions("sms.allowed_regions", &sms.allowed_regions)?;
        regions("sms.denied_regions", &sms.denied_regions)?;
        positive("sms.captcha_after", sms.captcha_after.into())?;
        duration("sms.captcha_window", sms.captcha_window)?;
        limits("sms.phone_limits", &sms.phone_limits)?;
        limits("sms.ip_limits", &sms.ip_limits)?;
        limits("sms.network_limits", &sms.network_limits)?;
        let bits = crate::domain::client_ip::NETWORK_BITS;
        if !bits.contains(&sms.network_bits) {
            return Err(SettingsError::invalid(
                "sms.network_bits",
                format!("must be between {} and {}", bits.start(), bits.end()),
            ));
        }
        limits("sms.prefix_limits", &sms.prefix_limits)?;
        limits("sms.global_limits", &sms.global_limits)?;
        limits("sms.verify_ip_limits", &sms.verify_ip_limits)?;
        limits("sms.verify_network_limits", &sms.verify_network_limits)?;
        server::failure_limit(
            "sms.failed_delivery_limit",
            &sms.failed_delivery_limit,
            "failed deliveries",
        )?;
        server::failure_limit(
            "sms.failed_delivery_network_limit",
            &sms.failed_delivery_network_limit,
            "failed deliveries",
        )?;
        if !(1..=15).contains(&sms.prefix_digits) {
            return Err(SettingsError::invalid(
                "sms.prefix_digits",
                "must be between 1 and 15",
            ));
        }
        self.check_pumping()?;
        self.check_sms_provider()?;
        Ok(())
    }

    /// `[sms.pumping]`: the prefix and the country thresholds.
    fn check_pumping(&self) -> Check {
        let pumping = &self.sms.pumping;
        positive("sms.pumping.min_sends", pumping.min_sends.into())?;
        duration("sms.pumping.window", pumping.window)?;
        duration("sms.pumping.block_duration", pumping.block_duration)?;
        positive(
            "sms.pumping.country_min_sends",
            pumping.country_min_sends.into(),
        )?;
        if !(1.0..=1000.0).contains(&pumping.country_surge) {
            return Err(SettingsError::invalid(
                "sms.pumping.country_surge",
                format!(
                    "{} is not a multiple between 1 and 1000 (5 means five times the normal)",
                    pumping.country_surge
                ),
            ));
        }
        if pumping.country_history < pumping.window {
            return Err(SettingsError::invalid(
                "sms.pumping.country_history",
                "must not be shorter than sms.pumping.window",
            ));
        }
        Ok(())
    }

    /// `[sms.provider]`: its timeout and what its kind needs.
    fn check_sms_provider(&self) -> Check {
        let provider = &self.sms.provider;
        provider_timeout("sms.provider.timeout", provider.timeout)?;
        match provider.kind {
            SmsProviderKind::Log => {}
            SmsProviderKind::Webhook => {
                url_with_host(
                    "sms.provider.url",
                    provider.url.expose(),
                    &["http://", "https://"],
                )?;
                // Only a webhook sends `headers`.
                provider
                    .header_map()
                    .map_err(|(key, why)| SettingsError::invalid(&key, why))?;
            }
            SmsProviderKind::Twilio => {
                if !provider.url.is_empty() {
                    url_with_host(
                        "sms.provider.url",
                        provider.url.expose(),
                        &["http://", "https://"],
                    )?;
                }
                for (key, value) in [
                    ("sms.provider.account_sid", provider.account_sid.as_str()),
                    ("sms.provider.auth_token", provider.auth_token.expose()),
                    ("sms.provider.from", provider.from.as_str()),
                ] {
                    if value.is_empty() {
                        return Err(SettingsError::invalid(
                            key,
                            "is required for kind = \"twilio\"",
                        ));
                    }
                }
            }
        }
        Ok(())
    }

    /// `[login]`: the tiers, the windows and the locks.
    fn check_login(&self) -> Check {
        let login = &self.login;
        positive("login.captcha_after", login.captcha_after.into())?;
        // A user's failures are one sorted set that keeps the larger of
        // these, and every attempt on the name reads it whole: past a
        // thousand, each attempt on a sprayed name (a refused one too)
        // would cost Redis's one thread in proportion.
        // `lock_after` is the user's own threshold under lock_scope = "user".
        for (key, value) in [
            ("login.captcha_after", login.captcha_after),
            ("login.lock_after", login.lock_after),
            ("login.account_lock_after", login.account_lock_after),
        ] {
            if value > MOST_USER_FAILURES_KEPT {
                return Err(SettingsError::invalid(
                    key,
                    format!("must be at most {MOST_USER_FAILURES_KEPT} (each attempt on a user reads as many failures)"),
                ));
            }
        }
        duration("login.captcha_window", login.captcha_window)?;
        positive("login.lock_after", login.lock_after.into())?;
        if login.lock_scope == LockScope::UserIp && login.account_lock_after < login.lock_after {
            return Err(SettingsError::invalid(
                "login.account_lock_after",
                "must not be below login.lock_after (with lock_scope = \"user_ip\")",
            ));
        }
        duration("login.lock_window", login.lock_window)?;
        duration("login.lock_duration", login.lock_duration)?;
        duration("login.lock_max_duration", login.lock_max_duration)?;
        if login.lock_max_duration < login.lock_duration {
            return Err(SettingsError::invalid(
                "login.lock_max_duration",
                "must not be shorter than login.lock_duration",
            ));
        }
        positive("login.ip_captcha_after", login.ip_captcha_after.into())?;
        positive("login.ip_block_after", login.ip_block_after.into())?;
        duration("login.ip_window", login.ip_window)?;
        Ok(())
    }

    /// `[captcha]`: a secret with a provider, the timeout, the verify URL.
    fn check_captcha(&self) -> Check {
        if self.captcha.kind != CaptchaKind::None && self.captcha.secret.is_empty() {
            return Err(SettingsError::invalid(
                "captcha.secret",
                "is required when captcha.kind is not \"none\"",
            ));
        }
        provider_timeout("captcha.timeout", self.captcha.timeout)?;
        server::failure_limit(
            "captcha.failed_token_limit",
            &self.captcha.failed_token_limit,
            "refused captcha tokens",
        )?;
        if !self.captcha.verify_url.is_empty() {
            url_with_host(
                "captcha.verify_url",
                self.captcha.verify_url.expose(),
                &["http://", "https://"],
            )?;
        }
        // As the providers write them: an IDN in its `xn--` form, no
        // trailing dot; a wildcard would match nothing.
        for host in &self.captcha.hostnames {
            let labels_ok = host.split('.').all(|label| {
                (1..=63).contains(&label.len())
                    && !label.starts_with('-')
                    && !label.ends_with('-')
                    && label
                        .bytes()
                        .all(|b| b.is_ascii_alphanumeric() || b == b'-')
            });
            if !labels_ok {
                return Err(SettingsError::invalid(
                    "captcha.hostnames",
                    format!(
                        "{host:?} is not a hostname as providers name it (`www.example.com`, \
                         an IDN as `xn--…`; no scheme, port, path, wildcard or trailing dot)"
                    ),
                ));
            }
        }
        for (key, actions) in self.captcha.action_lists() {
            // reCAPTCHA takes letters, digits, `/` and `_`; Turnstile `-` too.
            for action in actions {
                let name_ok = !action.is_empty()
                    && action
                        .bytes()
                        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'/' | b'_' | b'-'));
                if !name_ok {
                    return Err(SettingsError::invalid(
                        key,
                        format!("{action:?} is not an action name (`login`: letters, digits, `/`, `_`, `-`)"),
                    ));
                }
            }
            if self.captcha.kind == CaptchaKind::Hcaptcha && !actions.is_empty() {
                return Err(SettingsError::invalid(
                    key,
                    "hCaptcha's answers name no action, so every token would be refused; leave it empty",
                ));
            }
        }
        Ok(())
    }

    /// `[lists]`: the entries and the refresh interval.
    fn check_lists(&self) -> Check {
        if let Some((key, why)) = self.lists.invalid() {
            return Err(SettingsError::invalid(&key, &why));
        }
        if self.lists.refresh_interval < MIN_LISTS_REFRESH {
            return Err(SettingsError::invalid(
                "lists.refresh_interval",
                format!(
                    "must be at least {} (every instance reads the stored entries each interval)",
                    humantime::format_duration(MIN_LISTS_REFRESH)
                ),
            ));
        }
        Ok(())
    }

    /// `[email]`: the SMTP URL and the alert digest's bounds.
    fn check_email(&self) -> Check {
        let email = &self.email;
        if !email.smtp_url.expose().is_empty() {
            url_with_host(
                "email.smtp_url",
                email.smtp_url.expose(),
                &["smtp://", "smtps://"],
            )?;
            smtp_login_encrypted(email.smtp_url.expose())?;
        }
        // Each SMS rule keeps the times of its last `alert_threshold + 1`
        // denials: a threshold of billions to mute the alerts let a flood
        // of denials grow memory without end.
        within(
            "email.alert_threshold",
            email.alert_threshold as usize,
            MAX_ALERT_THRESHOLD,
        )?;
        duration("email.alert_window", email.alert_window)?;
        duration("email.alert_interval", email.alert_interval)?;
        Ok(())
    }
}
