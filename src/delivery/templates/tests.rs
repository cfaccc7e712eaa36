//! The compiled-in templates (a directory laid over them: dir_tests.rs).

use serde_json::json;

use super::*;

pub(super) fn compiled() -> Templates {
    Templates::compiled()
}

#[test]
fn locales_fall_back_to_language_then_english() {
    assert_eq!(compiled().resolve_sms_locale(Some("zh-CN")), "zh-CN");
    assert_eq!(compiled().resolve_sms_locale(Some("zh-cn")), "zh-CN");
    assert_eq!(compiled().resolve_sms_locale(Some("en-GB")), "en");
    assert_eq!(compiled().resolve_sms_locale(Some("zh-TW")), "en");
    assert_eq!(compiled().resolve_sms_locale(Some("fr")), "en");
    assert_eq!(compiled().resolve_sms_locale(None), "en");
}

#[test]
fn the_sms_holds_the_code_as_one_run_of_digits_and_the_ttl_in_every_locale() {
    for locale in ["en", "zh-CN"] {
        let (used, body) = compiled()
            .render_sms(Some(locale), "0123456789", 300)
            .unwrap();
        assert_eq!(used, *locale);
        let runs: Vec<&str> = body
            .split(|c: char| !c.is_ascii_digit())
            .filter(|run| !run.is_empty())
            .collect();
        assert!(runs.contains(&"0123456789"), "{locale}: {body}");
        assert!(runs.contains(&"5"), "{locale}: the ttl in minutes: {body}");
        assert!(!body.contains("{{"), "{locale}: {body}");
    }
    let (_, body) = compiled().render_sms(Some("en"), "123456", 300).unwrap();
    assert!(
        body.contains("123456") && body.contains("5 minutes"),
        "{body}"
    );
}

#[test]
fn a_ttl_under_a_minute_rounds_up() {
    let (_, body) = compiled().render_sms(Some("en"), "123456", 30).unwrap();
    assert!(body.contains("1 minutes"), "{body}");
}

pub(super) fn lock_vars(ip: &str) -> serde_json::Value {
    json!({
        "user": "alice",
        "locked_minutes": 15,
        "locked_until": "2026-01-01T00:15:00Z",
        "ip": ip,
        "address_only": false,
    })
}

pub(super) fn digest_vars() -> serde_json::Value {
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
    for locale in ["en", "zh-CN"] {
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
            let email = compiled().render_email(kind, Some(locale), vars).unwrap();
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
    let with = compiled()
        .render_email(EmailKind::LockNotice, Some("en"), lock_vars("203.0.113.7"))
        .unwrap();
    let without = compiled()
        .render_email(EmailKind::LockNotice, Some("en"), lock_vars(""))
        .unwrap();
    assert!(with.body.contains("from 203.0.113.7"), "{}", with.body);
    assert!(!without.body.contains("from"), "{}", without.body);
}

#[test]
fn the_digest_lists_one_lock_per_line() {
    let email = compiled()
        .render_email(EmailKind::AlertDigest, Some("en"), digest_vars())
        .unwrap();
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
    let err = compiled().render_email(
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
    let email = compiled()
        .render_email(EmailKind::LockNotice, Some("en"), vars)
        .unwrap();
    assert!(!email.subject.contains(['\r', '\n']), "{:?}", email.subject);
    // Nor at the separators mail clients break lines at, nor through an
    // encoded word a client would decode.
    vars = lock_vars("");
    vars["user"] = json!("eve\u{2028}Re: your invoice\u{2029}\u{202e} =?utf-8?b?SGk=?=");
    let email = compiled()
        .render_email(EmailKind::LockNotice, Some("en"), vars)
        .unwrap();
    assert!(
        !email.subject.contains(['\u{2028}', '\u{2029}', '\u{202e}'])
            && !email.subject.contains("=?"),
        "{:?}",
        email.subject
    );
}

#[test]
fn a_lock_of_one_address_says_the_other_addresses_still_work() {
    let pair_vars = || {
        let mut vars = lock_vars("203.0.113.7");
        vars["address_only"] = json!(true);
        vars
    };
    for locale in ["en", "zh-CN"] {
        let pair = compiled()
            .render_email(EmailKind::LockNotice, Some(locale), pair_vars())
            .unwrap();
        let account = compiled()
            .render_email(
                EmailKind::LockNotice,
                Some(locale),
                lock_vars("203.0.113.7"),
            )
            .unwrap();
        assert_ne!(pair.subject, account.subject, "{locale}");
        assert!(pair.body.contains("203.0.113.7"), "{locale}: {}", pair.body);
    }
    let pair = compiled()
        .render_email(EmailKind::LockNotice, Some("en"), pair_vars())
        .unwrap();
    assert_eq!(
        pair.subject,
        "Sign-ins to your account alice from one address were paused after too many failures"
    );
    assert!(
        pair.body
            .contains("from 203.0.113.7.\nSign-ins from that address are paused for 15 minutes")
            && pair
                .body
                .contains("Sign-ins from your other devices and networks still work."),
        "{}",
        pair.body
    );
}
