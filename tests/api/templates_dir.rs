//! `sms.templates_dir` / `email.templates_dir` on the real binary: the texts
//! sent come from the directory, a change to a file is in force without a
//! restart, and a broken template is refused at start-up and on reload,
//! naming its file and line.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::json;
use wiremock::matchers::method;
use wiremock::{Mock, MockServer, ResponseTemplate};

use crate::support::app::run_binary;
use crate::support::process::{config_file, Tollgate};
use crate::support::wait::eventually;

fn write_config(dir: &Path, provider: &str, templates: &Path) -> PathBuf {
    let sms = format!(
        r#"
[sms]
code_secret = "templates-dir-test-secret"
captcha_after = 100
templates_dir = "{templates}"
[sms.provider]
kind = "webhook"
url = "{provider}/sms"
"#,
        templates = templates.display(),
    );
    config_file(dir, "", &sms)
}

/// Wait until `server` has logged a reload refused for a syntax error on
/// line 2 of `template`.
async fn rejected_naming_line_2(server: &Tollgate, template: &Path) {
    let broken = format!("{}:2: syntax error", template.display());
    eventually("the rejection in the log", Duration::from_secs(10), || {
        let found = server
            .log
            .lock()
            .iter()
            .any(|l| l.contains("config rejected") && l.contains(&broken));
        async move { found }
    })
    .await;
}

/// A stand-in SMS provider that takes every message.
async fn accepting_provider() -> MockServer {
    let provider = MockServer::start().await;
    Mock::given(method("POST"))
        .respond_with(ResponseTemplate::new(200))
        .mount(&provider)
        .await;
    provider
}

/// The bodies the stand-in provider got, in order.
async fn sent_bodies(provider: &MockServer) -> Vec<(String, String)> {
    provider
        .received_requests()
        .await
        .unwrap_or_default()
        .iter()
        .map(|r| {
            let body: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
            (
                body["locale"].as_str().unwrap().to_string(),
                body["body"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

#[tokio::test]
async fn sms_texts_come_from_the_directory_and_a_changed_file_is_sent_without_a_restart() {
    let provider = accepting_provider().await;
    let dir = tempfile::tempdir().unwrap();
    let templates = dir.path().join("sms-texts");
    std::fs::create_dir(&templates).unwrap();
    std::fs::write(templates.join("fr.txt"), "Votre code : {{ code }}").unwrap();
    let config = write_config(dir.path(), &provider.uri(), &templates);
    let server = Tollgate::start(&config).await;
    let client = reqwest::Client::new();
    let send = |phone: &'static str, locale: &'static str| {
        let client = client.clone();
        let url = format!("{}/sms/send", server.address);
        async move {
            let response = client
                .post(url)
                .json(&json!({ "phone": phone, "locale": locale }))
                .send()
                .await
                .unwrap();
            assert_eq!(response.status(), 200);
        }
    };

    send("+8613800138001", "fr-FR").await;
    send("+8613800138002", "zh-CN").await;
    let bodies = sent_bodies(&provider).await;
    assert_eq!(bodies[0].0, "fr", "a new locale from the file name");
    assert!(bodies[0].1.starts_with("Votre code : "), "{bodies:?}");
    assert_eq!(bodies[1].0, "zh-CN", "the compiled-in locales stay");

    // Edited in place: the next code goes out in the new text.
    std::fs::write(templates.join("fr.txt"), "Code tollgate : {{ code }}").unwrap();
    let mut phone = 0;
    let phones = [
        "+8613800138003",
        "+8613800138004",
        "+8613800138005",
        "+8613800138006",
        "+8613800138007",
    ];
    eventually("the edited template", Duration::from_secs(10), || {
        let next = phones[phone.min(phones.len() - 1)];
        phone += 1;
        let send = send(next, "fr");
        let provider = &provider;
        async move {
            send.await;
            let bodies = sent_bodies(provider).await;
            bodies.last().unwrap().1.starts_with("Code tollgate : ")
        }
    })
    .await;

    // A broken edit is refused, named by file and line; the last good text stays.
    std::fs::write(templates.join("fr.txt"), "Code tollgate :\n{{ code ").unwrap();
    rejected_naming_line_2(&server, &templates.join("fr.txt")).await;
    send("+8613800138009", "fr").await;
    let bodies = sent_bodies(&provider).await;
    assert!(
        bodies.last().unwrap().1.starts_with("Code tollgate : "),
        "{bodies:?}"
    );
}

#[test]
fn a_broken_template_stops_check_config_and_start_up_naming_the_file_and_line() {
    let dir = tempfile::tempdir().unwrap();
    let templates = dir.path().join("email-texts");
    std::fs::create_dir_all(templates.join("fr")).unwrap();
    std::fs::write(
        templates.join("fr/lock_notice.txt"),
        "{% block subject %}Compte {{ user }}{% endblock %}\n{% block body %}\nBloqué {{ minutes }} minutes.\n{% endblock %}",
    )
    .unwrap();
    let email = format!("[email]\ntemplates_dir = \"{}\"", templates.display());
    let config = config_file(dir.path(), "", &email);
    let where_ = format!(
        "{}:3: undefined value",
        templates.join("fr/lock_notice.txt").display()
    );
    let config = config.to_str().unwrap();
    for command in ["check-config", "serve"] {
        let (ok, _, stderr) = run_binary(&["--config", config, command], &[]);
        assert!(!ok, "{command} fails");
        assert!(stderr.contains(&where_), "{command}: {stderr}");
    }

    std::fs::write(
        templates.join("fr/lock_notice.txt"),
        "{% block subject %}Compte {{ user }}{% endblock %}\n{% block body %}\nBloqué {{ locked_minutes }} minutes.\n{% endblock %}",
    )
    .unwrap();
    let (ok, stdout, stderr) = run_binary(&["--config", config, "check-config"], &[]);
    assert!(ok, "{stderr}");
    assert!(stdout.contains("templates_dir"), "{stdout}");
}

/// A config that names a new templates directory whose template is broken
/// is refused; mending the template there is then noticed and reloads,
/// though the config file itself is unchanged (before, only the directory
/// of the settings in force was watched).
#[tokio::test]
async fn a_template_mended_in_a_directory_a_refused_config_named_is_reloaded() {
    let provider = accepting_provider().await;
    let dir = tempfile::tempdir().unwrap();
    let first = dir.path().join("first");
    let second = dir.path().join("second");
    for (templates, text) in [
        (&first, "Premier : {{ code }}"),
        (&second, "Second :\n{{ code "),
    ] {
        std::fs::create_dir(templates).unwrap();
        std::fs::write(templates.join("fr.txt"), text).unwrap();
    }
    let config = write_config(dir.path(), &provider.uri(), &first);
    let server = Tollgate::start(&config).await;
    let client = reqwest::Client::new();
    let send = |phone: String| {
        let client = client.clone();
        let url = format!("{}/sms/send", server.address);
        async move {
            let response = client
                .post(url)
                .json(&json!({ "phone": phone, "locale": "fr" }))
                .send()
                .await
                .unwrap();
            assert_eq!(response.status(), 200);
        }
    };
    send("+8613800138001".into()).await;

    write_config(dir.path(), &provider.uri(), &second);
    rejected_naming_line_2(&server, &second.join("fr.txt")).await;

    std::fs::write(second.join("fr.txt"), "Second : {{ code }}").unwrap();
    let mut phone = 10;
    eventually("the mended template", Duration::from_secs(10), || {
        phone += 1;
        let send = send(format!("+86138001380{phone}"));
        let provider = &provider;
        async move {
            send.await;
            let bodies = sent_bodies(provider).await;
            bodies.last().unwrap().1.starts_with("Second : ")
        }
    })
    .await;
}
