//! The compiled-in templates, and a directory laid over them.

use serde_json::json;

use super::*;

fn compiled() -> Templates {
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

fn lock_vars(ip: &str) -> serde_json::Value {
    json!({
        "user": "alice",
        "locked_minutes": 15,
        "locked_until": "2026-01-01T00:15:00Z",
        "ip": ip,
        "address_only": false,
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
}

fn write(path: &std::path::Path, text: &str) {
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent).unwrap();
    }
    std::fs::write(path, text).unwrap();
}

fn sms_dir(dir: &std::path::Path) -> TemplateDirs {
    TemplateDirs {
        sms: Some(dir.to_path_buf()),
        email: None,
    }
}

fn load_error(dirs: &TemplateDirs) -> String {
    match Templates::load(dirs) {
        Ok(_) => panic!("loaded"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn a_directory_replaces_a_locale_and_adds_new_ones_from_file_names() {
    let dir = tempfile::tempdir().unwrap();
    write(
        &dir.path().join("en.txt"),
        "Code: {{ code }} ({{ ttl_minutes }} min)",
    );
    write(&dir.path().join("fr.txt"), "Votre code : {{ code }}");
    let templates = Templates::load(&sms_dir(dir.path())).unwrap();
    assert_eq!(templates.sms_locales(), ["en", "fr", "zh-CN"]);
    assert_eq!(
        templates.render_sms(Some("en"), "123456", 300).unwrap(),
        ("en".to_string(), "Code: 123456 (5 min)".to_string())
    );
    assert_eq!(
        templates.render_sms(Some("fr-CA"), "123456", 300).unwrap(),
        ("fr".to_string(), "Votre code : 123456".to_string())
    );
    let (locale, body) = templates.render_sms(Some("zh-CN"), "123456", 300).unwrap();
    assert_eq!(locale, "zh-CN");
    assert_eq!(
        body,
        compiled()
            .render_sms(Some("zh-CN"), "123456", 300)
            .unwrap()
            .1
    );
}

#[test]
fn an_email_locale_may_hold_one_kind_and_the_other_falls_back_to_english() {
    let dir = tempfile::tempdir().unwrap();
    write(
        &dir.path().join("fr/lock_notice.txt"),
        "{% block subject %}Compte {{ user }} bloqué{% endblock %}\n{% block body %}{{ locked_minutes }} minutes{% if ip %}, depuis {{ ip }}{% endif %}.{% endblock %}",
    );
    let templates = Templates::load(&TemplateDirs {
        sms: None,
        email: Some(dir.path().to_path_buf()),
    })
    .unwrap();
    assert_eq!(
        templates.email_locales(EmailKind::LockNotice),
        ["en", "fr", "zh-CN"]
    );
    assert_eq!(
        templates.email_locales(EmailKind::AlertDigest),
        ["en", "zh-CN"]
    );
    let notice = templates
        .render_email(EmailKind::LockNotice, Some("fr"), lock_vars("203.0.113.7"))
        .unwrap();
    assert_eq!(notice.subject, "Compte alice bloqué");
    assert_eq!(notice.body, "15 minutes, depuis 203.0.113.7.\n");
    let digest = templates
        .render_email(EmailKind::AlertDigest, Some("fr"), digest_vars())
        .unwrap();
    assert_eq!(
        digest,
        compiled()
            .render_email(EmailKind::AlertDigest, Some("en"), digest_vars())
            .unwrap()
    );
}

#[test]
fn a_syntax_error_names_the_file_and_line() {
    let dir = tempfile::tempdir().unwrap();
    write(
        &dir.path().join("fr.txt"),
        "Bonjour.\nVotre code : {{ code \n",
    );
    let error = load_error(&sms_dir(dir.path()));
    let file = dir.path().join("fr.txt").display().to_string();
    assert!(
        error.starts_with(&format!("{file}:2: syntax error")),
        "{error}"
    );
}

#[test]
fn a_variable_the_sender_does_not_give_names_the_file_and_line() {
    let dir = tempfile::tempdir().unwrap();
    write(
        &dir.path().join("fr.txt"),
        "Bonjour.\n\nVotre code : {{ cod }}",
    );
    let error = load_error(&sms_dir(dir.path()));
    let file = dir.path().join("fr.txt").display().to_string();
    assert!(
        error.starts_with(&format!("{file}:3: undefined value")),
        "{error}"
    );

    // Inside a loop of the digest, which only runs when the sample has items.
    let email = tempfile::tempdir().unwrap();
    write(
        &email.path().join("en/alert_digest.txt"),
        "{% block subject %}x{% endblock %}{% block body %}\n{% for lock in locks %}\n{{ lock.user }}\n{% endfor %}{% endblock %}",
    );
    let error = load_error(&TemplateDirs {
        sms: None,
        email: Some(email.path().to_path_buf()),
    });
    let file = email
        .path()
        .join("en/alert_digest.txt")
        .display()
        .to_string();
    assert!(
        error.starts_with(&format!("{file}:3: undefined value")),
        "{error}"
    );
}

#[test]
fn an_email_without_its_body_block_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    write(
        &dir.path().join("fr/lock_notice.txt"),
        "{% block subject %}Compte bloqué{% endblock %}",
    );
    let error = load_error(&TemplateDirs {
        sms: None,
        email: Some(dir.path().to_path_buf()),
    });
    let file = dir.path().join("fr/lock_notice.txt").display().to_string();
    assert!(
        error.starts_with(&file) && error.contains("body"),
        "{error}"
    );
}

#[test]
fn names_that_are_not_templates_are_refused_and_dot_names_skipped() {
    for (name, reason) in [
        ("fr.text", "expected a <locale>.txt file"),
        ("fr ca.txt", "is not a locale"),
        ("fr", "expected a <locale>.txt file"),
    ] {
        let dir = tempfile::tempdir().unwrap();
        if name == "fr" {
            std::fs::create_dir(dir.path().join(name)).unwrap();
        } else {
            write(&dir.path().join(name), "{{ code }}");
        }
        let error = load_error(&sms_dir(dir.path()));
        let path = dir.path().join(name).display().to_string();
        assert!(
            error.starts_with(&path) && error.contains(reason),
            "{name}: {error}"
        );
    }

    let email = tempfile::tempdir().unwrap();
    write(&email.path().join("fr/welcome.txt"), "hi");
    let error = load_error(&TemplateDirs {
        sms: None,
        email: Some(email.path().to_path_buf()),
    });
    assert!(
        error.contains("expected lock_notice.txt or alert_digest.txt"),
        "{error}"
    );

    let missing = std::path::Path::new("/nonexistent/tollgate-templates");
    let error = load_error(&sms_dir(missing));
    assert!(
        error.starts_with("/nonexistent/tollgate-templates: "),
        "{error}"
    );

    let dir = tempfile::tempdir().unwrap();
    write(&dir.path().join(".fr.txt.swp"), "{{ broken");
    write(&dir.path().join("..data/junk"), "{{ broken");
    assert_eq!(
        Templates::load(&sms_dir(dir.path())).unwrap().sms_locales(),
        ["en", "zh-CN"]
    );
}

/// The layout a mounted Kubernetes ConfigMap has: the files are links
/// through `..data`, itself a link to a timestamped directory.
#[cfg(unix)]
#[test]
fn a_configmap_volume_loads_through_its_links() {
    use std::os::unix::fs::symlink;
    let dir = tempfile::tempdir().unwrap();
    write(
        &dir.path().join("..2026_11_23_00_00_00.1/fr.txt"),
        "Code {{ code }}",
    );
    symlink("..2026_11_23_00_00_00.1", dir.path().join("..data")).unwrap();
    symlink("..data/fr.txt", dir.path().join("fr.txt")).unwrap();
    let templates = Templates::load(&sms_dir(dir.path())).unwrap();
    assert_eq!(
        templates.render_sms(Some("fr"), "42", 60).unwrap().1,
        "Code 42"
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

#[test]
fn an_sms_text_that_does_not_show_the_code_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    write(
        &dir.path().join("fr.txt"),
        "Votre code expire dans {{ ttl_minutes }} minutes.",
    );
    let error = load_error(&sms_dir(dir.path()));
    let file = dir.path().join("fr.txt").display().to_string();
    assert_eq!(
        error,
        format!("{file}: the text does not show the code: write {{{{ code }}}} in it")
    );
}

#[test]
fn editor_backups_and_lost_found_are_not_read() {
    let dir = tempfile::tempdir().unwrap();
    write(&dir.path().join("fr.txt~"), "{{ broken");
    std::fs::create_dir(dir.path().join("lost+found")).unwrap();
    write(&dir.path().join("fr.txt"), "Code {{ code }}");
    assert_eq!(
        Templates::load(&sms_dir(dir.path())).unwrap().sms_locales(),
        ["en", "fr", "zh-CN"]
    );
}
