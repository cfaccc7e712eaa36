//! Secrets in the configuration: API keys and admin tokens long enough and
//! distinct, every password masked where it is printed or logged, and
//! `TOLLGATE__…` variables that keep a string's exact text.

use serde_json::json;

use crate::support::app::{free_port, run_binary as tollgate};
use crate::support::process::{config_file, Tollgate};

/// `tollgate check-config` with `toml` as the file and `envs`.
fn check_config(toml: &str, envs: &[(&str, &str)]) -> (bool, String, String) {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("tollgate.toml");
    std::fs::write(&file, toml).unwrap();
    tollgate(&["check-config", "--config", file.to_str().unwrap()], envs)
}

#[test]
fn api_keys_and_admin_tokens_shorter_than_16_characters_stop_start_up() {
    for (toml, key) in [
        (
            "[server]\napi_keys = [\"0123456789abcdef\", \"fifteen-chars!!\"]\n",
            "`server.api_keys[1]`",
        ),
        (
            "[server]\nadmin_tokens = [\"admin\"]\n",
            "`server.admin_tokens[0]`",
        ),
    ] {
        let (ok, _, stderr) = check_config(toml, &[]);
        assert!(!ok, "{toml}");
        assert!(
            stderr.contains(key) && stderr.contains("at least 16 characters"),
            "{toml}: {stderr}"
        );
        // `serve` stops with the same message before it listens.
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("tollgate.toml");
        std::fs::write(&file, toml).unwrap();
        let (ok, _, stderr) = tollgate(&["--config", file.to_str().unwrap()], &[]);
        assert!(!ok, "{toml}");
        assert!(stderr.contains(key), "{stderr}");
    }
    // A secret no header can carry whole, as a file's last newline or a
    // pasted space leaves it, or with a non-ASCII letter, is refused too.
    for (toml, key) in [
        (
            "[server]\napi_keys = [\"0123456789abcdef\\n\"]\n",
            "`server.api_keys[0]`",
        ),
        (
            "[server]\nadmin_tokens = [\"0123456789abcdef\\n\"]\n",
            "`server.admin_tokens[0]`",
        ),
        (
            "[server]\napi_keys = [\" 0123456789abcdef\"]\n",
            "`server.api_keys[0]`",
        ),
        (
            "[server]\nadmin_tokens = [\"  padded-token-1234567890  \"]\n",
            "`server.admin_tokens[0]`",
        ),
        (
            "[server]\nadmin_tokens = [\"                                \"]\n",
            "`server.admin_tokens[0]`",
        ),
        (
            "[server]\napi_keys = [\"0123456789abcdef\", \"0123456789abcdéf\"]\n",
            "`server.api_keys[1]`",
        ),
    ] {
        let (ok, _, stderr) = check_config(toml, &[]);
        assert!(!ok, "{toml}");
        assert!(
            stderr.contains(key) && stderr.contains("visible ASCII"),
            "{toml}: {stderr}"
        );
    }
    // An admin token is a console password too, which may hold a space.
    let (ok, _, stderr) = check_config(
        "[server]\nadmin_tokens = [\"correct horse battery staple\"]\n",
        &[],
    );
    assert!(ok, "{stderr}");
    // Sixteen characters are enough.
    let (ok, _, stderr) = check_config(
        "[server]\napi_keys = [\"0123456789abcdef\"]\nadmin_tokens = [\"fedcba9876543210\"]\n",
        &[],
    );
    assert!(ok, "{stderr}");
}

#[test]
fn one_secret_as_both_an_api_key_and_an_admin_token_is_refused_naming_both() {
    let toml = r#"
[server]
api_keys = ["backend-key-0123456789", "shared-secret-0123456789"]
admin_tokens = ["admin-token-0123456789", "shared-secret-0123456789"]
"#;
    let (ok, stdout, stderr) = check_config(toml, &[]);
    assert!(!ok, "{stdout}");
    assert!(
        stderr.contains("`server.admin_tokens[1]`")
            && stderr.contains("server.api_keys[1]")
            && !stderr.contains("shared-secret"),
        "{stderr}"
    );
}

#[test]
fn check_config_masks_the_secrets_of_every_url() {
    let toml = r#"
[store]
redis_url = "redis://:redis-pass@127.0.0.1:6379"
[audit]
database_url = "postgres://app@127.0.0.1:5432/tg?sslmode=disable&password=db-query-pass"
[sms.provider]
kind = "webhook"
url = "https://hook-user:hook-pass@hooks.example/sms?tenant=acme&Token=hook-token"
[captcha]
kind = "turnstile"
secret = "captcha-secret"
verify_url = "https://cap-user:cap-pass@captcha.example/siteverify?api_key=cap-key"
[email]
smtp_url = "smtp://mailer:smtp-pass@mail.example:587?auth=plain-secret&tls=required"
"#;
    let (ok, stdout, stderr) = check_config(toml, &[]);
    assert!(ok, "{stderr}");
    for secret in [
        "redis-pass",
        "db-query-pass",
        "hook-pass",
        "hook-token",
        "captcha-secret",
        "cap-pass",
        "cap-key",
        "smtp-pass",
        "plain-secret",
    ] {
        assert!(!stdout.contains(secret), "{secret} leaked:\n{stdout}");
    }
    crate::support::app::assert_settings(
        &stdout,
        &[
            ("store.redis_url", r#""redis://:***@127.0.0.1:6379""#),
            (
                "audit.database_url",
                r#""postgres://***@127.0.0.1:5432/tg?sslmode=disable&password=***""#,
            ),
            (
                "sms.provider.url",
                r#""https://hook-user:***@hooks.example/sms?tenant=acme&Token=***""#,
            ),
            (
                "captcha.verify_url",
                r#""https://cap-user:***@captcha.example/siteverify?api_key=***""#,
            ),
            (
                "email.smtp_url",
                r#""smtp://mailer:***@mail.example:587?auth=***&tls=required""#,
            ),
        ],
    );
}

/// A string key keeps the variable's exact text (a `+` number, leading
/// zeros, digits only); numbers and booleans are still read as such.
#[tokio::test]
async fn environment_variables_keep_the_exact_text_of_string_keys() {
    let envs = [
        ("TOLLGATE__STORE__BACKEND", "redis"),
        ("TOLLGATE__SMS__CODE_SECRET", "00000000000000000000000042"),
        ("TOLLGATE__SMS__PROVIDER__KIND", "twilio"),
        ("TOLLGATE__SMS__PROVIDER__ACCOUNT_SID", "0123"),
        ("TOLLGATE__SMS__PROVIDER__AUTH_TOKEN", "0123456789"),
        ("TOLLGATE__SMS__PROVIDER__FROM", "+15005550006"),
        ("TOLLGATE__SMS__CODE_LENGTH", "8"),
        ("TOLLGATE__LOGIN__RESET_ON_SUCCESS", "false"),
        ("TOLLGATE__SMS__PUMPING__MIN_CONVERSION", "0.5"),
    ];
    let (ok, stdout, stderr) = tollgate(&["check-config"], &envs);
    assert!(ok, "{stderr}");
    crate::support::app::assert_settings(
        &stdout,
        &[
            ("sms.provider.from", r#""+15005550006""#),
            ("sms.provider.account_sid", r#""0123""#),
            ("sms.code_length", "8"),
            ("login.reset_on_success", "false"),
            ("sms.pumping.min_conversion", "0.5"),
        ],
    );
    // An integer key still refuses what is not one, naming it.
    let (ok, _, stderr) = tollgate(&["check-config"], &[("TOLLGATE__SMS__CODE_LENGTH", "+8x")]);
    assert!(!ok);
    assert!(stderr.contains("sms.code_length"), "{stderr}");

    // The exact text, not a number read from it: an all-digit admin token
    // with leading zeros opens the admin routes, its number does not.
    let token = "0000000000000000000000042";
    let dir = tempfile::tempdir().unwrap();
    let config = config_file(dir.path(), "", "");
    let server = Tollgate::start_with_env(
        &config,
        &[("TOLLGATE__SERVER__ADMIN_TOKENS", &format!("[{token}]"))],
    )
    .await;
    let client = reqwest::Client::new();
    let lists = |bearer: &'static str| {
        client
            .get(format!("{}/admin/api/lists", server.address))
            .bearer_auth(bearer)
            .send()
    };
    assert_eq!(lists(token).await.unwrap().status(), 200);
    assert_eq!(lists("42").await.unwrap().status(), 401);
}

/// A siteverify address with a token in its query: the line that says the
/// provider is unreachable does not carry it.
#[tokio::test]
async fn a_secret_in_a_url_never_reaches_the_log() {
    let dead = free_port();
    let dir = tempfile::tempdir().unwrap();
    let config = config_file(
        dir.path(),
        "",
        &format!(
            r#"
[sms]
captcha_after = 1
[captcha]
kind = "turnstile"
secret = "captcha-secret-in-the-form"
verify_url = "http://127.0.0.1:{dead}/siteverify?token=query-secret-in-the-url"
"#
        ),
    );
    let server = Tollgate::start(&config).await;
    let client = reqwest::Client::new();
    // A browser's (a loopback backend's own address fills no window).
    let send = |body: serde_json::Value| {
        client
            .post(format!("{}/sms/send", server.address))
            .header("x-forwarded-for", "192.0.2.1")
            .json(&body)
            .send()
    };
    assert_eq!(
        send(json!({ "phone": "+8613800138000" }))
            .await
            .unwrap()
            .status(),
        200
    );
    let refused = send(json!({ "phone": "+8613900139000", "captcha_token": "t" }))
        .await
        .unwrap();
    assert_eq!(refused.status(), 403);
    let logged = server.logged("captcha siteverify unreachable").await;
    let line = logged.first().expect("the failure is logged");
    assert!(line.contains("error sending request"), "{line}");
    let log = server.log.lock().join("\n");
    assert!(!log.contains("query-secret-in-the-url"), "{log}");
    assert!(!log.contains("captcha-secret-in-the-form"), "{log}");
}
