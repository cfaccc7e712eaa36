//! The command line: check-config, migrate and openapi.

use crate::support::app::run_binary as tollgate;
use crate::support::audit_db::{DbKind, TestDb};

#[test]
fn check_config_prints_the_effective_settings_with_secrets_masked() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("tollgate.toml");
    std::fs::write(
        &file,
        r#"
[server]
api_keys = ["key-one-secret-0123456789"]
admin_tokens = ["admin-secret-0123456789"]
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
        "key-one-secret-0123456789",
        "admin-secret-0123456789",
        "redis-password",
        "db-password",
        "captcha-secret",
        "twilio-secret",
        "header-secret",
        "a-long-random-code-secret",
    ] {
        assert!(!stdout.contains(secret), "{secret} leaked:\n{stdout}");
        assert!(!stderr.contains(secret), "{secret} leaked:\n{stderr}");
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

/// check-config warns on stderr of what start-up would, and its stdout is
/// still the settings alone.
#[test]
fn check_config_warns_of_what_start_up_would() {
    let env = [
        ("TOLLGATE__CAPTCHA__KIND", "turnstile"),
        ("TOLLGATE__CAPTCHA__SECRET", "turnstile-secret-0123"),
        ("TOLLGATE__CAPTCHA__LOGIN_ACTIONS", "[login]"),
    ];
    let (ok, stdout, stderr) = tollgate(&["check-config"], &env);
    assert!(ok, "{stderr}");
    assert!(
        stderr.contains("captcha.login_actions is set and captcha.sms_actions is not"),
        "{stderr}"
    );
    let parsed: toml::Value = toml::from_str(&stdout).expect("the output is TOML");
    assert_eq!(
        parsed["captcha"]["login_actions"][0].as_str(),
        Some("login")
    );
    let (ok, _, quiet) = tollgate(
        &["check-config"],
        &[
            ("TOLLGATE__CAPTCHA__SMS_ACTIONS", "[sms]"),
            env[0],
            env[1],
            env[2],
        ],
    );
    assert!(ok, "{quiet}");
    assert!(!quiet.contains("captcha.login_actions is set"), "{quiet}");
    assert!(!quiet.contains("sms.phone_limits is empty"), "{quiet}");
    let trial = "[{limit=1,window=\"60s\",shadow=true}]";
    let (ok, _, shadow) = tollgate(&["check-config"], &[("TOLLGATE__SMS__PHONE_LIMITS", trial)]);
    assert!(ok, "{shadow}");
    assert!(
        shadow.contains("sms.phone_limits is empty or all shadow"),
        "{shadow}"
    );
    let (ok, _, unlimited) = tollgate(&["check-config"], &[("TOLLGATE__SMS__PHONE_LIMITS", "[]")]);
    assert!(ok, "{unlimited}");
    assert!(
        unlimited.contains("sms.phone_limits is empty or all shadow: no per-phone limit"),
        "{unlimited}"
    );
    let listed = ("TOLLGATE__LISTS__ALLOW_PHONES", "[+8613800138000]");
    let (ok, _, counted) = tollgate(&["check-config"], &[listed]);
    assert!(ok, "{counted}");
    assert!(!counted.contains("lists.allow_phones is set"), "{counted}");
    let (ok, _, tried) = tollgate(
        &["check-config"],
        &[listed, ("TOLLGATE__SMS__VERIFY_IP_LIMITS", "[]")],
    );
    assert!(ok, "{tried}");
    assert!(!tried.contains("lists.allow_phones is set"), "{tried}");
    let (ok, _, paid) = tollgate(
        &["check-config"],
        &[listed, ("TOLLGATE__SMS__IP_LIMITS", "[]")],
    );
    assert!(ok, "{paid}");
    assert!(
        paid.contains("lists.allow_phones is set and sms.ip_limits is empty or all shadow"),
        "{paid}"
    );
}

/// Shadow mode, a prefix that is a country or a number, and a captcha tier
/// the lock always beats are said on stderr; the defaults say none of it.
#[test]
fn check_config_warns_of_settings_that_defeat_their_purpose() {
    let (ok, _, quiet) = tollgate(&["check-config"], &[]);
    assert!(ok, "{quiet}");
    for said in [
        "shadow mode is on",
        "sms.prefix_digits",
        "before any captcha",
        "pumping guard judges",
        "email.smtp_url",
        "email.alert_interval",
    ] {
        assert!(!quiet.contains(said), "{said}: {quiet}");
    }
    for (env, said) in [
        (
            [("TOLLGATE__SHADOW__ENABLED", "true")].as_slice(),
            "shadow mode is on",
        ),
        (&[("TOLLGATE__LOGIN__SHADOW", "true")], "login.shadow"),
        (
            &[("TOLLGATE__SMS__PREFIX_DIGITS", "4")],
            "a prefix this short",
        ),
        (
            &[("TOLLGATE__SMS__PREFIX_DIGITS", "11")],
            "a prefix a few numbers",
        ),
        (
            &[("TOLLGATE__LOGIN__CAPTCHA_AFTER", "100")],
            "login.captcha_after is not below login.account_lock_after",
        ),
        (
            &[
                ("TOLLGATE__LOGIN__LOCK_SCOPE", "user"),
                ("TOLLGATE__LOGIN__CAPTCHA_AFTER", "10"),
            ],
            "login.captcha_after is not below login.lock_after",
        ),
        (
            &[("TOLLGATE__LOGIN__IP_CAPTCHA_AFTER", "100")],
            "login.ip_captcha_after is not below login.ip_block_after",
        ),
        (
            &[("TOLLGATE__SMS__CAPTCHA_AFTER", "5")],
            "sms.phone_limits refuses at or before sms.captcha_after",
        ),
        (
            &[("TOLLGATE__SMS__CAPTCHA_AFTER", "20")],
            "sms.ip_limits refuses at or before sms.captcha_after",
        ),
        (
            &[("TOLLGATE__SMS__PUMPING__MIN_SENDS", "60")],
            "no prefix reaches the count the pumping guard judges",
        ),
        (
            &[("TOLLGATE__EMAIL__SMTP_URL", "smtp://mail.example:25")],
            "email.smtp_url sends to another host without TLS",
        ),
        (
            &[
                ("TOLLGATE__EMAIL__SMTP_URL", "smtp://127.0.0.1:25"),
                ("TOLLGATE__EMAIL__ADMIN_ALERTS_TO", r#"["ops@example.com"]"#),
                ("TOLLGATE__EMAIL__ALERT_INTERVAL", "30s"),
            ],
            "email.alert_interval is under a minute",
        ),
    ] {
        let (ok, _, stderr) = tollgate(&["check-config"], env);
        assert!(ok, "{stderr}");
        assert!(stderr.contains(said), "{env:?}: {said}: {stderr}");
    }
}

/// Durations come out as a config file writes them, and read back the same.
#[test]
fn check_config_prints_durations_as_the_configuration_writes_them() {
    let (ok, stdout, stderr) = tollgate(&["check-config"], &[]);
    assert!(ok, "{stderr}");
    crate::support::app::assert_settings(
        &stdout,
        &[
            ("audit.retention", "\"90d\""),
            ("store.timeout", "\"100ms\""),
            ("sms.code_ttl", "\"5m\""),
            ("login.lock_max_duration", "\"1d\""),
            ("audit.flush_interval", "\"200ms\""),
        ],
    );
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

/// A one-connection-at-a-time HTTP server on 127.0.0.1 that answers each
/// connection with the next of `answers` (a status line), and hands back the
/// request lines it got. `None` accepts and never answers.
fn scripted_server(
    answers: Vec<Option<&'static str>>,
) -> (u16, std::thread::JoinHandle<Vec<String>>) {
    use std::io::{BufRead, BufReader, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let handle = std::thread::spawn(move || {
        let mut requests = Vec::new();
        for answer in answers {
            let (stream, _) = listener.accept().unwrap();
            let mut reader = BufReader::new(stream.try_clone().unwrap());
            let mut line = String::new();
            reader.read_line(&mut line).unwrap();
            requests.push(line.trim_end().to_string());
            match answer {
                Some(status) => {
                    let mut stream = stream;
                    write!(
                        stream,
                        "{status}\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"
                    )
                    .unwrap();
                }
                // Hold the connection open until the client gives up.
                None => {
                    let _ = reader.read_line(&mut String::new());
                    let _ = std::io::Read::read_to_end(&mut reader, &mut Vec::new());
                }
            }
        }
        requests
    });
    (port, handle)
}

/// The image's HEALTHCHECK runs `tollgate healthcheck` with the container's
/// config, which binds 0.0.0.0: it asks loopback on the configured port, and
/// only a 200 is healthy (a 503, a silent server, a closed port are not).
#[test]
fn healthcheck_asks_loopback_on_the_configured_port_and_wants_a_200() {
    let (port, server) = scripted_server(vec![
        Some("HTTP/1.1 503 Service Unavailable"),
        Some("HTTP/1.1 200 OK"),
        Some("HTTP/1.1 200 OK"),
        None,
    ]);
    let bind = format!("0.0.0.0:{port}");
    let env = [("TOLLGATE__SERVER__BIND", bind.as_str())];
    let (ok, stdout, stderr) = tollgate(&["healthcheck"], &env);
    assert!(!ok, "a 503 is unhealthy: {stdout}");
    assert_eq!(
        stderr.trim(),
        format!(
            "tollgate: http://127.0.0.1:{port}/healthz answered \"HTTP/1.1 503 Service Unavailable\""
        )
    );
    let (ok, stdout, stderr) = tollgate(&["healthcheck"], &env);
    assert!(ok, "{stderr}");
    assert_eq!(stdout, "HTTP/1.1 200 OK\n");
    let (ok, _, stderr) = tollgate(&["healthcheck", "--ready"], &env);
    assert!(ok, "{stderr}");
    let address = format!("127.0.0.1:{port}");
    let (ok, _, stderr) = tollgate(
        &["healthcheck", "--address", &address, "--timeout", "300ms"],
        &[],
    );
    assert!(!ok);
    assert_eq!(
        stderr.trim(),
        format!("tollgate: no answer from http://{address}/healthz within 300ms")
    );
    assert_eq!(
        server.join().unwrap(),
        [
            "GET /healthz HTTP/1.1",
            "GET /healthz HTTP/1.1",
            "GET /readyz HTTP/1.1",
            "GET /healthz HTTP/1.1",
        ]
    );
    // Nothing listens there any more.
    let (ok, _, stderr) = tollgate(&["healthcheck", "--address", &address], &[]);
    assert!(!ok);
    assert!(
        stderr.starts_with(&format!(
            "tollgate: cannot connect to http://{address}/healthz"
        )),
        "{stderr}"
    );
    // A port of 0 in the config names no server to ask.
    let (ok, _, stderr) = tollgate(&["healthcheck"], &[("TOLLGATE__SERVER__BIND", "0.0.0.0:0")]);
    assert!(!ok);
    assert!(stderr.contains("pass --address"), "{stderr}");
}

/// A reader that goes away (`tollgate openapi | head -1`) ends the output:
/// the document is larger than a pipe holds, and `print!` panicked on the
/// closed pipe (exit 101).
#[test]
fn a_reader_that_goes_away_ends_the_output_without_a_panic() {
    use std::io::Read;
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_tollgate"))
        .arg("openapi")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("the binary runs");
    let mut first = [0u8; 1];
    let mut stdout = child.stdout.take().expect("a pipe");
    stdout.read_exact(&mut first).expect("a byte");
    drop(stdout);
    let output = child.wait_with_output().expect("it ends");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert!(output.status.success(), "{:?}: {stderr}", output.status);
}

/// With an admin listener, liveness asks it first, then the public one:
/// the process is live while either answers (a flood filling one
/// listener's connections must not get it restarted); readiness asks the
/// public one alone.
#[test]
fn healthcheck_is_live_while_either_listener_answers() {
    let closed = crate::support::app::free_port();
    let (admin_port, admin) = scripted_server(vec![Some("HTTP/1.1 200 OK")]);
    let (public_port, public) = scripted_server(vec![
        Some("HTTP/1.1 503 Service Unavailable"),
        Some("HTTP/1.1 200 OK"),
    ]);
    let env = |public: u16, admin: u16| {
        [
            ("TOLLGATE__SERVER__BIND", format!("0.0.0.0:{public}")),
            ("TOLLGATE__SERVER__ADMIN_BIND", format!("0.0.0.0:{admin}")),
        ]
    };
    let run = |args: &[&str], env: &[(&str, String); 2]| {
        let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
        tollgate(args, &env)
    };
    // The admin listener answers: the public one is not asked.
    let (ok, stdout, stderr) = run(&["healthcheck"], &env(public_port, admin_port));
    assert!(ok, "{stderr}");
    assert_eq!(stdout, "HTTP/1.1 200 OK\n");
    assert_eq!(admin.join().unwrap(), ["GET /healthz HTTP/1.1"]);
    // Readiness is the public listener's: a 503 there is not ready.
    let (ok, _, stderr) = run(&["healthcheck", "--ready"], &env(public_port, closed));
    assert!(!ok, "the public listener answered 503");
    assert!(
        stderr.contains(&format!(":{public_port}/readyz")),
        "{stderr}"
    );
    // The admin listener does not answer: the public one's 200 is live.
    let (ok, _, stderr) = run(&["healthcheck"], &env(public_port, closed));
    assert!(ok, "{stderr}");
    assert_eq!(
        public.join().unwrap(),
        ["GET /readyz HTTP/1.1", "GET /healthz HTTP/1.1"]
    );
    // Neither answers: not live, and both are named.
    let also_closed = crate::support::app::free_port();
    let (ok, _, stderr) = run(&["healthcheck"], &env(also_closed, closed));
    assert!(!ok);
    for port in [closed, also_closed] {
        assert!(stderr.contains(&format!(":{port}/healthz")), "{stderr}");
    }
    // Given addresses: each asked in turn, no config read.
    let (port, given) = scripted_server(vec![Some("HTTP/1.1 200 OK")]);
    let (first, second) = (
        format!("--address=127.0.0.1:{closed}"),
        format!("--address=127.0.0.1:{port}"),
    );
    let (ok, _, stderr) = tollgate(
        &["healthcheck", &first, &second],
        &[("TOLLGATE__SERVER__BIND", "not an address")],
    );
    assert!(ok, "{stderr}");
    assert_eq!(given.join().unwrap(), ["GET /healthz HTTP/1.1"]);
}

/// Against the real server: live and ready with its SQLite audit file;
/// with Redis unreachable, still live (the container is not restarted for
/// it) but not ready.
#[tokio::test]
async fn healthcheck_tells_live_from_ready_on_the_real_server() {
    use crate::support::process::{config_file, Tollgate};
    let dir = tempfile::tempdir().unwrap();
    let healthcheck = |address: String, ready: bool| {
        tokio::task::spawn_blocking(move || {
            let mut args = vec!["healthcheck", "--address", address.as_str()];
            if ready {
                args.push("--ready");
            }
            tollgate(&args, &[])
        })
    };
    let config = config_file(dir.path(), "", "");
    let server = Tollgate::start(&config).await;
    let address = server.address.trim_start_matches("http://").to_string();
    let (ok, stdout, stderr) = healthcheck(address.clone(), false).await.unwrap();
    assert!(ok, "{stderr}");
    assert_eq!(stdout, "HTTP/1.1 200 OK\n");
    let (ok, _, stderr) = healthcheck(address, true).await.unwrap();
    assert!(ok, "{stderr}");
    drop(server);

    let dir = tempfile::tempdir().unwrap();
    let config = config_file(
        dir.path(),
        "",
        "[store]\nbackend = \"redis\"\nredis_url = \"redis://127.0.0.1:1\"\n[sms]\ncode_secret = \"0123456789abcdef0123\"\n",
    );
    let server = Tollgate::start(&config).await;
    let address = server.address.trim_start_matches("http://").to_string();
    let (ok, _, stderr) = healthcheck(address.clone(), false).await.unwrap();
    assert!(ok, "{stderr}");
    let (ok, _, stderr) = healthcheck(address.clone(), true).await.unwrap();
    assert!(!ok);
    assert_eq!(
        stderr.trim(),
        format!("tollgate: http://{address}/readyz answered \"HTTP/1.1 503 Service Unavailable\"")
    );
}

/// The container image's config and the Kubernetes ConfigMap's are configs
/// tollgate takes (with the secrets the Secret would add), listening on all
/// interfaces with the admin routes on a port of their own: a renamed key
/// fails here before the image or manifest checks run.
#[test]
fn the_container_and_kubernetes_configs_are_valid() {
    let root = env!("CARGO_MANIFEST_DIR");
    let container = format!("{root}/packaging/container/tollgate.toml");
    let (ok, stdout, stderr) = tollgate(&["check-config", "--config", &container], &[]);
    assert!(ok, "{stderr}");
    crate::support::app::assert_settings(
        &stdout,
        &[
            ("server.bind", "\"0.0.0.0:8080\""),
            ("server.admin_bind", "\"0.0.0.0:8081\""),
            (
                "audit.database_url",
                "\"sqlite:///var/lib/tollgate/audit.db?mode=rwc\"",
            ),
            ("audit.spool_dir", "\"/var/lib/tollgate/spool\""),
        ],
    );
    let kubernetes = format!("{root}/deploy/kubernetes/tollgate.toml");
    let secrets = [
        (
            "TOLLGATE__SMS__CODE_SECRET",
            "9f2c4e6a8b0d1f3e5a7c9e1b3d5f7a9c",
        ),
        (
            "TOLLGATE__STORE__REDIS_URL",
            "redis://:pw@redis.tollgate.svc:6379",
        ),
        (
            "TOLLGATE__AUDIT__DATABASE_URL",
            "postgres://tollgate:pw@postgres.tollgate.svc:5432/tollgate",
        ),
        ("TOLLGATE__SERVER__API_KEYS", "[\"an-api-key-0123456789\"]"),
        (
            "TOLLGATE__SERVER__ADMIN_TOKENS",
            "[\"an-admin-token-0123456789\"]",
        ),
    ];
    let (ok, stdout, stderr) = tollgate(&["check-config", "--config", &kubernetes], &secrets);
    assert!(ok, "{stderr}");
    crate::support::app::assert_settings(
        &stdout,
        &[
            ("server.bind", "\"0.0.0.0:8080\""),
            ("server.admin_bind", "\"0.0.0.0:8081\""),
            ("store.backend", "\"redis\""),
            ("audit.spool_dir", "\"/var/lib/tollgate/spool\""),
        ],
    );
    // Without the Secret's code secret, a Redis deployment does not start.
    let (ok, _, stderr) = tollgate(&["check-config", "--config", &kubernetes], &secrets[1..]);
    assert!(!ok);
    assert!(stderr.contains("`sms.code_secret`"), "{stderr}");
}

/// The connection keys the defaults leave unset are numbers in the
/// environment too (`TOLLGATE__SERVER__WORKERS=1`), not text the settings
/// refuse.
#[test]
fn unset_numeric_server_keys_are_taken_from_the_environment() {
    let env = [
        ("TOLLGATE__SERVER__WORKERS", "1"),
        ("TOLLGATE__SERVER__MAX_CONNECTIONS", "100"),
        ("TOLLGATE__SERVER__MAX_CONNECTIONS_PER_IP", "10"),
        ("TOLLGATE__SERVER__ADMIN_MAX_CONNECTIONS", "5"),
    ];
    let (ok, stdout, stderr) = tollgate(&["check-config"], &env);
    assert!(ok, "{stderr}");
    crate::support::app::assert_settings(
        &stdout,
        &[
            ("server.workers", "1"),
            ("server.max_connections", "100"),
            ("server.max_connections_per_ip", "10"),
            ("server.admin_max_connections", "5"),
        ],
    );
    let (ok, _, stderr) = tollgate(&["check-config"], &[("TOLLGATE__SERVER__WORKERS", "0")]);
    assert!(!ok);
    assert!(
        stderr.contains("`server.workers`: must be positive"),
        "{stderr}"
    );
}

/// A setting's variable figment would pass over without a word stops
/// `check-config` (and start-up), naming it.
#[test]
fn a_misnamed_setting_variable_is_refused_naming_it() {
    for (name, hint) in [
        (
            "TOLLGATE_SMS__CODE_LENGTH",
            "did you mean TOLLGATE__SMS__CODE_LENGTH?",
        ),
        ("TOLLGATE__SMS____CODE_LENGTH", "empty segment"),
    ] {
        let (ok, _, stderr) = tollgate(&["check-config"], &[(name, "8")]);
        assert!(!ok, "{name}");
        assert!(
            stderr.contains(name) && stderr.contains(hint),
            "{name}: {stderr}"
        );
    }
    let (ok, _, stderr) = tollgate(&["check-config"], &[("TOLLGATE_SOMETHING_ELSE", "x")]);
    assert!(ok, "{stderr}");
}
