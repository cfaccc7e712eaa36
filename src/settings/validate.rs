//! Start-up checks the types alone cannot express. Each failure names its key.

use std::time::Duration;

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

fn duration(key: &str, value: Duration) -> Check {
    if value.as_millis() == 0 {
        return Err(SettingsError::invalid(key, "must be at least 1ms"));
    }
    Ok(())
}

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

impl Settings {
    pub(super) fn validate(&self) -> Check {
        for (i, k) in self.server.api_keys.iter().enumerate() {
            if k.is_empty() {
                return Err(SettingsError::invalid(
                    &format!("server.api_keys[{i}]"),
                    "must not be empty",
                ));
            }
        }
        for (i, k) in self.server.admin_tokens.iter().enumerate() {
            if k.is_empty() {
                return Err(SettingsError::invalid(
                    &format!("server.admin_tokens[{i}]"),
                    "must not be empty",
                ));
            }
        }

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
        let provider = &sms.provider;
        duration("sms.provider.timeout", provider.timeout)?;
        match provider.kind {
            SmsProviderKind::Log => {}
            SmsProviderKind::Webhook => {
                url_scheme("sms.provider.url", &provider.url, &["http://", "https://"])?
            }
            SmsProviderKind::Twilio => {
                if !provider.url.is_empty() {
                    url_scheme("sms.provider.url", &provider.url, &["http://", "https://"])?;
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
            .position(|o| !crate::routes::cors::valid_origin(o))
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
                &self.captcha.verify_url,
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
}
