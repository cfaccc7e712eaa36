//! The command line: check-config, migrate and openapi.

use crate::audit_db::{DbKind, TestDb};
use crate::helpers::run_binary as tollgate;

#[test]
fn check_config_prints_the_effective_settings_with_secrets_masked() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("tollgate.toml");
    std::fs::write(
        &file,
        r#"
[server]
api_keys = ["key-one-secret"]
admin_tokens = ["admin-secret"]
[store]
backend = "redis"
redis_url = "redis://:redis-password@127.0.0.1:6379"
[audit]
database_url = "postgres://app:db-password@127.0.0.1:5432/tollgate"
[captcha]
kind = "turnstile"
secret = "captcha-secret"
[sms]
code_secret = "a-long-random-code-secret"
[sms.provider]
kind = "twilio"
account_sid = "AC123"
auth_token = "twilio-secret"
from = "+15005550006"
headers = { "X-Api-Key" = "header-secret" }
"#,
    )
    .unwrap();
    let (ok, stdout, stderr) = tollgate(
        &["check-config", "--config", file.to_str().unwrap()],
        &[("TOLLGATE__LOGIN__LOCK_AFTER", "7")],
    );
    assert!(ok, "{stderr}");
    for secret in [
        "key-one-secret",
        "admin-secret",
        "redis-password",
        "db-password",
        "captcha-secret",
        "twilio-secret",
        "header-secret",
        "a-long-random-code-secret",
    ] {
        assert!(!stdout.contains(secret), "{secret} leaked:\n{stdout}");
    }
    assert!(stdout.contains("\"***\""), "{stdout}");
    assert!(
        stdout.contains("postgres://app:***@127.0.0.1:5432/tollgate"),
        "{stdout}"
    );
    assert!(
        stdout.contains("lock_after = 7"),
        "environment overrides apply:\n{stdout}"
    );
    let parsed: toml::Value = toml::from_str(&stdout).expect("the output is TOML");
    assert_eq!(parsed["store"]["backend"].as_str(), Some("redis"));
}

/// Durations come out as a config file writes them, and read back the same.
#[test]
fn check_config_prints_durations_as_the_configuration_writes_them() {
    let (ok, stdout, stderr) = tollgate(&["check-config"], &[]);
    assert!(ok, "{stderr}");
    for line in [
        "retention = \"90d\"",
        "timeout = \"100ms\"",
        "code_ttl = \"5m\"",
        "lock_max_duration = \"1d\"",
        "flush_interval = \"200ms\"",
    ] {
        assert!(
            stdout.lines().any(|l| l == line),
            "no `{line}` in:\n{stdout}"
        );
    }
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("printed.toml");
    std::fs::write(&file, &stdout).unwrap();
    let (ok, again, stderr) = tollgate(&["check-config", "--config", file.to_str().unwrap()], &[]);
    assert!(ok, "the printed config loads again: {stderr}");
    assert_eq!(again, stdout);
}

/// Redis Sentinel is refused by name rather than half-supported.
#[test]
fn a_sentinel_url_is_refused_with_a_clear_message() {
    let env = [
        ("TOLLGATE__STORE__BACKEND", "redis"),
        (
            "TOLLGATE__STORE__REDIS_URL",
            "redis-sentinel://127.0.0.1:26379",
        ),
        ("TOLLGATE__SMS__CODE_SECRET", "0123456789abcdef0123"),
    ];
    let (ok, _, stderr) = tollgate(&["check-config"], &env);
    assert!(!ok);
    assert!(
        stderr.contains("`store.redis_url`") && stderr.contains("Sentinel is not supported"),
        "{stderr}"
    );
}

/// With Redis the code secret must be set: the store would otherwise hold the
/// key beside the codes it seals.
#[test]
fn the_redis_backend_requires_a_code_secret() {
    let env = [("TOLLGATE__STORE__BACKEND", "redis")];
    let (ok, _, stderr) = tollgate(&["check-config"], &env);
    assert!(!ok);
    assert!(stderr.contains("`sms.code_secret`"), "{stderr}");
    let env = [
        ("TOLLGATE__STORE__BACKEND", "redis"),
        ("TOLLGATE__SMS__CODE_SECRET", "short"),
    ];
    let (ok, _, stderr) = tollgate(&["check-config"], &env);
    assert!(!ok, "a short secret is refused too");
    assert!(stderr.contains("`sms.code_secret`"), "{stderr}");
    let env = [
        ("TOLLGATE__STORE__BACKEND", "redis"),
        ("TOLLGATE__SMS__CODE_SECRET", "0123456789abcdef0123"),
    ];
    let (ok, stdout, stderr) = tollgate(&["check-config"], &env);
    assert!(ok, "{stderr}");
    assert!(
        !stdout.contains("0123456789abcdef0123"),
        "the secret is masked"
    );
}

#[test]
fn check_config_names_the_offending_key_and_exits_1() {
    let cases = [
        (
            vec![("TOLLGATE__LOGIN__LOCK_AFTER", "0")],
            "login.lock_after",
        ),
        (vec![("TOLLGATE__SMS__CODE_TTL", "soon")], "code_ttl"),
        (vec![("TOLLGATE__STORE__ON_ERROR", "maybe")], "on_error"),
        (
            vec![("TOLLGATE__SMS__PHONE_LIMITS", "[{limit=0, window=\"1m\"}]")],
            "sms.phone_limits[0].limit",
        ),
    ];
    for (env, key) in cases {
        let (ok, _, stderr) = tollgate(&["check-config"], &env);
        assert!(!ok, "{env:?} must fail");
        assert!(stderr.contains(key), "{env:?}: {stderr}");
    }
    let (ok, _, stderr) = tollgate(
        &["check-config", "--config", "/nonexistent/tollgate.toml"],
        &[],
    );
    assert!(!ok);
    assert!(stderr.contains("/nonexistent/tollgate.toml"), "{stderr}");
}

#[tokio::test]
async fn migrate_creates_the_audit_table_and_can_run_twice() {
    for kind in [DbKind::Postgres, DbKind::Sqlite] {
        let db = TestDb::new(kind).await;
        for _ in 0..2 {
            let (ok, stdout, stderr) =
                tollgate(&["migrate"], &[("TOLLGATE__AUDIT__DATABASE_URL", &db.url)]);
            assert!(ok, "{kind:?}: {stderr}");
            assert!(stdout.contains("up to date"), "{stdout}");
        }
        let pool = tollgate::audit::AuditDb::connect_lazy(&db.url).unwrap();
        let rows = pool
            .page(&Default::default(), None, 1)
            .await
            .expect("the table exists");
        assert!(rows.is_empty());
    }
}

/// `docs/openapi.json` is what `tollgate openapi` prints, so client
/// generators can use the checked-in file; the command reads no config (a
/// missing file does not stop it).
#[test]
fn the_checked_in_openapi_document_is_the_one_the_binary_prints() {
    let (ok, printed, stderr) = tollgate(&["--config", "/nonexistent.toml", "openapi"], &[]);
    assert!(ok, "{stderr}");
    let document: serde_json::Value = serde_json::from_str(&printed).expect("JSON");
    assert_eq!(document["openapi"], "3.1.0");
    assert!(document["paths"]["/login/attempt"]["post"].is_object());
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/docs/openapi.json");
    let checked_in = std::fs::read_to_string(path).expect("docs/openapi.json");
    assert!(
        checked_in == printed,
        "docs/openapi.json is stale: run `cargo run -- openapi > docs/openapi.json`"
    );
}
