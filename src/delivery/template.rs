//! SMS and email texts per locale, rendered with minijinja from the files in
//! `templates/`, compiled in. Templates are plain text (`.txt`: no HTML
//! escaping); an undefined variable is an error, not an empty string.
//!
//! - `templates/sms/<locale>.txt`: variables `code`, `ttl_minutes`, `ttl_secs`.
//! - `templates/email/<locale>/<kind>.txt`: a `subject` block and a `body` block.

use std::sync::LazyLock;

use minijinja::{Environment, UndefinedBehavior};
use serde::Serialize;

/// Every locale has every template (a unit test checks it); `en` is the fallback.
pub const LOCALES: &[&str] = &["en", "zh-CN"];

const FALLBACK: &str = "en";

const TEMPLATES: &[(&str, &str)] = &[
    ("sms/en.txt", include_str!("../../templates/sms/en.txt")),
    (
        "sms/zh-CN.txt",
        include_str!("../../templates/sms/zh-CN.txt"),
    ),
    (
        "email/en/lock_notice.txt",
        include_str!("../../templates/email/en/lock_notice.txt"),
    ),
    (
        "email/en/alert_digest.txt",
        include_str!("../../templates/email/en/alert_digest.txt"),
    ),
    (
        "email/zh-CN/lock_notice.txt",
        include_str!("../../templates/email/zh-CN/lock_notice.txt"),
    ),
    (
        "email/zh-CN/alert_digest.txt",
        include_str!("../../templates/email/zh-CN/alert_digest.txt"),
    ),
];

static ENV: LazyLock<Environment<'static>> = LazyLock::new(|| {
    let mut env = Environment::new();
    env.set_undefined_behavior(UndefinedBehavior::Strict);
    env.set_trim_blocks(true);
    env.set_lstrip_blocks(true);
    for (name, source) in TEMPLATES {
        // The files are compiled in and parsed by a unit test: a syntax error
        // cannot reach a release build.
        env.add_template(name, source)
            .unwrap_or_else(|e| panic!("template {name} does not parse: {e:#}"));
    }
    env
});

/// A template failed to render (a bug: they are checked by unit tests).
#[derive(Debug, thiserror::Error)]
#[error("template {name}: {source:#}")]
pub struct TemplateError {
    name: String,
    #[source]
    source: minijinja::Error,
}

/// The locale actually used: an exact match (case-insensitive), then the
/// language alone (`en-GB` → `en`; `zh-TW` → none), then `en`.
pub fn resolve_locale(requested: Option<&str>) -> &'static str {
    let requested = requested.unwrap_or(FALLBACK);
    if let Some(found) = LOCALES.iter().find(|l| l.eq_ignore_ascii_case(requested)) {
        return found;
    }
    let language = requested.split(['-', '_']).next().unwrap_or("");
    LOCALES
        .iter()
        .find(|l| l.eq_ignore_ascii_case(language))
        .copied()
        .unwrap_or(FALLBACK)
}

/// Renders the SMS body; returns the locale used and the text.
pub fn render_sms(
    requested_locale: Option<&str>,
    code: &str,
    ttl_secs: u64,
) -> Result<(&'static str, String), TemplateError> {
    #[derive(Serialize)]
    struct Vars<'a> {
        code: &'a str,
        ttl_minutes: u64,
        ttl_secs: u64,
    }
    let locale = resolve_locale(requested_locale);
    let name = format!("sms/{locale}.txt");
    let vars = Vars {
        code,
        ttl_minutes: ttl_secs.div_ceil(60),
        ttl_secs,
    };
    let body = ENV
        .get_template(&name)
        .and_then(|t| t.render(vars))
        .map_err(|source| TemplateError { name, source })?;
    Ok((locale, body.trim_end().to_string()))
}

/// The emails tollgate sends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EmailKind {
    /// To the account's owner, once per lock.
    LockNotice,
    /// To the admins, at most once per `email.alert_interval`.
    AlertDigest,
}

impl EmailKind {
    /// The template's file name without `.txt`; also the `kind` of log lines.
    pub fn as_str(self) -> &'static str {
        match self {
            EmailKind::LockNotice => "lock_notice",
            EmailKind::AlertDigest => "alert_digest",
        }
    }
}

/// An email's text, ready to send.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RenderedEmail {
    /// One line.
    pub subject: String,
    /// Plain text, ending in one newline.
    pub body: String,
}

/// Renders the `subject` and `body` blocks of `templates/email/<locale>/<kind>.txt`.
pub fn render_email(
    kind: EmailKind,
    requested_locale: Option<&str>,
    vars: impl Serialize,
) -> Result<RenderedEmail, TemplateError> {
    let locale = resolve_locale(requested_locale);
    let name = format!("email/{locale}/{}.txt", kind.as_str());
    let rendered = ENV.get_template(&name).and_then(|t| {
        // The whole text is discarded; only the two blocks are kept.
        let mut captured = t.render_captured(vars)?;
        captured.with_state_mut(|state| {
            Ok((state.render_block("subject")?, state.render_block("body")?))
        })
    });
    let (subject, body) = rendered.map_err(|source| TemplateError { name, source })?;
    // A header must stay one line, whatever a variable held.
    let subject = subject
        .split(char::is_control)
        .filter(|part| !part.is_empty())
        .collect::<Vec<_>>()
        .join(" ");
    Ok(RenderedEmail {
        subject: subject.trim().to_string(),
        body: format!("{}\n", body.trim()),
    })
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn locales_fall_back_to_language_then_english() {
        assert_eq!(resolve_locale(Some("zh-CN")), "zh-CN");
        assert_eq!(resolve_locale(Some("zh-cn")), "zh-CN");
        assert_eq!(resolve_locale(Some("en-GB")), "en");
        assert_eq!(resolve_locale(Some("zh-TW")), "en");
        assert_eq!(resolve_locale(Some("fr")), "en");
        assert_eq!(resolve_locale(None), "en");
    }

    #[test]
    fn the_sms_holds_the_code_as_one_run_of_digits_and_the_ttl_in_every_locale() {
        for locale in LOCALES {
            let (used, body) = render_sms(Some(locale), "0123456789", 300).unwrap();
            assert_eq!(used, *locale);
            let runs: Vec<&str> = body
                .split(|c: char| !c.is_ascii_digit())
                .filter(|run| !run.is_empty())
                .collect();
            assert!(runs.contains(&"0123456789"), "{locale}: {body}");
            assert!(runs.contains(&"5"), "{locale}: the ttl in minutes: {body}");
            assert!(!body.contains("{{"), "{locale}: {body}");
        }
        let (_, body) = render_sms(Some("en"), "123456", 300).unwrap();
        assert!(
            body.contains("123456") && body.contains("5 minutes"),
            "{body}"
        );
    }

    #[test]
    fn a_ttl_under_a_minute_rounds_up() {
        let (_, body) = render_sms(Some("en"), "123456", 30).unwrap();
        assert!(body.contains("1 minutes"), "{body}");
    }

    fn lock_vars(ip: &str) -> serde_json::Value {
        json!({
            "user": "alice",
            "locked_minutes": 15,
            "locked_until": "2026-01-01T00:15:00Z",
            "ip": ip,
        })
    }

    fn digest_vars() -> serde_json::Value {
        json!({
            "since": "2026-01-01T00:00:00Z",
            "until": "2026-01-01T01:00:00Z",
            "locks": [
                { "kind": "user", "subject": "alice", "reason": "too_many_failures",
                  "rule": "user 10/1h", "minutes": 15, "at": "2026-01-01T00:10:00Z", "shadow": false },
                { "kind": "ip", "subject": "203.0.113.9", "reason": "ip_blocked",
                  "rule": "ip 100/1h", "minutes": 60, "at": "2026-01-01T00:11:00Z", "shadow": true },
            ],
            "more_locks": 2,
            "rules": [{ "action": "sms_send", "rule": "phone 5/1h", "denials": 120,
                        "threshold": 100, "window": "5m" }],
        })
    }

    #[test]
    fn every_email_renders_a_one_line_subject_and_a_body_in_every_locale() {
        for locale in LOCALES {
            for (kind, vars, must_hold) in [
                (
                    EmailKind::LockNotice,
                    lock_vars("203.0.113.7"),
                    ["alice", "203.0.113.7", "15"],
                ),
                (
                    EmailKind::AlertDigest,
                    digest_vars(),
                    ["alice", "phone 5/1h", "120"],
                ),
            ] {
                let email = render_email(kind, Some(locale), vars).unwrap();
                assert!(
                    !email.subject.is_empty() && !email.subject.contains('\n'),
                    "{email:?}"
                );
                for needle in must_hold {
                    assert!(
                        email.body.contains(needle),
                        "{locale} {kind:?} lacks {needle}: {}",
                        email.body
                    );
                }
                assert!(
                    !email.body.contains("{%") && !email.body.contains("{{"),
                    "{}",
                    email.body
                );
            }
        }
    }

    #[test]
    fn the_lock_notice_names_the_ip_only_when_known() {
        let with =
            render_email(EmailKind::LockNotice, Some("en"), lock_vars("203.0.113.7")).unwrap();
        let without = render_email(EmailKind::LockNotice, Some("en"), lock_vars("")).unwrap();
        assert!(with.body.contains("from 203.0.113.7"), "{}", with.body);
        assert!(!without.body.contains("from"), "{}", without.body);
    }

    #[test]
    fn the_digest_lists_one_lock_per_line() {
        let email = render_email(EmailKind::AlertDigest, Some("en"), digest_vars()).unwrap();
        let lines: Vec<&str> = email
            .body
            .lines()
            .filter(|l| l.starts_with("  - "))
            .collect();
        assert_eq!(
            lines,
            [
                "  - user alice: too_many_failures (user 10/1h), 15 min, at 2026-01-01T00:10:00Z",
                "  - ip 203.0.113.9: ip_blocked (ip 100/1h), 60 min, at 2026-01-01T00:11:00Z [shadow: not enforced]",
                "  - and 2 more",
                "  - sms_send \"phone 5/1h\": more than 100 denials within 5m; 120 since the last alert",
            ],
            "{}",
            email.body
        );
        assert_eq!(
            email.subject,
            "[tollgate] 4 lock(s), 1 SMS rule(s) over threshold"
        );
    }

    #[test]
    fn a_missing_variable_is_an_error_not_an_empty_string() {
        let err = render_email(
            EmailKind::LockNotice,
            Some("en"),
            json!({ "user": "alice" }),
        );
        assert!(err.is_err());
    }

    #[test]
    fn a_subject_never_spans_lines() {
        let mut vars = lock_vars("");
        vars["user"] = json!("eve\r\nBcc: victim@example.com");
        let email = render_email(EmailKind::LockNotice, Some("en"), vars).unwrap();
        assert!(!email.subject.contains(['\r', '\n']), "{:?}", email.subject);
    }
}
