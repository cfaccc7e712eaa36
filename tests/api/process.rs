//! The real `tollgate` binary as a child process, for what only a process can
//! show: signals, a crash, a restart.

use std::process::Stdio;
use std::time::Duration;

use serde_json::json;
use tokio::io::{AsyncBufReadExt, BufReader};

/// The real binary, as a child process.
pub struct Tollgate {
    pub child: tokio::process::Child,
    pub address: String,
    /// Every line it has logged so far (JSON, stderr).
    pub log: std::sync::Arc<parking_lot::Mutex<Vec<String>>>,
}

impl Tollgate {
    pub async fn start(config: &std::path::Path) -> Self {
        // Run from the config's directory, not the repository: scripts,
        // templates and migrations must come from the binary itself.
        let workdir = config.parent().unwrap_or(std::path::Path::new("/"));
        let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_tollgate"))
            .current_dir(workdir)
            .arg("--config")
            .arg(config)
            .env("RUST_LOG", "info")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("the tollgate binary starts");
        let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
        let address = tokio::time::timeout(Duration::from_secs(30), async {
            while let Ok(Some(line)) = lines.next_line().await {
                if line.contains("tollgate listening") {
                    let log: serde_json::Value =
                        serde_json::from_str(&line).expect("JSON logs off a terminal");
                    return log["address"].as_str().unwrap().to_string();
                }
            }
            panic!("tollgate exited before listening");
        })
        .await
        .expect("tollgate listens within 30 s");
        // Keep draining the log so the child never blocks on a full pipe.
        let log = std::sync::Arc::new(parking_lot::Mutex::new(Vec::new()));
        let kept = log.clone();
        tokio::spawn(async move {
            while let Ok(Some(line)) = lines.next_line().await {
                kept.lock().push(line);
            }
        });
        Self {
            child,
            address: format!("http://{address}"),
            log,
        }
    }

    pub async fn refused_send(&self, client: &reqwest::Client, request_id: &str) {
        let response = client
            .post(format!("{}/sms/send", self.address))
            .header("x-request-id", request_id)
            .json(&json!({ "phone": "+8613800138000" }))
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 429);
    }

    pub fn signal(&self, signal: &str) {
        let pid = self.child.id().expect("still running").to_string();
        let status = std::process::Command::new("kill")
            .args([signal, &pid])
            .status()
            .unwrap();
        assert!(status.success());
    }
}

/// A store failure on the request path is logged with the request's id (at
/// the default level, where requests get no span).
#[tokio::test]
async fn a_store_failure_is_logged_with_the_request_id() {
    let dead_port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port");
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("tollgate.toml");
    std::fs::write(
        &config,
        format!(
            r#"
[server]
bind = "127.0.0.1:0"
[store]
backend = "redis"
redis_url = "redis://127.0.0.1:{dead_port}"
[sms]
code_secret = "process-test-code-secret"
[audit]
database_url = "sqlite://{}/audit.db?mode=rwc"
spool_dir = "{}/spool"
"#,
            dir.path().display(),
            dir.path().display()
        ),
    )
    .unwrap();
    let server = Tollgate::start(&config).await;
    let response = reqwest::Client::new()
        .post(format!("{}/login/check", server.address))
        .header("x-request-id", "req-store-down-1")
        .json(&json!({ "user": "alice" }))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 503);
    let logged = || {
        server
            .log
            .lock()
            .iter()
            .filter(|l| l.contains("store unavailable"))
            .cloned()
            .collect::<Vec<_>>()
    };
    for _ in 0..50 {
        if !logged().is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let lines = logged();
    assert_eq!(lines.len(), 1, "{:?}", server.log.lock());
    let line: serde_json::Value = serde_json::from_str(&lines[0]).unwrap();
    assert_eq!(line["request_id"], "req-store-down-1", "{line}");
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
    let config = dir.path().join("tollgate.toml");
    std::fs::write(
        &config,
        format!(
            r#"
[server]
bind = "127.0.0.1:0"
api_keys = ["{API_KEY}"]
admin_tokens = ["{ADMIN}"]
[audit]
database_url = "sqlite://{dir}/audit.db?mode=rwc"
spool_dir = "{dir}/spool"
[sms]
phone_limits = [{{ limit = 1, window = "1h" }}]
[sms.provider]
kind = "webhook"
url = "{url}/sms"
"#,
            dir = dir.path().display(),
            url = provider.uri(),
        ),
    )
    .unwrap();
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
