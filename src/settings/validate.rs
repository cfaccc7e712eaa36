//! Start-up checks the types alone cannot express. Each failure names its key.

use std::time::Duration;

use super::duration::at_least_a_millisecond as duration;
use super::Algorithm;
use super::{
    CaptchaKind, LimitSetting, LockScope, Settings, SettingsError, SmsProviderKind, StoreBackend,
};

type Check = Result<(), SettingsError>;

fn positive(key: &str, value: u64) -> Check {
    if value == 0 {
        return Err(SettingsError::invalid(key, "must be positive"));
    }
    Ok(())
}

/// The longest `audit.journal_sync_interval`.
const MAX_JOURNAL_SYNC_INTERVAL: Duration = Duration::from_secs(60);
/// The least `audit.journal_max_bytes`: below it, a typo (a bare `1`).
const MIN_JOURNAL_MAX_BYTES: u64 = 1 << 20;

/// The longest `server.request_timeout` and `server.shutdown_timeout`.
const MAX_CONNECTION_TIMEOUT: Duration = Duration::from_secs(3600);

/// The smallest `store.memory_limit`: below it a handful of subjects would
/// evict one another.
const MIN_MEMORY_LIMIT: u64 = 1 << 20;

/// The shortest `sms.code_secret` accepted with Redis (16 random characters
/// are about 95 bits).
const MIN_CODE_SECRET: usize = 16;

fn limits(key: &str, list: &[LimitSetting]) -> Check {
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

fn regions(key: &str, list: &[String]) -> Check {
    for (i, r) in list.iter().enumerate() {
        if r.len() != 2 || !r.chars().all(|c| c.is_ascii_alphabetic()) {
            return Err(SettingsError::invalid(
                &format!("{key}[{i}]"),
                format!("{r:?} is not an ISO 3166 alpha-2 code"),
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

/// The shortest API key or admin token accepted: 16 random characters are
/// beyond online guessing, even unthrottled.
const MIN_BEARER: usize = 16;

/// Every API key and admin token long enough, and none in both lists: a
/// secret that is both would let whoever holds the backend's key into the
/// admin routes, which are meant to be separate (DESIGN.md §3).
fn bearer_secrets(server: &super::ServerSettings) -> Check {
    let admin_tokens: Vec<&super::Secret> =
        server.admin_tokens.iter().map(|t| t.secret()).collect();
    let api_keys: Vec<&super::Secret> = server.api_keys.iter().collect();
    let lists = [
        ("server.api_keys", &api_keys),
        ("server.admin_tokens", &admin_tokens),
    ];
    for (key, list) in lists {
        for (i, secret) in list.iter().enumerate() {
            if secret.expose().chars().count() < MIN_BEARER {
                return Err(SettingsError::invalid(
                    &format!("{key}[{i}]"),
                    format!(
                        "must be at least {MIN_BEARER} characters of random text \
                         (`openssl rand -hex 32` makes one)"
                    ),
                ));
            }
        }
    }
    for (i, api_key) in server.api_keys.iter().enumerate() {
        if let Some(j) = admin_tokens.iter().position(|t| *t == api_key) {
            return Err(SettingsError::invalid(
                &format!("server.admin_tokens[{j}]"),
                format!(
                    "is the same secret as server.api_keys[{i}]; an admin token \
                     and an API key must differ"
                ),
            ));
        }
    }
    Ok(())
}

/// Hops trusted by position: a list header can carry several; a
/// single-address header names one, from the peer. Past 10 no deployment
/// stacks proxies, and a typo would trust what clients write.
fn proxies(server: &super::ServerSettings) -> Check {
    use crate::domain::forwarding::ClientIpHeader;
    let most = match server.client_ip_header {
        ClientIpHeader::Single(_) => 1,
        ClientIpHeader::XForwardedFor | ClientIpHeader::Forwarded => 10,
    };
    if server.trusted_proxy_hops > most {
        return Err(SettingsError::invalid(
            "server.trusted_proxy_hops",
            format!(
                "must be at most {most} with client_ip_header = \"{}\"",
                server.client_ip_header
            ),
        ));
    }
    let limit = &server.admin_auth_limit;
    positive("server.admin_auth_limit.limit", limit.limit.into())?;
    duration("server.admin_auth_limit.window", limit.window)?;
    if limit.shadow {
        return Err(SettingsError::invalid(
            "server.admin_auth_limit.shadow",
            "is not supported: failed admin authentications are always throttled",
        ));
    }
    if limit.algorithm != Algorithm::SlidingLog {
        return Err(SettingsError::invalid(
            "server.admin_auth_limit.algorithm",
            "is not supported: the window counts each failure (sliding_log)",
        ));
    }
    Ok(())
}

impl Settings {
    pub(super) fn validate(&self) -> Check {
        bearer_secrets(&self.server)?;
        super::admin::validate_tokens(&self.server.admin_tokens)?;
        super::admin::validate_oidc(&self.admin.oidc)?;
        proxies(&self.server)?;

        self.check_connections()?;

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
        }

        let audit = &self.audit;
        url_scheme(
            "audit.database_url",
            audit.database_url.expose(),
            &["sqlite:", "postgres://", "postgresql://"],
        )?;
        positive("audit.batch_size", audit.batch_size as u64)?;
        positive("audit.queue_capacity", audit.queue_capacity as u64)?;
        duration("audit.flush_interval", audit.flush_interval)?;
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
        regions("sms.allowed_regions", &sms.allowed_regions)?;
        regions("sms.denied_regions", &sms.denied_regions)?;
        positive("sms.captcha_after", sms.captcha_after.into())?;
        duration("sms.captcha_window", sms.captcha_window)?;
        limits("sms.phone_limits", &sms.phone_limits)?;
        limits("sms.ip_limits", &sms.ip_limits)?;
        limits("sms.prefix_limits", &sms.prefix_limits)?;
        limits("sms.global_limits", &sms.global_limits)?;
        limits("sms.verify_ip_limits", &sms.verify_ip_limits)?;
        if !(1..=15).contains(&sms.prefix_digits) {
            return Err(SettingsError::invalid(
                "sms.prefix_digits",
                "must be between 1 and 15",
            ));
        }
        let pumping = &sms.pumping;
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
        let provider = &sms.provider;
        duration("sms.provider.timeout", provider.timeout)?;
        match provider.kind {
            SmsProviderKind::Log => {}
            SmsProviderKind::Webhook => url_scheme(
                "sms.provider.url",
                provider.url.expose(),
                &["http://", "https://"],
            )?,
            SmsProviderKind::Twilio => {
                if !provider.url.is_empty() {
                    url_scheme(
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

        if let Some(i) = self
            .server
            .cors_origins
            .iter()
            .position(|o| !crate::domain::origin::valid_origin(o))
        {
            return Err(SettingsError::invalid(
                &format!("server.cors_origins[{i}]"),
                "must be `*` or an origin: http(s)://host[:port], nothing after it",
            ));
        }
        if self
            .server
            .admin_bind
            .is_some_and(|admin| admin == self.server.bind && admin.port() != 0)
        {
            return Err(SettingsError::invalid(
                "server.admin_bind",
                "must differ from server.bind (or be left out to serve admin routes there)",
            ));
        }

        let login = &self.login;
        positive("login.captcha_after", login.captcha_after.into())?;
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

        if self.captcha.kind != CaptchaKind::None && self.captcha.secret.is_empty() {
            return Err(SettingsError::invalid(
                "captcha.secret",
                "is required when captcha.kind is not \"none\"",
            ));
        }
        duration("captcha.timeout", self.captcha.timeout)?;
        if !self.captcha.verify_url.is_empty() {
            url_scheme(
                "captcha.verify_url",
                self.captcha.verify_url.expose(),
                &["http://", "https://"],
            )?;
        }

        if let Some((key, why)) = self.lists.invalid() {
            return Err(SettingsError::invalid(&key, &why));
        }
        duration("lists.refresh_interval", self.lists.refresh_interval)?;

        let email = &self.email;
        if !email.smtp_url.expose().is_empty() {
            url_scheme(
                "email.smtp_url",
                email.smtp_url.expose(),
                &["smtp://", "smtps://"],
            )?;
        }
        positive("email.alert_threshold", email.alert_threshold.into())?;
        duration("email.alert_window", email.alert_window)?;
        duration("email.alert_interval", email.alert_interval)?;
        Ok(())
    }

    /// `server`'s timeouts and connection caps; whether the caps fit the
    /// descriptor limit is checked at start-up (`connections::budget`), as
    /// `check-config` may run under another limit than the service.
    fn check_connections(&self) -> Check {
        let server = &self.server;
        for (key, value) in [
            ("server.request_timeout", server.request_timeout),
            ("server.shutdown_timeout", server.shutdown_timeout),
        ] {
            duration(key, value)?;
            // Longer would hold a slow client's descriptor, or a stopping
            // service, for no client's good.
            if value > MAX_CONNECTION_TIMEOUT {
                return Err(SettingsError::invalid(key, "must be at most 1h"));
            }
        }
        for (key, cap) in [
            ("server.max_connections", server.max_connections),
            ("server.admin_max_connections", server.admin_max_connections),
            (
                "server.max_connections_per_ip",
                server.max_connections_per_ip,
            ),
        ] {
            if let Some(cap) = cap {
                positive(key, cap.into())?;
            }
        }
        if let (Some(per_ip), Some(max)) = (server.max_connections_per_ip, server.max_connections) {
            if per_ip > max {
                return Err(SettingsError::invalid(
                    "server.max_connections_per_ip",
                    format!("must not exceed server.max_connections ({max})"),
                ));
            }
        }
        Ok(())
    }
}
