//! What only the real binary shows: the log lines a request writes (its id,
//! its span, never a phone, a code or a token) and TLS to a real Redis.

use std::process::Stdio;
use std::time::Duration;

use serde_json::json;

use crate::support::process::{config_file, Tollgate};
use crate::support::wait::eventually;

/// A store failure on the request path is logged with the request's id (at
/// the default level, where requests get no span).
#[tokio::test]
async fn a_store_failure_is_logged_with_the_request_id() {
    let dead_port = crate::support::app::free_port();
    let dir = tempfile::tempdir().unwrap();
    let config = config_file(
        dir.path(),
        "",
        &format!(
            r#"
[store]
backend = "redis"
redis_url = "redis://127.0.0.1:{dead_port}"
[sms]
code_secret = "process-test-code-secret"
"#
        ),
    );
    let server = Tollgate::start(&config).await;
    let response = reqwest::Client::new()
        .post(format!("{}/login/check", server.address))
        .header("x-request-id", "req-store-down-1")
        .json(&json!({ "user": "alice" }))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 503);
    let lines = server.logged("store unavailable").await;
    assert_eq!(lines.len(), 1, "{:?}", server.log.lock());
    let line: serde_json::Value = serde_json::from_str(&lines[0]).unwrap();
    assert_eq!(line["request_id"], "req-store-down-1", "{line}");
}

/// At `debug`, a request gets one span (its id, method
/// and route pattern) and one `request done` line in it, with the status and
/// the time: no user name, no path.
#[tokio::test]
async fn at_debug_a_request_logs_one_line_in_its_span() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("tollgate.toml");
    std::fs::write(
        &config,
        format!(
            r#"
[server]
bind = "127.0.0.1:0"
[audit]
database_url = "sqlite://{}/audit.db?mode=rwc"
spool_dir = "{}/spool"
"#,
            dir.path().display(),
            dir.path().display()
        ),
    )
    .unwrap();
    let server = Tollgate::start_with_env(&config, &[("RUST_LOG", "tollgate=debug")]).await;
    let response = reqwest::Client::new()
        .post(format!("{}/login/check", server.address))
        .header("x-request-id", "req-span-1")
        .json(&json!({ "user": "span-alice" }))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(response.headers()["x-request-id"], "req-span-1");
    let done = || {
        server
            .log
            .lock()
            .iter()
            .filter(|l| l.contains("request done") && l.contains("req-span-1"))
            .cloned()
            .collect::<Vec<_>>()
    };
    for _ in 0..50 {
        if !done().is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let lines = done();
    assert_eq!(
        lines.len(),
        1,
        "one line per request: {:?}",
        server.log.lock()
    );
    let line: serde_json::Value = serde_json::from_str(&lines[0]).unwrap();
    let span = &line["span"];
    assert_eq!(
        (
            &span["name"],
            &span["request_id"],
            &span["method"],
            &span["route"]
        ),
        (
            &json!("request"),
            &json!("req-span-1"),
            &json!("POST"),
            &json!("/login/check")
        ),
        "{line}"
    );
    assert_eq!(
        (&line["status"], &line["route"]),
        (&json!(200), &json!("/login/check"))
    );
    assert!(line["elapsed_us"].is_u64(), "{line}");
    assert!(
        !server.log.lock().iter().any(|l| l.contains("span-alice")),
        "no user name in any line"
    );
}

/// A whole run at the default level: sends (one delivered, one the provider
/// refuses), verifies, logins, bad keys, bad input, the admin API, the CSV and
/// the console, phones in paths. No log line carries a phone number, a code,
/// an API key or an admin token.
#[tokio::test]
async fn no_log_line_carries_a_phone_a_code_or_a_token() {
    use wiremock::matchers::{body_string_contains, method};
    use wiremock::{Mock, MockServer, ResponseTemplate};

    const API_KEY: &str = "log-test-api-key-7f3a9c";
    const ADMIN: &str = "log-test-admin-token-5e1b2d";
    let provider = MockServer::start().await;
    Mock::given(method("POST"))
        .and(body_string_contains("13900139000"))
        .respond_with(ResponseTemplate::new(500).set_body_string("gateway down for +8613900139000"))
        .mount(&provider)
        .await;
    Mock::given(method("POST"))
        .respond_with(ResponseTemplate::new(200))
        .mount(&provider)
        .await;

    let dir = tempfile::tempdir().unwrap();
    let config = config_file(
        dir.path(),
        &format!("api_keys = [\"{API_KEY}\"]\nadmin_tokens = [\"{ADMIN}\"]"),
        &format!(
            r#"
[sms]
phone_limits = [{{ limit = 1, window = "1h" }}]
[sms.provider]
kind = "webhook"
url = "{url}/sms"
"#,
            url = provider.uri(),
        ),
    );
    let server = Tollgate::start(&config).await;
    let client = reqwest::Client::new();
    let post = |path: &str, body: serde_json::Value| {
        client
            .post(format!("{}{path}", server.address))
            .bearer_auth(API_KEY)
            .json(&body)
            .send()
    };
    let admin = |path: &str| {
        client
            .get(format!("{}{path}", server.address))
            .bearer_auth(ADMIN)
            .send()
    };

    let sent = post(
        "/sms/send",
        json!({ "phone": "+8613800138000", "ip": "203.0.113.5" }),
    )
    .await
    .unwrap();
    assert_eq!(sent.status(), 200);
    let delivered = provider.received_requests().await.unwrap();
    let body: serde_json::Value = serde_json::from_slice(&delivered[0].body).unwrap();
    let text = body["body"].as_str().unwrap().to_string();
    let code: String = text
        .split(|c: char| !c.is_ascii_digit())
        .find(|run| run.len() == 6)
        .unwrap()
        .to_string();
    let again = post("/sms/send", json!({ "phone": "+8613800138000" }))
        .await
        .unwrap();
    assert_eq!(again.status(), 429);
    let failed = post("/sms/send", json!({ "phone": "+8613900139000" }))
        .await
        .unwrap();
    assert_eq!(failed.status(), 502);
    for guess in ["000000", code.as_str(), code.as_str()] {
        post(
            "/sms/verify",
            json!({ "phone": "+8613800138000", "code": guess }),
        )
        .await
        .unwrap();
    }
    for _ in 0..4 {
        post(
            "/login/attempt",
            json!({ "user": "alice", "success": false, "ip": "203.0.113.5" }),
        )
        .await
        .unwrap();
    }
    post("/sms/send", json!({ "phone": "not a phone" }))
        .await
        .unwrap();
    let wrong_key = client
        .post(format!("{}/sms/send", server.address))
        .bearer_auth("wrong-key")
        .json(&json!({ "phone": "+8613800138000" }))
        .send()
        .await
        .unwrap();
    assert_eq!(wrong_key.status(), 401);
    for path in [
        "/admin/api/subjects/phone/%2B8613800138000",
        "/admin/api/subjects/phone/+8613800138000/unblock",
        "/admin/api/events?subject=%2B8613800138000",
        "/admin/api/events.csv",
        "/admin/subjects/phone/%2B8613800138000",
        "/admin",
    ] {
        admin(path).await.unwrap();
    }
    client
        .post(format!(
            "{}/admin/api/subjects/phone/%2B8613800138000/unblock",
            server.address
        ))
        .bearer_auth(ADMIN)
        .send()
        .await
        .unwrap();
    server.signal("-TERM");
    tokio::time::sleep(Duration::from_millis(500)).await;

    let lines = server.log.lock().clone();
    assert!(
        lines.iter().any(|l| l.contains("sms delivery failed")),
        "the failed delivery is logged (and checked below): {lines:#?}"
    );
    for secret in ["13800138000", "13900139000", code.as_str(), API_KEY, ADMIN] {
        let leaks: Vec<&String> = lines.iter().filter(|l| l.contains(secret)).collect();
        assert!(leaks.is_empty(), "{secret:?} in the log: {leaks:#?}");
    }
}

/// `rediss://` is encrypted: against a real `redis-server` with `--tls-port`
/// and a certificate made here, the service answers ready and sends and
/// checks a code when the certificate is trusted (`SSL_CERT_FILE`), and is
/// not ready when it is not (no plain-text fallback).
#[tokio::test]
async fn rediss_talks_tls_to_a_real_redis() {
    let dir = tempfile::tempdir().unwrap();
    // A CA of the test's own, and a server certificate it signs for 127.0.0.1.
    let path = |name: &str| dir.path().join(name).to_str().unwrap().to_string();
    let (ca, cert, key) = (path("ca.pem"), path("cert.pem"), path("key.pem"));
    std::fs::write(
        path("ext.cnf"),
        "subjectAltName=IP:127.0.0.1\nbasicConstraints=CA:FALSE\n",
    )
    .unwrap();
    for args in [
        vec![
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "1",
            "-subj",
            "/CN=tollgate test CA",
        ]
        .into_iter()
        .map(String::from)
        .chain(["-keyout".into(), path("ca.key"), "-out".into(), ca.clone()])
        .collect::<Vec<_>>(),
        [
            "req",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-subj",
            "/CN=localhost",
        ]
        .into_iter()
        .map(String::from)
        .chain([
            "-keyout".into(),
            key.clone(),
            "-out".into(),
            path("req.csr"),
        ])
        .collect(),
        ["x509", "-req", "-days", "1", "-CAcreateserial"]
            .into_iter()
            .map(String::from)
            .chain([
                "-in".into(),
                path("req.csr"),
                "-CA".into(),
                ca.clone(),
                "-CAkey".into(),
                path("ca.key"),
                "-extfile".into(),
                path("ext.cnf"),
                "-out".into(),
                cert.clone(),
            ])
            .collect(),
    ] {
        let made = std::process::Command::new("openssl")
            .args(&args)
            .output()
            .expect("openssl runs");
        assert!(
            made.status.success(),
            "{args:?}: {}",
            String::from_utf8_lossy(&made.stderr)
        );
    }
    let port = crate::support::app::free_port();
    let mut redis = tokio::process::Command::new("redis-server")
        .args([
            "--port",
            "0",
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
        ])
        .args(["--tls-port", &port.to_string(), "--tls-auth-clients", "no"])
        .arg("--tls-cert-file")
        .arg(&cert)
        .arg("--tls-key-file")
        .arg(&key)
        .arg("--dir")
        .arg(dir.path())
        .stdout(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("redis-server starts");
    for _ in 0..100 {
        if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    let config = config_file(
        dir.path(),
        "",
        &format!(
            r#"
[store]
backend = "redis"
redis_url = "rediss://127.0.0.1:{port}"
timeout = "2s"
[sms]
code_secret = "tls-test-code-secret-1234"
"#
        ),
    );
    let client = reqwest::Client::new();
    let trusted = Tollgate::start_with_env(&config, &[("SSL_CERT_FILE", ca.as_str())]).await;
    let mut ready = 0;
    for _ in 0..50 {
        ready = client
            .get(format!("{}/readyz", trusted.address))
            .send()
            .await
            .unwrap()
            .status()
            .as_u16();
        if ready == 200 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(ready, 200, "ready over TLS: {:?}", trusted.log.lock());
    let sent = client
        .post(format!("{}/sms/send", trusted.address))
        .json(&json!({ "phone": "+8613800138000" }))
        .send()
        .await
        .unwrap();
    assert_eq!(sent.status(), 200);
    let checked = client
        .post(format!("{}/sms/verify", trusted.address))
        .json(&json!({ "phone": "+8613800138000", "code": "000000" }))
        .send()
        .await
        .unwrap();
    let body: serde_json::Value = checked.json().await.unwrap();
    assert_eq!(
        body["valid"], false,
        "the code lives in the TLS Redis: {body}"
    );
    assert_eq!(body["attempts_left"], 4, "{body}");

    // Trusting only another CA (a second one made here): no connection, so
    // not ready.
    let other = path("other-ca.pem");
    let made = std::process::Command::new("openssl")
        .args([
            "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
        ])
        .args([
            "-subj",
            "/CN=another CA",
            "-keyout",
            &path("other.key"),
            "-out",
            &other,
        ])
        .output()
        .expect("openssl runs");
    assert!(made.status.success());
    let untrusted = Tollgate::start_with_env(&config, &[("SSL_CERT_FILE", other.as_str())]).await;
    // The connection's error is logged by fred's own task, a moment after
    // start-up; it is logged again on every retry.
    eventually(
        "the refused certificate in the log",
        Duration::from_secs(10),
        || async {
            untrusted
                .log
                .lock()
                .iter()
                .any(|l| l.contains("Redis connection error") && l.contains("Certificate"))
        },
    )
    .await;
    let status = client
        .get(format!("{}/readyz", untrusted.address))
        .send()
        .await
        .unwrap()
        .status();
    assert_eq!(status, 503);
    let _ = redis.kill().await;
}

/// Without API keys start-up warns that a loopback backend's logins all
/// count under its own address (docs/security.md); with a key it does not.
#[tokio::test]
async fn start_up_warns_that_keyless_logins_count_under_one_address() {
    let (keyless_dir, keyed_dir) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let keyless = Tollgate::start(&config_file(keyless_dir.path(), "", "")).await;
    let key = "api_keys = [\"backend-key-0123456789\"]";
    let keyed = Tollgate::start(&config_file(keyed_dir.path(), key, "")).await;
    let warned = |server: &Tollgate| server.lines("server.api_keys is empty").len();
    assert_eq!((warned(&keyless), warned(&keyed)), (1, 0));
}

/// Beside a Redis store, the `log` SMS provider (every code in the log) is
/// a production set-up left half done: start-up says so.
#[tokio::test]
async fn start_up_warns_of_codes_in_the_log_beside_a_redis_store() {
    let dead_port = crate::support::app::free_port();
    let store = format!(
        "[store]\nbackend = \"redis\"\nredis_url = \"redis://127.0.0.1:{dead_port}\"\n\
         [sms]\ncode_secret = \"process-test-code-secret\"\n"
    );
    let webhook =
        format!("{store}[sms.provider]\nkind = \"webhook\"\nurl = \"http://127.0.0.1:9/\"\n");
    let dirs = [(); 3].map(|_| tempfile::tempdir().unwrap());
    let logged = Tollgate::start(&config_file(dirs[0].path(), "", &store)).await;
    let delivered = Tollgate::start(&config_file(dirs[1].path(), "", &webhook)).await;
    let laptop = Tollgate::start(&config_file(dirs[2].path(), "", "")).await;
    let warned = |server: &Tollgate| server.lines("every code is written to the log").len();
    assert_eq!(
        (warned(&logged), warned(&delivered), warned(&laptop)),
        (1, 0, 0)
    );
}

/// Browsers calling `/sms/*` with `captcha.kind = "none"` can never pass a
/// captcha tier: start-up says so; with a provider, or browsers kept out
/// (keys, no `keyless_sms`), it does not.
#[tokio::test]
async fn start_up_warns_of_captchas_no_browser_can_pass() {
    let key = "api_keys = [\"backend-key-0123456789\"]";
    let keyless = format!("{key}\nkeyless_sms = true");
    let turnstile = "[captcha]\nkind = \"turnstile\"\nsecret = \"turnstile-secret-0123\"\n";
    let dirs = [(); 3].map(|_| tempfile::tempdir().unwrap());
    let open = Tollgate::start(&config_file(dirs[0].path(), &keyless, "")).await;
    let guarded = Tollgate::start(&config_file(dirs[1].path(), &keyless, turnstile)).await;
    let keyed = Tollgate::start(&config_file(dirs[2].path(), key, "")).await;
    let warned = |server: &Tollgate| server.lines("no browser can pass a captcha").len();
    assert_eq!((warned(&open), warned(&guarded), warned(&keyed)), (1, 0, 0));
}

/// `/metrics` and the console answer on `server.bind` without
/// `server.admin_bind`: start-up says so when that is not loopback.
#[tokio::test]
async fn start_up_warns_of_admin_routes_on_a_public_bind() {
    let (public_dir, split_dir, local_dir) = (
        tempfile::tempdir().unwrap(),
        tempfile::tempdir().unwrap(),
        tempfile::tempdir().unwrap(),
    );
    let public_bind = [("TOLLGATE__SERVER__BIND", "0.0.0.0:0")];
    let public =
        Tollgate::start_with_env(&config_file(public_dir.path(), "", ""), &public_bind).await;
    let split_config = config_file(split_dir.path(), "admin_bind = \"127.0.0.1:0\"", "");
    let split = Tollgate::start_with_env(&split_config, &public_bind).await;
    let local = Tollgate::start(&config_file(local_dir.path(), "", "")).await;
    let warned = |server: &Tollgate| server.lines("server.admin_bind is unset").len();
    assert_eq!((warned(&public), warned(&split), warned(&local)), (1, 0, 0));
}

/// `captcha.hostnames` and the action lists read a provider's answers:
/// start-up says so when there is no provider to answer, and when one
/// route's own action list leaves the other route taking its tokens.
#[tokio::test]
async fn start_up_warns_of_answer_checks_without_a_provider() {
    let lists = "[captcha]\nhostnames = [\"www.example.com\"]\n";
    let route_list = "[captcha]\nsms_actions = [\"sms\"]\n";
    let strict =
        "[captcha]\nkind = \"recaptcha\"\nsecret = \"recaptcha-secret-0123\"\nmin_score = 0.95\n";
    let provider = "[captcha]\nkind = \"turnstile\"\nsecret = \"turnstile-secret-0123\"\nhostnames = [\"www.example.com\"]\nsms_actions = [\"sms\"]\nlogin_actions = [\"login\"]\n";
    let half_split = "[captcha]\nkind = \"turnstile\"\nsecret = \"turnstile-secret-0123\"\nlogin_actions = [\"login\"]\n";
    let dirs = [(); 5].map(|_| tempfile::tempdir().unwrap());
    let unread = Tollgate::start(&config_file(dirs[0].path(), "", lists)).await;
    let read = Tollgate::start(&config_file(dirs[1].path(), "", provider)).await;
    let refuses_all = Tollgate::start(&config_file(dirs[2].path(), "", strict)).await;
    let unread_route = Tollgate::start(&config_file(dirs[3].path(), "", route_list)).await;
    let half = Tollgate::start(&config_file(dirs[4].path(), "", half_split)).await;
    let warned = |server: &Tollgate| server.lines("nothing is checked against them").len();
    assert_eq!(
        (warned(&unread), warned(&unread_route), warned(&read)),
        (1, 1, 0)
    );
    let too_high = |server: &Tollgate| server.lines("captcha.min_score is above 0.9").len();
    assert_eq!((too_high(&refuses_all), too_high(&read)), (1, 0));
    let open = |server: &Tollgate| {
        server
            .lines("captcha.login_actions is set and captcha.sms_actions is not")
            .len()
    };
    assert_eq!((open(&half), open(&read)), (1, 0));
}

/// A reload can bring in what start-up would have warned of: it warns too.
#[tokio::test]
async fn a_reload_warns_of_what_start_up_would() {
    let dir = tempfile::tempdir().unwrap();
    let provider = "[captcha]\nkind = \"turnstile\"\nsecret = \"turnstile-secret-0123\"\nactions = [\"login\"]\n";
    let server = Tollgate::start(&config_file(dir.path(), "", provider)).await;
    let warning = "nothing is checked against them";
    assert!(server.lines(warning).is_empty());

    config_file(dir.path(), "", "[captcha]\nactions = [\"login\"]\n");
    server.signal("-HUP");
    assert!(
        !server.logged(warning).await.is_empty(),
        "no warning after the reload"
    );
}

/// A SIGTERM during start-up (here its wait for the audit database's
/// migrations, with a PostgreSQL that refuses every connection) is a stop
/// like any: the service stops as soon as it runs and exits 0, where the
/// signal's default action ended it with 143 before the handler was
/// installed.
#[tokio::test]
async fn a_sigterm_during_start_up_stops_it_with_0() {
    use tokio::io::{AsyncBufReadExt, BufReader};
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("tollgate.toml");
    std::fs::write(
        &config,
        "[server]\nbind = \"127.0.0.1:0\"\n\
         [audit]\ndatabase_url = \"postgres://postgres@127.0.0.1:1/nowhere\"\n",
    )
    .unwrap();
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_tollgate"))
        .current_dir(dir.path())
        .arg("--config")
        .arg(&config)
        .env("RUST_LOG", "info")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    let started = tokio::time::timeout(Duration::from_secs(30), async {
        while let Ok(Some(line)) = lines.next_line().await {
            if line.contains("SIGTERM and SIGINT stop the service") {
                return;
            }
        }
        panic!("tollgate exited before starting");
    });
    started.await.expect("a start-up line within 30 s");
    let pid = child.id().expect("running").to_string();
    let killed = std::process::Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .unwrap();
    assert!(killed.success());
    let rest = tokio::time::timeout(Duration::from_secs(30), async {
        let mut rest = Vec::new();
        while let Ok(Some(line)) = lines.next_line().await {
            rest.push(line);
        }
        rest
    })
    .await
    .expect("it stops within 30 s");
    let status = child.wait().await.unwrap();
    assert!(status.success(), "{status:?}: {rest:?}");
    // The signal came while start-up still waited for the database.
    let waited = rest.iter().position(|l| l.contains("events spool until"));
    let listened = rest.iter().position(|l| l.contains("tollgate listening"));
    assert!(
        matches!((waited, listened), (Some(w), Some(l)) if w < l),
        "{rest:?}"
    );
}
