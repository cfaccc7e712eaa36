//! Settings that load and work but leave a production service open to
//! misuse, or do nothing where they are: said in the log at start-up and
//! after each reload (a reload can bring them in).

use super::Settings;

/// Without API keys a login backend names no client's address (DESIGN.md
/// §3: only a key's caller may), and its own is every user's, so no
/// per-address window counts its calls (`RequestInfo::client_ip`): no IP
/// block stops a password sprayer behind it.
fn warn_without_api_keys(settings: &Settings) {
    if settings.server.api_keys.is_empty() {
        tracing::warn!(
            "server.api_keys is empty: a backend on loopback cannot name its clients' addresses, \
             so no per-address window counts what it reports (no login.ip_block_after, no IP \
             limits or lists for its users); set server.api_keys in production (docs/security.md)"
        );
    }
}

/// Without `server.admin_bind` the console, the admin API and `/metrics`
/// answer on `server.bind`: on an address others reach, `/metrics` (no
/// credential) tells anyone how near each rule is to its limit and whether
/// the store fails open, and the console's sign-in is one more door.
fn warn_of_admin_routes_on_a_public_bind(settings: &Settings) {
    let server = &settings.server;
    if server.admin_bind.is_none() && !server.bind.ip().to_canonical().is_loopback() {
        tracing::warn!(
            bind = %server.bind,
            "server.admin_bind is unset, so the console, the admin API and /metrics answer on \
             server.bind, which is not loopback; set server.admin_bind to an address only \
             operators reach (docs/connections.md)"
        );
    }
}

/// The `log` SMS provider writes every code to the log, which is right on
/// a laptop; beside a shared Redis store it is a production set-up left
/// half done, where whoever reads the logs can verify any phone.
fn warn_of_codes_in_the_log(settings: &Settings) {
    use super::{SmsProviderKind, StoreBackend};
    if settings.sms.provider.kind == SmsProviderKind::Log
        && settings.store.backend == StoreBackend::Redis
    {
        tracing::warn!(
            "sms.provider is \"log\" with a Redis store: every code is written to the log, \
             where whoever reads it can verify any phone; set sms.provider (docs/delivery.md)"
        );
    }
}

/// With `captcha.kind = "none"` only the backend can say a captcha was
/// passed (`captcha_passed`). Where browsers call `/sms/*` themselves
/// (`server.keyless_sms`, or no keys on an address others reach) no
/// caller of theirs can pass one, so every captcha tier refuses them as a
/// limit would, and a few unverified sends put a victim's phone, an IPv6
/// network, or a surging country, out of reach for its window.
fn warn_of_captchas_no_browser_can_pass(settings: &Settings) {
    use super::CaptchaKind;
    let server = &settings.server;
    let browsers = server.keyless_sms
        || (server.api_keys.is_empty() && !server.bind.ip().to_canonical().is_loopback());
    if browsers && settings.captcha.kind == CaptchaKind::None {
        tracing::warn!(
            "browsers call /sms/* and captcha.kind is \"none\": no browser can pass a captcha, \
             so every captcha tier (sms.captcha_after, sms.network_captcha_after, the pumping \
             guard's challenges) refuses them like a limit; set [captcha] (docs/integration.md)"
        );
    }
}

/// `captcha.hostnames` and the action lists are read from a provider's
/// answers: with `kind = "none"` there are none, and the lists do nothing.
/// reCAPTCHA scores keys outside Enterprise in steps up to 0.9, so a
/// `min_score` above it refuses everyone.
fn warn_of_answer_checks_without_a_provider(settings: &Settings) {
    use super::CaptchaKind;
    let captcha = &settings.captcha;
    if captcha.kind == CaptchaKind::None
        && !(captcha.hostnames.is_empty()
            && captcha
                .action_lists()
                .iter()
                .all(|(_, list)| list.is_empty()))
    {
        tracing::warn!(
            "captcha.hostnames, captcha.actions, captcha.sms_actions or captcha.login_actions \
             is set with captcha.kind = \"none\": no provider answers, so nothing is checked \
             against them (docs/delivery.md)"
        );
    }
    if captcha.kind == CaptchaKind::Recaptcha && captcha.min_score.get() > 0.9 {
        tracing::warn!(
            "captcha.min_score is above 0.9: reCAPTCHA keys outside Enterprise score at most \
             0.9, so every token is refused (docs/delivery.md)"
        );
    }
}

/// A route's own action list is there to keep the other page's tokens
/// out; with only one route's set, the other reads `captcha.actions`,
/// which may still take that route's tokens (or any, when empty).
fn warn_of_a_half_split_of_actions(settings: &Settings) {
    let captcha = &settings.captcha;
    if let Some((open, own)) = captcha.route_open_to_the_others_tokens() {
        tracing::warn!(
            "{own} is set and {open} is not: that route reads captcha.actions, which takes \
             tokens made for the other page ({own}'s actions, or any when empty); set {open} \
             too (docs/delivery.md)"
        );
    }
}

/// An empty `sms.phone_limits`, or one whose every window is on trial, is
/// allowed (the address's, prefix's and global windows still apply), but
/// then many addresses together may text one victim's number up to the
/// prefix's and global limits: SMS bombing.
fn warn_of_phones_without_limits(settings: &Settings) {
    if settings.sms.phone_limits.iter().all(|window| window.shadow) {
        tracing::warn!(
            "sms.phone_limits is empty or all shadow: no per-phone limit refuses a send, so \
             many addresses together may text one victim's number up to sms.prefix_limits \
             and sms.global_limits (SMS bombing); the default is 1/1m, 5/1h, 10/24h \
             (docs/rules.md)"
        );
    }
}

/// An allow-listed phone is past its own windows; only its asker's count
/// (docs/rules.md): with no per-address window for sends, anyone may have
/// it texted without end, each code tried as many times as any. (Phones
/// admins list at run time are not known here; `sms.network_limits` bound
/// IPv6 askers only.)
fn warn_of_listed_phones_without_asker_limits(settings: &Settings) {
    let unbounded = settings.sms.ip_limits.iter().all(|window| window.shadow);
    if !settings.lists.allow_phones.is_empty() && unbounded {
        tracing::warn!(
            "lists.allow_phones is set and sms.ip_limits is empty or all shadow: nothing bounds \
             the codes anyone may ask for an allow-listed phone (each an SMS paid for, each \
             tried as often as any code) (docs/rules.md)"
        );
    }
}

/// Shadow mode decides and audits but refuses nothing. A reload that turns
/// it on says so (`reload::loosened`); a start in it, by the file or by
/// `TOLLGATE__SHADOW__ENABLED`, said nothing.
fn warn_of_shadow_mode(settings: &Settings) {
    let on: Vec<&str> = settings
        .shadow_switches()
        .into_iter()
        .filter_map(|(key, on)| on.then_some(key))
        .collect();
    if !on.is_empty() {
        tracing::warn!(
            settings = %on.join(", "),
            "shadow mode is on: requests are decided and audited, and none is refused \
             (docs/rules.md)"
        );
    }
}

/// `sms.prefix_digits` counts the country code: a handful of digits makes a
/// prefix a whole country's or operator's numbers, which share every prefix
/// limit and which twenty unverified sends block for everyone; a dozen
/// makes it one number, which the phone's windows keep below the pumping
/// guard's `min_sends`.
fn warn_of_prefixes_far_from_a_range(settings: &Settings) {
    let digits = settings.sms.prefix_digits;
    if digits < 5 {
        tracing::warn!(
            digits,
            "sms.prefix_digits counts the country code: a prefix this short holds a country's \
             or an operator's numbers, whose sends share each prefix limit and which twenty \
             unverified sends block for everyone (docs/pumping.md)"
        );
    } else if digits > 10 {
        tracing::warn!(
            digits,
            "sms.prefix_digits this long makes a prefix a few numbers (a whole +1 number at \
             11): prefix limits count as a phone's, and the pumping guard sees no range \
             (docs/pumping.md)"
        );
    }
}

/// A captcha tier whose threshold is at or past the lock's or block's
/// never asks: the lock comes first.
fn warn_of_login_captchas_that_never_ask(settings: &Settings) {
    use super::LockScope;
    let login = &settings.login;
    let (lock_key, lock_after) = match login.lock_scope {
        LockScope::User => ("login.lock_after", login.lock_after),
        LockScope::UserIp => ("login.account_lock_after", login.account_lock_after),
    };
    if login.captcha_after >= lock_after {
        tracing::warn!(
            "login.captcha_after is not below {lock_key}: the account is locked before any \
             captcha is asked (docs/rules.md)"
        );
    }
    if login.ip_captcha_after >= login.ip_block_after {
        tracing::warn!(
            "login.ip_captcha_after is not below login.ip_block_after: an address is blocked \
             before any captcha is asked (docs/rules.md)"
        );
    }
}

/// An enforced send window at least as long as `sms.captcha_window` that
/// admits no more than `sms.captcha_after` sends refuses its subject before
/// the captcha tier would ask: the tier never asks that phone or address.
fn warn_of_sms_captchas_that_never_ask(settings: &Settings) {
    let sms = &settings.sms;
    for (key, limits) in [
        ("sms.phone_limits", &sms.phone_limits),
        ("sms.ip_limits", &sms.ip_limits),
    ] {
        let first = limits.iter().find(|window| {
            !window.shadow
                && window.window >= sms.captcha_window
                && window.admits_within(sms.captcha_window) <= u64::from(sms.captcha_after)
        });
        if let Some(window) = first {
            tracing::warn!(
                limit = window.limit,
                window = %humantime::format_duration(window.window),
                "{key} refuses at or before sms.captcha_after sends within \
                 sms.captcha_window: that window refuses before any captcha is asked \
                 (docs/rules.md)"
            );
        }
    }
}

/// A prefix window at least as long as the pumping guard's that admits
/// fewer sends than `sms.pumping.min_sends` keeps every prefix below the
/// count the guard judges: it never blocks a prefix (the window alone
/// stops the pumping).
fn warn_of_a_pumping_guard_that_never_judges_a_prefix(settings: &Settings) {
    let sms = &settings.sms;
    let pumping = &sms.pumping;
    let first = sms.prefix_limits.iter().find(|window| {
        !window.shadow
            && window.window >= pumping.window
            && window.admits_within(pumping.window) < u64::from(pumping.min_sends)
    });
    if let (true, Some(window)) = (pumping.enabled, first) {
        tracing::warn!(
            limit = window.limit,
            window = %humantime::format_duration(window.window),
            min_sends = pumping.min_sends,
            "sms.prefix_limits admits fewer sends than sms.pumping.min_sends within \
             sms.pumping.window: no prefix reaches the count the pumping guard judges, so it \
             never blocks one (docs/pumping.md)"
        );
    }
}

/// Notices and digests name accounts, client addresses and owners'
/// addresses: over plain SMTP to another host (or STARTTLS only if
/// offered, which anyone on the path can strip) they can be read or
/// dropped on the way. A login is refused so at start-up already
/// (`validate::smtp_login_encrypted`); a relay without one is warned of.
/// Digests under a minute apart are as many mails as anyone causing locks
/// (junk user names) makes.
fn warn_of_mail_in_clear_or_too_often(settings: &Settings) {
    let email = &settings.email;
    let raw = email.smtp_url.expose();
    if raw.is_empty() {
        return;
    }
    let reach = super::validate::smtp_reach(raw);
    if reach.is_some_and(|reach| !reach.encrypted && !reach.loopback) {
        tracing::warn!(
            "email.smtp_url sends to another host without TLS (no smtps://, no \
             ?tls=required): lock notices and digests, with account names and addresses, \
             can be read or dropped on the way (docs/delivery.md)"
        );
    }
    if !email.admin_alerts_to.is_empty()
        && email.alert_interval < std::time::Duration::from_secs(60)
    {
        tracing::warn!(
            interval = %humantime::format_duration(email.alert_interval),
            "email.alert_interval is under a minute: anyone who can cause locks (junk user \
             names) sends every admin a mail that often (docs/delivery.md)"
        );
    }
}

/// Settings that work but leave a production service open to misuse.
pub fn warn_of_risky_settings(settings: &Settings) {
    warn_of_shadow_mode(settings);
    warn_of_prefixes_far_from_a_range(settings);
    warn_of_login_captchas_that_never_ask(settings);
    warn_of_sms_captchas_that_never_ask(settings);
    warn_of_a_pumping_guard_that_never_judges_a_prefix(settings);
    warn_of_listed_phones_without_asker_limits(settings);
    warn_without_api_keys(settings);
    warn_of_admin_routes_on_a_public_bind(settings);
    warn_of_codes_in_the_log(settings);
    warn_of_mail_in_clear_or_too_often(settings);
    warn_of_captchas_no_browser_can_pass(settings);
    warn_of_answer_checks_without_a_provider(settings);
    warn_of_a_half_split_of_actions(settings);
    warn_of_phones_without_limits(settings);
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use crate::settings::{Algorithm, LimitSetting};

    /// A log admits its limit within any span it covers; a meter its burst
    /// and one per `window / limit` after, the span's end not included.
    #[test]
    fn a_meter_admits_its_burst_and_its_refills_within_a_span() {
        let (hour, half) = (Duration::from_secs(3600), Duration::from_secs(1800));
        let log = LimitSetting::new(15, hour);
        let meter = LimitSetting {
            algorithm: Algorithm::Gcra,
            ..log
        };
        assert_eq!((log.admits_within(hour), log.admits_within(half)), (15, 15));
        // Back at 4, 8, .. 56 minutes; at 4 .. 28 within the half hour.
        assert_eq!(meter.admits_within(hour), 29);
        assert_eq!(meter.admits_within(half), 22);
        assert_eq!(meter.admits_within(Duration::ZERO), 15);
    }
}
