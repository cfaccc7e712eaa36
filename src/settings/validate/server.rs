//! `[server]`: the bearer secrets, the proxies, the admin sign-in throttle,
//! the connections and the routes' origins.

use std::time::Duration;

use super::{duration, positive, Check};
use crate::settings::{Algorithm, LimitSetting, Settings, SettingsError};

/// The longest `server.request_timeout` and `server.shutdown_timeout`.
const MAX_CONNECTION_TIMEOUT: Duration = Duration::from_secs(3600);

/// The most `server.workers`: actix-server's own bound (it panics past it).
const MAX_WORKERS: u32 = 512;

/// The shortest API key or admin token accepted: 16 random characters are
/// beyond online guessing, even unthrottled.
const MIN_BEARER: usize = 16;

/// Every API key and admin token long enough, no admin token twice, and
/// none in both lists: a secret that is both would let whoever holds the
/// backend's key into the admin routes, which are meant to be separate
/// (DESIGN.md §3).
pub(super) fn bearer_secrets(server: &crate::settings::ServerSettings) -> Check {
    let admin_tokens: Vec<&crate::settings::Secret> =
        server.admin_tokens.iter().map(|t| t.secret()).collect();
    let api_keys: Vec<&crate::settings::Secret> = server.api_keys.iter().collect();
    // An API key goes in a header, which carries visible ASCII only,
    // trimmed: one with a space, a line break (a file's last newline) or a
    // non-ASCII letter could never be presented. An admin token is also a
    // console password (HTTP Basic, decoded, not trimmed), which may hold
    // spaces and letters inside; but a control character no one types there
    // either, and one that starts or ends with a space works in the console
    // only (or, all spaces, is no secret at all).
    fn header_safe(text: &str) -> bool {
        text.bytes().all(|b| b.is_ascii_graphic())
    }
    fn typable(text: &str) -> bool {
        !text.chars().any(char::is_control) && text.trim() == text
    }
    type Presentable = fn(&str) -> bool;
    let lists = [
        ("server.api_keys", &api_keys, header_safe as Presentable),
        ("server.admin_tokens", &admin_tokens, typable),
    ];
    for (key, list, presentable) in lists {
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
            if !presentable(secret.expose()) {
                return Err(SettingsError::invalid(
                    &format!("{key}[{i}]"),
                    "holds a character no caller can present: an API key must be visible \
                     ASCII (no space, line break or non-ASCII letter), an admin token free of \
                     control characters and line breaks, with no space at either end",
                ));
            }
        }
    }
    for (j, token) in admin_tokens.iter().enumerate() {
        if let Some(i) = admin_tokens[..j].iter().position(|t| t == token) {
            return Err(SettingsError::invalid(
                &format!("server.admin_tokens[{j}]"),
                format!(
                    "is the same secret as server.admin_tokens[{i}]; each admin's token \
                     must be its own (whoever holds it would act as one of them, with its roles)"
                ),
            ));
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
pub(super) fn proxies(server: &crate::settings::ServerSettings) -> Check {
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
    failure_limit(
        "server.admin_auth_limit",
        &server.admin_auth_limit,
        "failed admin authentications",
    )?;
    failure_limit(
        "server.admin_auth_network_limit",
        &server.admin_auth_network_limit,
        "failed admin authentications",
    )?;
    Ok(())
}

/// A window of failures per address (`server.admin_auth_limit`,
/// `captcha.failed_token_limit`): a positive limit and window, enforced and
/// counted one by one.
pub(super) fn failure_limit(key: &str, limit: &LimitSetting, counted: &str) -> Check {
    positive(&format!("{key}.limit"), limit.limit.into())?;
    duration(&format!("{key}.window"), limit.window)?;
    if limit.shadow {
        return Err(SettingsError::invalid(
            &format!("{key}.shadow"),
            format!("is not supported: {counted} are always throttled"),
        ));
    }
    if limit.algorithm != Algorithm::SlidingLog {
        return Err(SettingsError::invalid(
            &format!("{key}.algorithm"),
            "is not supported: the window counts each failure (sliding_log)",
        ));
    }
    Ok(())
}

impl Settings {
    /// `server.cors_origins` and `server.admin_bind`.
    pub(super) fn check_routes(&self) -> Check {
        use crate::domain::origin::{check_origin, OriginError};
        for (i, origin) in self.server.cors_origins.iter().enumerate() {
            let message = match check_origin(origin) {
                Ok(()) => continue,
                Err(OriginError::NotAnOrigin) => {
                    "must be `*` or an origin: http(s)://host[:port], nothing after it".to_string()
                }
                Err(OriginError::NotAsBrowsersWriteIt(form)) => format!(
                    "browsers send this origin as {form:?} and CORS compares it as written: write that"
                ),
            };
            return Err(SettingsError::invalid(
                &format!("server.cors_origins[{i}]"),
                message,
            ));
        }
        let origins = &self.server.cors_origins;
        if let (Some(i), true) = (origins.iter().position(|o| o == "*"), origins.len() > 1) {
            // actix-cors keeps the last of "any origin" and a named one, so
            // the list would allow every origin or only the named ones by
            // its order.
            return Err(SettingsError::invalid(
                &format!("server.cors_origins[{i}]"),
                "`*` allows every origin: list it alone, or list the origins without it",
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
        Ok(())
    }

    /// `server`'s timeouts and connection caps; whether the caps fit the
    /// descriptor limit is checked at start-up (`connections::budget`), as
    /// `check-config` may run under another limit than the service.
    pub(super) fn check_connections(&self) -> Check {
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
            // 0 would refuse every admin connection that is not a trusted
            // proxy's: the console and /metrics out of reach until a restart.
            (
                "server.admin_max_connections_per_ip",
                server.admin_max_connections_per_ip,
            ),
            ("server.workers", server.workers),
        ] {
            if let Some(cap) = cap {
                positive(key, cap.into())?;
            }
        }
        if server.workers.is_some_and(|n| n > MAX_WORKERS) {
            return Err(SettingsError::invalid(
                "server.workers",
                format!("must be at most {MAX_WORKERS}"),
            ));
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
