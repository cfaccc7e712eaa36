//! A template directory laid over the compiled-in templates (`templates.dir`).

use super::tests::{compiled, digest_vars, lock_vars};
use super::*;

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

/// A file for a built-in locale spelled otherwise replaces it (it stood
/// beside it unused), and a request finds a locale spelled with `_`.
#[test]
fn a_locale_is_one_whatever_the_case_and_separator_of_its_name() {
    let dir = tempfile::tempdir().unwrap();
    write(&dir.path().join("zh-cn.txt"), "验证码 {{ code }}");
    write(&dir.path().join("pt_BR.txt"), "Código {{ code }}");
    let templates = Templates::load(&sms_dir(dir.path())).unwrap();
    assert_eq!(templates.sms_locales(), ["en", "pt_BR", "zh-CN"]);
    assert_eq!(
        templates.render_sms(Some("zh-CN"), "123456", 300).unwrap(),
        ("zh-CN".to_string(), "验证码 123456".to_string())
    );
    assert_eq!(
        templates.render_sms(Some("pt-br"), "123456", 300).unwrap(),
        ("pt_BR".to_string(), "Código 123456".to_string())
    );

    write(&dir.path().join("pt-BR.txt"), "Código: {{ code }}");
    let error = load_error(&sms_dir(dir.path()));
    assert!(error.contains("pt_BR"), "{error}");
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
