//! Health and readiness, and a store that is down or slow: fail closed,
//! fail open, fall back; metrics of decisions and store calls.

use std::sync::atomic::{AtomicBool, AtomicU16, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use std::time::{Duration, Instant};

use serde_json::json;
use tollgate::domain::Algorithm;
use tollgate::settings::{LimitSetting, OnStoreError, Secret, SecretUrl, SmsProviderKind};

use crate::support::app::{limits, spawn_app, spawn_app_with_sms_provider, Backend, TestApp};
use crate::support::whole_request;

const PHONE: &str = "+8613800138000";

#[tokio::test]
async fn health_and_readiness_answer_on_both_backends() {
    for backend in [Backend::Memory, Backend::Redis] {
        let app = spawn_app(backend, |_| {}).await;
        assert_eq!(app.get("/healthz").await.status, 200, "{backend:?}");
        let ready = app.get("/readyz").await;
        assert_eq!(ready.status, 200, "{backend:?}: {}", ready.body);
    }
}

fn unreachable_redis(on_error: OnStoreError) -> impl FnOnce(&mut tollgate::settings::Settings) {
    move |s| {
        s.store.redis_url = SecretUrl::new("redis://127.0.0.1:1");
        s.store.on_error = on_error;
        s.store.timeout = std::time::Duration::from_millis(200);
    }
}

#[tokio::test]
async fn an_unreachable_store_fails_closed_by_default() {
    let app = spawn_app(Backend::Redis, unreachable_redis(OnStoreError::Deny)).await;
    assert_eq!(app.get("/healthz").await.status, 200, "the process is up");
    let ready = app.get("/readyz").await;
    assert_eq!(
        (ready.status.as_u16(), ready.error()),
        (503, "not_ready"),
        "the public /readyz says not ready, not why"
    );
    let send = app.sms_send(json!({ "phone": PHONE })).await;
    assert_eq!(
        (send.status.as_u16(), send.error()),
        (503, "store_unavailable")
    );
    let login = app
        .login_attempt(json!({ "user": "a", "success": false, "ip": "203.0.113.1" }))
        .await;
    assert_eq!(
        (login.status.as_u16(), login.error()),
        (503, "store_unavailable")
    );
    assert!(app.sms.messages().is_empty());
}

#[tokio::test]
async fn an_unreachable_store_fails_open_for_counters_when_told_to() {
    let app = spawn_app(Backend::Redis, |s| {
        unreachable_redis(OnStoreError::Allow)(s);
        s.sms.phone_limits = limits(&[(1, 3_600_000)]);
    })
    .await;
    let login = app
        .login_attempt(json!({ "user": "a", "success": false, "ip": "203.0.113.1" }))
        .await;
    assert_eq!(login.status, 200);
    assert_eq!(login.body["decision"], "allow");
    // Codes keep flowing: they are kept in the process meanwhile.
    let send = app.sms_send(json!({ "phone": PHONE })).await;
    assert_eq!(send.status, 200, "{}", send.body);
    let code = app.sms.last_code(PHONE);
    let wrong = app
        .sms_verify(json!({ "phone": PHONE, "code": "000000" }))
        .await;
    assert_eq!(wrong.body, json!({ "valid": false, "attempts_left": 4 }));
    let right = app
        .sms_verify(json!({ "phone": PHONE, "code": code }))
        .await;
    assert_eq!(right.body, json!({ "valid": true }));
    // Counters stay open: the phone's 1/1h window does not refuse a resend.
    let resend = app.sms_send(json!({ "phone": PHONE })).await;
    assert_eq!(resend.status, 200, "{}", resend.body);
}

#[tokio::test]
async fn an_unreachable_store_falls_back_to_the_local_one() {
    let app = spawn_app(Backend::Redis, |s| {
        unreachable_redis(OnStoreError::Local)(s);
        s.sms.phone_limits = limits(&[(1, 3_600_000)]);
        s.sms.code_secret = Secret::new("a-configured-secret");
    })
    .await;
    assert_eq!(app.sms_send(json!({ "phone": PHONE })).await.status, 200);
    assert_eq!(
        app.sms_send(json!({ "phone": PHONE })).await.status,
        429,
        "the local store counts"
    );
    let code = app.sms.last_code(PHONE);
    assert_eq!(
        app.sms_verify(json!({ "phone": PHONE, "code": code }))
            .await
            .body,
        json!({ "valid": true })
    );
}

#[tokio::test]
async fn metrics_count_decisions_and_store_calls_in_prometheus_text() {
    let app = spawn_app(Backend::Memory, |s| {
        s.sms.phone_limits = limits(&[(1, 3_600_000)])
    })
    .await;
    app.sms_send(json!({ "phone": PHONE })).await;
    app.sms_send(json!({ "phone": PHONE })).await;
    app.login_check(json!({ "user": "metrics-user" })).await;

    let metrics = app.get("/metrics").await;
    assert_eq!(metrics.status, 200);
    let text = metrics
        .body
        .as_str()
        .expect("Prometheus text, not JSON")
        .to_string();
    // The recorder is process-wide: other tests add to the same counters.
    let value = |series: &str| -> f64 {
        text.lines()
            .find(|l| l.starts_with(series))
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("{series} missing from\n{text}"))
    };
    assert!(value("tollgate_requests_total{route=\"sms_send\",decision=\"allow\"}") >= 1.0);
    assert!(value("tollgate_requests_total{route=\"sms_send\",decision=\"deny\"}") >= 1.0);
    assert!(value("tollgate_requests_total{route=\"login_check\",decision=\"allow\"}") >= 1.0);
    assert!(value("tollgate_store_seconds_count") >= 3.0);
    assert!(text.contains("# HELP tollgate_requests_total"));
}

/// A Redis of the test's own, so that it can be frozen without freezing the
/// other tests' shared one.
struct PrivateRedis {
    port: u16,
    child: std::process::Child,
    /// Its working directory: a replica's sync writes a `dump.rdb` there.
    _dir: tempfile::TempDir,
}

impl PrivateRedis {
    async fn start() -> Self {
        let port = crate::support::app::free_port();
        let dir = tempfile::tempdir().expect("a temporary directory");
        let child = std::process::Command::new("redis-server")
            .args([
                "--port",
                &port.to_string(),
                "--dir",
                &dir.path().to_string_lossy(),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
            ])
            .stdout(std::process::Stdio::null())
            .spawn()
            .expect("redis-server is installed (scripts/services.sh)");
        for _ in 0..100 {
            if tokio::net::TcpStream::connect(("127.0.0.1", port))
                .await
                .is_ok()
            {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
        Self {
            port,
            child,
            _dir: dir,
        }
    }

    fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// Freeze the server (SIGSTOP): connections stay open, nothing answers.
    fn freeze(&self) {
        self.signal("-STOP");
    }

    fn thaw(&self) {
        self.signal("-CONT");
    }

    /// Refuse every write (`maxmemory` 1 under `noeviction`): an outage
    /// whose calls fail at once, and never land later as a frozen server's
    /// would; or take writes again.
    fn refuse_writes(&self, refuse: bool) {
        self.config_set("maxmemory-policy", "noeviction");
        self.config_set("maxmemory", if refuse { "1" } else { "0" });
    }

    /// Make this server a replica of the one at `port` (`REPLICAOF`): its
    /// clients stay connected, and every write they send is refused
    /// `READONLY`.
    fn replica_of(&self, port: u16) {
        let status = std::process::Command::new("redis-cli")
            .args(["-p", &self.port.to_string(), "replicaof", "127.0.0.1"])
            .arg(port.to_string())
            .stdout(std::process::Stdio::null())
            .status()
            .expect("redis-cli runs");
        assert!(status.success());
    }

    /// `CONFIG SET` on this server, by `redis-cli`.
    fn config_set(&self, name: &str, value: &str) {
        let status = std::process::Command::new("redis-cli")
            .args(["-p", &self.port.to_string(), "config", "set", name, value])
            .stdout(std::process::Stdio::null())
            .status()
            .expect("redis-cli runs");
        assert!(status.success());
    }

    /// Change the default user's ACL (`ACL SETUSER default …`), as a
    /// managed Redis's operator may while clients are connected.
    fn acl_default(&self, rules: &[&str]) {
        let status = std::process::Command::new("redis-cli")
            .args(["-p", &self.port.to_string(), "acl", "setuser", "default"])
            .args(rules)
            .stdout(std::process::Stdio::null())
            .status()
            .expect("redis-cli runs");
        assert!(status.success());
    }

    /// How many times this server has run `command` (`INFO commandstats`).
    fn calls(&self, command: &str) -> u64 {
        let out = std::process::Command::new("redis-cli")
            .args(["-p", &self.port.to_string(), "info", "commandstats"])
            .output()
            .expect("redis-cli runs");
        let text = String::from_utf8_lossy(&out.stdout);
        let field = format!("cmdstat_{command}:calls=");
        text.lines()
            .find_map(|line| line.strip_prefix(field.as_str()))
            .and_then(|rest| rest.split(',').next())
            .map_or(0, |n| n.parse().expect("a count"))
    }

    fn signal(&self, signal: &str) {
        let status = std::process::Command::new("kill")
            .args([signal, &self.child.id().to_string()])
            .status()
            .expect("kill runs");
        assert!(status.success());
    }
}

impl Drop for PrivateRedis {
    fn drop(&mut self) {
        self.thaw();
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A Redis over `maxmemory` under `noeviction` still answers PING, but
/// refuses every write a request makes: not ready, until it takes writes
/// again.
#[tokio::test]
async fn a_redis_that_refuses_writes_is_not_ready() {
    let redis = PrivateRedis::start().await;
    let url = redis.url();
    let app = spawn_app(Backend::Redis, move |s| {
        s.store.redis_url = SecretUrl::new(url);
        s.sms.code_secret = Secret::new("a-configured-secret");
    })
    .await;
    assert_eq!(app.get("/readyz").await.status, 200);

    redis.config_set("maxmemory-policy", "noeviction");
    redis.config_set("maxmemory", "1");
    let refused = app
        .login_attempt(json!({ "user": "a", "success": false }))
        .await;
    assert_eq!(refused.status, 503, "{}", refused.body);
    // The probe's last write stands for a second (`StoreProbe`).
    let full = not_ready_again(&app).await;
    assert_eq!(
        (full.status.as_u16(), full.error()),
        (503, "not_ready"),
        "{}",
        full.body
    );

    redis.config_set("maxmemory", "0");
    assert!(ready_again(&app).await, "Redis takes writes again");
}

/// The public `/readyz` needs no key: a flood of probes makes Redis take one
/// write a second, not one a probe, and every probe is answered.
#[tokio::test]
async fn a_flood_of_probes_writes_to_redis_once_a_second() {
    let redis = PrivateRedis::start().await;
    let app = stalling_app(&redis, |_| {}).await;
    let before = redis.calls("set");
    let started = Instant::now();
    for _ in 0..5 {
        let probes = (0..40).map(|_| app.get("/readyz"));
        for probe in futures::future::join_all(probes).await {
            assert_eq!(probe.status, 200, "{}", probe.body);
        }
    }
    let seconds = started.elapsed().as_secs();
    let writes = redis.calls("set") - before;
    assert!(
        writes >= 1 && writes <= 1 + seconds,
        "200 probes in {seconds} s made {writes} writes"
    );
}

/// A probe whose client resets its connection while the write waits on a
/// stalled Redis is dropped; the write goes on for the probes after it, so
/// five such probes cost Redis one write, not five.
#[tokio::test]
async fn probes_reset_mid_write_share_one_write() {
    let redis = PrivateRedis::start().await;
    // The write outlasts the five probes.
    let app = stalling_app(&redis, |s| s.store.timeout = Duration::from_millis(1500)).await;
    // Connected before the stall: a frozen Redis takes no new connection.
    assert_eq!(app.get("/healthz").await.status, 200);
    let before = redis.calls("set");
    redis.freeze();
    for _ in 0..5 {
        app.ask_and_reset(
            b"GET /readyz HTTP/1.1\r\nHost: tollgate\r\n\r\n",
            Duration::from_millis(100),
        )
        .await;
    }
    redis.thaw();
    // The writes the stalled server holds in its sockets run once it wakes.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let writes = redis.calls("set") - before;
    assert_eq!(writes, 1, "five reset probes made {writes} writes");
}

/// `/readyz`'s answer once it says not ready, within five seconds.
async fn not_ready_again(app: &crate::support::app::TestApp) -> crate::support::app::Answer {
    for _ in 0..100 {
        let ready = app.get("/readyz").await;
        if ready.status != 200 {
            return ready;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("/readyz still says ready after five seconds");
}

#[tokio::test]
async fn a_slow_redis_is_cut_off_at_the_store_timeout() {
    let redis = PrivateRedis::start().await;
    let url = redis.url();
    let app = spawn_app(Backend::Redis, move |s| {
        s.store.redis_url = SecretUrl::new(url);
        s.store.timeout = Duration::from_millis(200);
        s.sms.code_secret = Secret::new("a-configured-secret");
    })
    .await;
    assert_eq!(app.login_check(json!({ "user": "a" })).await.status, 200);
    let errors_before = app
        .metric("tollgate_store_errors_total{kind=\"timeout\"}")
        .await;

    redis.freeze();
    let started = Instant::now();
    let answer = app
        .login_attempt(json!({ "user": "a", "success": false }))
        .await;
    let took = started.elapsed();
    assert_eq!(
        (answer.status.as_u16(), answer.error()),
        (503, "store_unavailable")
    );
    assert!(
        took < Duration::from_millis(1_500),
        "answered after {took:?}, not after the stall"
    );
    assert!(
        app.metric("tollgate_store_errors_total{kind=\"timeout\"}")
            .await
            > errors_before,
        "the timeout is counted"
    );
}

#[tokio::test]
async fn a_slow_redis_falls_back_to_the_local_store_when_told_to() {
    let redis = PrivateRedis::start().await;
    let url = redis.url();
    let app = spawn_app(Backend::Redis, move |s| {
        s.store.redis_url = SecretUrl::new(url);
        s.store.timeout = Duration::from_millis(200);
        s.store.on_error = OnStoreError::Local;
        s.login.captcha_after = 1000;
        s.login.lock_after = 2;
    })
    .await;
    assert_eq!(app.login_check(json!({ "user": "a" })).await.status, 200);

    redis.freeze();
    let started = Instant::now();
    let first = app
        .login_attempt(json!({ "user": "a", "success": false }))
        .await;
    assert_eq!(first.status, 200, "{}", first.body);
    let second = app
        .login_attempt(json!({ "user": "a", "success": false }))
        .await;
    assert_eq!(
        second.body["locked"], true,
        "the local store counts while Redis is frozen: {}",
        second.body
    );
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "each call gave up at the timeout"
    );
    redis.thaw();
}

/// A login failure sent to a Redis that pauses past the store's timeout is
/// answered 503, and counts nothing when that Redis runs it later: not the
/// failure, nor the lock it would start without its `lock` row.
#[tokio::test]
async fn a_failure_redis_runs_after_its_timeout_counts_nothing() {
    let redis = PrivateRedis::start().await;
    let app = stalling_app(&redis, |s| {
        s.login.captcha_after = 1000;
        s.login.lock_after = 1;
    })
    .await;
    // Another user's success loads the script: a call Redis answers
    // NOSCRIPT after the stall would count nothing anyway.
    let loaded = app
        .login_attempt(json!({ "user": "b", "success": true }))
        .await;
    assert_eq!(loaded.status, 200, "{}", loaded.body);

    refused_over_a_stall(
        &redis,
        &app,
        app.login_attempt(json!({ "user": "a", "success": false })),
    )
    .await;

    let check = app.login_check(json!({ "user": "a" })).await;
    assert_eq!(
        (
            check.body["decision"].as_str(),
            check.body["failures"].as_u64()
        ),
        (Some("allow"), Some(0)),
        "the failure Redis ran late counted nothing: {}",
        check.body
    );
    let counted = app
        .login_attempt(json!({ "user": "a", "success": false }))
        .await;
    assert_eq!(
        counted.body["locked"], true,
        "a failure in time still counts: {}",
        counted.body
    );
}

/// A send sent to a Redis that pauses past the store's timeout is answered
/// 503, and takes no place in the phone's window when that Redis runs it
/// later: no SMS went out.
#[tokio::test]
async fn a_send_redis_runs_after_its_timeout_counts_nothing() {
    let redis = PrivateRedis::start().await;
    let app = stalling_app(&redis, |s| {
        s.sms.phone_limits = vec![LimitSetting::new(1, Duration::from_secs(60))];
    })
    .await;
    // A send to another phone loads the script: a call Redis answers
    // NOSCRIPT after the stall would count nothing anyway.
    let loaded = app.sms_send(json!({ "phone": "+8613800138001" })).await;
    assert_eq!(loaded.status, 200, "{}", loaded.body);

    refused_over_a_stall(&redis, &app, app.sms_send(json!({ "phone": PHONE }))).await;

    let sent = app.sms_send(json!({ "phone": PHONE })).await;
    assert_eq!(
        sent.status, 200,
        "the phone's 1/1m window is still empty: {}",
        sent.body
    );
    let full = app.sms_send(json!({ "phone": PHONE })).await;
    assert_eq!(
        (full.status.as_u16(), full.body["rule"].as_str()),
        (429, Some("phone 1/1m")),
        "{}",
        full.body
    );
}

/// A right code checked against a Redis that pauses past the store's
/// timeout is answered 503, and is not used up when that Redis runs the
/// check later: the user's retry of the same code is valid.
#[tokio::test]
async fn a_code_check_redis_runs_after_its_timeout_leaves_the_code() {
    let redis = PrivateRedis::start().await;
    let app = stalling_app(&redis, |s| {
        // No window of failed tries: the code's check is the call the
        // stall holds (a window's call, first, is covered as a send's is).
        s.sms.verify_ip_limits = Vec::new();
        s.sms.verify_network_limits = Vec::new();
    })
    .await;
    assert_eq!(
        app.sms_send(json!({ "phone": PHONE })).await.status,
        200,
        "a code sent"
    );
    let code = delivered_codes(&app).pop().expect("one code delivered");
    // A wrong code loads the check's script: a call Redis answers NOSCRIPT
    // after the stall would change nothing anyway.
    let wrong = app
        .sms_verify(json!({ "phone": PHONE, "code": "000000" }))
        .await;
    assert_eq!(wrong.body["valid"], false, "{}", wrong.body);

    refused_over_a_stall(
        &redis,
        &app,
        app.sms_verify(json!({ "phone": PHONE, "code": code })),
    )
    .await;

    let retried = app
        .sms_verify(json!({ "phone": PHONE, "code": code }))
        .await;
    assert_eq!(
        (retried.status.as_u16(), retried.body["valid"].as_bool()),
        (200, Some(true)),
        "the check Redis ran late did not use the code up: {}",
        retried.body
    );
}

/// A code stored apart from the windows (a test rig's send: an
/// allow-listed address to a phone listed by its own entry) while Redis
/// does not answer is kept locally; when Redis runs the stalled
/// write later, the write changes nothing: a second copy there would verify
/// a second time, once on an instance that never held it locally.
#[tokio::test]
async fn a_code_write_redis_runs_after_its_timeout_leaves_no_copy() {
    const LISTED: &str = "203.0.113.9";
    let redis = PrivateRedis::start().await;
    let app = stalling_app(&redis, |s| {
        s.store.on_error = OnStoreError::Local;
        s.lists.allow_ips = vec![format!("{LISTED}/32").parse().expect("a CIDR")];
        s.lists.allow_phones = vec!["+8613800138001".into(), PHONE.into()];
    })
    .await;
    let _sends = crate::support::ALLOW_LISTED_IP_SENDS.lock().await;
    let send = |phone: &'static str| app.sms_send(json!({ "phone": phone, "ip": LISTED }));
    // Another phone's code loads the script: a call Redis answers NOSCRIPT
    // after the stall would write nothing anyway.
    assert_eq!(send("+8613800138001").await.status, 200);
    let codes_in_redis = |phone: &str| {
        let pattern = format!("*{phone}*");
        let port = redis.port.to_string();
        let out = std::process::Command::new("redis-cli")
            .args(["-p", &port, "--scan", "--pattern", &pattern])
            .output()
            .expect("redis-cli runs");
        assert!(out.status.success(), "redis-cli scans");
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    };
    assert!(
        codes_in_redis("+8613800138001")
            .lines()
            .any(|key| key.ends_with(":otp")),
        "a write in time is found"
    );

    redis.freeze();
    let sent = send(PHONE).await;
    redis.thaw();
    assert_eq!(sent.status, 200, "kept locally: {}", sent.body);
    assert!(ready_again(&app).await, "Redis answers again");
    // Whatever the thawed server held in its sockets has run by now.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(codes_in_redis(PHONE), "", "the late write stored no code");

    let code = app.sms.last_code(PHONE);
    let verified = app
        .sms_verify(json!({ "phone": PHONE, "code": code }))
        .await;
    assert_eq!(verified.body["valid"], true, "{}", verified.body);
    let again = app
        .sms_verify(json!({ "phone": PHONE, "code": code }))
        .await;
    assert_eq!(again.body["valid"], false, "single use: {}", again.body);
}

/// An app on `redis` whose store calls give up after 200 ms, with
/// `configure` applied to its settings too.
async fn stalling_app(
    redis: &PrivateRedis,
    configure: impl FnOnce(&mut tollgate::settings::Settings),
) -> TestApp {
    let url = redis.url();
    spawn_app(Backend::Redis, move |s| {
        s.store.redis_url = SecretUrl::new(url);
        s.store.timeout = Duration::from_millis(200);
        s.sms.code_secret = Secret::new("a-configured-secret");
        configure(s);
    })
    .await
}

/// Send `request` to `app` while `redis` is frozen, past the store's
/// timeout: it is answered 503 `store_unavailable`; then thaw `redis`, which
/// runs what it was sent, and wait until it answers again.
async fn refused_over_a_stall(
    redis: &PrivateRedis,
    app: &TestApp,
    request: impl std::future::Future<Output = crate::support::app::Answer>,
) {
    redis.freeze();
    let refused = request.await;
    redis.thaw();
    assert_store_unavailable(&refused, "over a stall");
    assert!(ready_again(app).await, "Redis answers again");
}

/// Whether `/readyz` says ready within five seconds (a thawed Redis).
async fn ready_again(app: &crate::support::app::TestApp) -> bool {
    for _ in 0..100 {
        if app.get("/readyz").await.status == 200 {
            return true;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    false
}

/// An SMS webhook that answers 200 at once, or, while `hold` is set, says
/// a request arrived and answers it 500 once `release` is notified.
struct HeldWebhook {
    url: String,
    hold: Arc<AtomicBool>,
    arrived: tokio::sync::mpsc::Receiver<()>,
    release: Arc<tokio::sync::Notify>,
}

impl HeldWebhook {
    async fn start() -> Self {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/sms", listener.local_addr().unwrap());
        let hold = Arc::new(AtomicBool::new(false));
        let (tell, arrived) = tokio::sync::mpsc::channel(4);
        let release = Arc::new(tokio::sync::Notify::new());
        let (held, released) = (hold.clone(), release.clone());
        tokio::spawn(async move {
            while let Ok((mut socket, _)) = listener.accept().await {
                // The whole request (head and body) before an answer.
                let mut request = Vec::new();
                let mut chunk = [0u8; 4096];
                while !whole_request(&request) {
                    match socket.read(&mut chunk).await {
                        Ok(0) | Err(_) => break,
                        Ok(n) => request.extend_from_slice(&chunk[..n]),
                    }
                }
                let status = if held.load(Ordering::SeqCst) {
                    let _ = tell.send(()).await;
                    released.notified().await;
                    "500 Internal Server Error"
                } else {
                    "200 OK"
                };
                let answer =
                    format!("HTTP/1.1 {status}\r\ncontent-length: 0\r\nconnection: close\r\n\r\n");
                let _ = socket.write_all(answer.as_bytes()).await;
            }
        });
        Self {
            url,
            hold,
            arrived,
            release,
        }
    }
}

/// A send the local store took while Redis did not answer, whose delivery
/// fails once Redis answers again, is given back to the local store: Redis
/// never counted it, and giving it back there would free a slot on a meter
/// (and take a real send off the pumping guard's counts).
#[tokio::test]
async fn a_send_taken_locally_is_given_back_locally_when_its_delivery_fails() {
    const IP: &str = "203.0.113.9";
    let redis = PrivateRedis::start().await;
    let mut hook = HeldWebhook::start().await;
    let (redis_url, hook_url) = (redis.url(), hook.url.clone());
    let app = spawn_app_with_sms_provider(Backend::Redis, move |s| {
        s.store.redis_url = SecretUrl::new(redis_url);
        s.store.timeout = Duration::from_millis(200);
        s.store.on_error = OnStoreError::Local;
        s.sms.code_secret = Secret::new("a-configured-secret");
        s.sms.provider.kind = SmsProviderKind::Webhook;
        s.sms.provider.url = hook_url.into();
        s.sms.provider.timeout = Duration::from_secs(30);
        s.sms.ip_limits = vec![LimitSetting {
            algorithm: Algorithm::Gcra,
            ..LimitSetting::new(2, Duration::from_secs(3600))
        }];
    })
    .await;
    let send = |phone: &'static str| app.sms_send(json!({ "phone": phone, "ip": IP }));
    // The address's meter in Redis is full.
    assert_eq!(send("+8613800138001").await.status, 200);
    assert_eq!(send("+8613800138002").await.status, 200);
    let full = send("+8613800138003").await;
    assert_eq!(
        (full.status.as_u16(), full.body["rule"].as_str()),
        (429, Some("ip 2/1h"))
    );

    // Redis does not answer: the local store takes the send. Its delivery
    // fails after Redis answers again.
    hook.hold.store(true, Ordering::SeqCst);
    redis.freeze();
    let (failed, ready) = tokio::join!(send("+8613800138004"), async {
        hook.arrived
            .recv()
            .await
            .expect("the send reached the provider");
        redis.thaw();
        let ready = ready_again(&app).await;
        hook.release.notify_one();
        ready
    });
    assert!(ready, "Redis answers again");
    assert_eq!(
        (failed.status.as_u16(), failed.error()),
        (502, "delivery_failed"),
        "{}",
        failed.body
    );

    hook.hold.store(false, Ordering::SeqCst);
    let after = send("+8613800138005").await;
    assert_eq!(
        (after.status.as_u16(), after.body["rule"].as_str()),
        (429, Some("ip 2/1h")),
        "Redis's meter is as full as before: {}",
        after.body
    );

    // And the local store has it back: its meter takes two sends again.
    redis.freeze();
    assert_eq!(send("+8613800138006").await.status, 200);
    assert_eq!(send("+8613800138007").await.status, 200);
    let local_full = send("+8613800138008").await;
    redis.thaw();
    assert_eq!(
        (local_full.status.as_u16(), local_full.body["rule"].as_str()),
        (429, Some("ip 2/1h")),
        "{}",
        local_full.body
    );
}

/// A code sent while Redis does not answer is kept in the local store
/// (`on_error = "allow"` or `"local"`), and checked there even once Redis
/// answers again: Redis never saw it. Single use there too; and the next
/// send, to Redis, supersedes it.
#[tokio::test]
async fn a_code_sent_during_an_outage_is_verified_after_it() {
    for on_error in [OnStoreError::Allow, OnStoreError::Local] {
        let redis = PrivateRedis::start().await;
        let app = outage_app(&redis, on_error).await;
        assert_eq!(app.get("/readyz").await.status, 200, "{on_error:?}");
        // A code Redis holds from before the outage.
        const OTHER: &str = "+8613800138099";
        assert_eq!(app.sms_send(json!({ "phone": OTHER })).await.status, 200);
        let before = app.sms.last_code(OTHER);

        redis.freeze();
        let sent = app.sms_send(json!({ "phone": PHONE })).await;
        assert_eq!(sent.status, 200, "{on_error:?}: {}", sent.body);
        let during = app.sms.last_code(PHONE);
        // A try on the other phone meanwhile leaves a stand-in locally.
        let wrong = app
            .sms_verify(json!({ "phone": OTHER, "code": "000000" }))
            .await;
        assert_eq!(wrong.body["valid"], false, "{on_error:?}");
        redis.thaw();
        assert!(ready_again(&app).await, "{on_error:?}: Redis answers again");

        let verified = app
            .sms_verify(json!({ "phone": PHONE, "code": during }))
            .await;
        assert_eq!(
            verified.body["valid"], true,
            "{on_error:?}: {}",
            verified.body
        );
        let again = app
            .sms_verify(json!({ "phone": PHONE, "code": during }))
            .await;
        assert_eq!(again.body["valid"], false, "{on_error:?}: single use");
        // The stand-in hides nothing: the code Redis held still verifies.
        let held = app
            .sms_verify(json!({ "phone": OTHER, "code": before }))
            .await;
        assert_eq!(held.body["valid"], true, "{on_error:?}: {}", held.body);

        // A send with Redis up goes to Redis, and a code held locally
        // from the outage no longer answers for the phone.
        redis.freeze();
        assert_eq!(app.sms_send(json!({ "phone": PHONE })).await.status, 200);
        let stale = app.sms.last_code(PHONE);
        redis.thaw();
        assert!(ready_again(&app).await, "{on_error:?}: Redis answers again");
        let fresh_send = app.sms_send(json!({ "phone": PHONE })).await;
        assert_eq!(fresh_send.status, 200, "{on_error:?}: {}", fresh_send.body);
        let fresh = app.sms.last_code(PHONE);
        if fresh != stale {
            let old = app
                .sms_verify(json!({ "phone": PHONE, "code": stale }))
                .await;
            assert_eq!(old.body["valid"], false, "{on_error:?}: superseded");
        }
        let new = app
            .sms_verify(json!({ "phone": PHONE, "code": fresh }))
            .await;
        assert_eq!(new.body["valid"], true, "{on_error:?}: {}", new.body);
    }
}

/// An app on `redis` that keeps codes in the process while Redis fails
/// (`on_error`), with room for several sends to one phone.
async fn outage_app(redis: &PrivateRedis, on_error: OnStoreError) -> TestApp {
    stalling_app(redis, move |s| {
        s.store.on_error = on_error;
        s.sms.phone_limits = limits(&[(10, 3_600_000)]);
        s.sms.captcha_after = 100;
    })
    .await
}

/// The code of every SMS delivered, in the order delivered.
fn delivered_codes(app: &TestApp) -> Vec<String> {
    app.sms
        .messages()
        .iter()
        .map(|m| {
            m.body
                .split(|c: char| !c.is_ascii_digit())
                .find(|run| run.len() == 6)
                .expect("a code")
                .to_string()
        })
        .collect()
}

/// A code held locally from an outage stays the phone's code until a send
/// made after it is delivered: a resend that fails once Redis answers again
/// leaves the held code verifying, and does not bring back the code Redis
/// kept from before the outage (which that held code had replaced).
#[tokio::test]
async fn a_failed_resend_after_an_outage_leaves_the_code_sent_during_it() {
    for on_error in [OnStoreError::Allow, OnStoreError::Local] {
        let redis = PrivateRedis::start().await;
        let app = outage_app(&redis, on_error).await;
        assert_eq!(app.sms_send(json!({ "phone": PHONE })).await.status, 200);
        let before = app.sms.last_code(PHONE);
        // The send is taken locally, and Redis never runs it.
        redis.refuse_writes(true);
        let during_outage = app.sms_send(json!({ "phone": PHONE })).await;
        assert_eq!(
            during_outage.status, 200,
            "{on_error:?}: {}",
            during_outage.body
        );
        let during = app.sms.last_code(PHONE);
        redis.refuse_writes(false);
        assert!(ready_again(&app).await, "{on_error:?}: Redis answers again");

        app.sms.fail(true);
        let failed = app.sms_send(json!({ "phone": PHONE })).await;
        assert_eq!(failed.status, 502, "{on_error:?}: {}", failed.body);
        app.sms.fail(false);
        if before != during {
            let old = app
                .sms_verify(json!({ "phone": PHONE, "code": before }))
                .await;
            assert_eq!(
                old.body["valid"], false,
                "{on_error:?}: the code sent before the outage was replaced"
            );
        }
        let held = app
            .sms_verify(json!({ "phone": PHONE, "code": during }))
            .await;
        assert_eq!(held.body["valid"], true, "{on_error:?}: {}", held.body);
    }
}

/// A send stored in Redis before an outage, whose delivery ends after a
/// code was sent during it, does not make that newer code give way: the
/// code of the later send is the one that verifies.
#[tokio::test]
async fn a_slow_delivery_from_before_an_outage_leaves_the_code_sent_during_it() {
    for on_error in [OnStoreError::Allow, OnStoreError::Local] {
        let redis = PrivateRedis::start().await;
        let app = outage_app(&redis, on_error).await;
        let held = app.sms.hold_next_delivery();
        let (slow, newer) = tokio::join!(app.sms_send(json!({ "phone": PHONE })), async {
            held.arrived
                .await
                .expect("the slow send reaches the provider");
            redis.refuse_writes(true);
            let newer = app.sms_send(json!({ "phone": PHONE })).await;
            let _ = held.release.send(());
            newer
        });
        assert_eq!(slow.status, 200, "{on_error:?}: {}", slow.body);
        assert_eq!(newer.status, 200, "{on_error:?}: {}", newer.body);
        redis.refuse_writes(false);
        assert!(ready_again(&app).await, "{on_error:?}: Redis answers again");
        // Messages in the order they were delivered: the newer send's first.
        let codes = delivered_codes(&app);
        let [during, slow_code] = &codes[..] else {
            panic!("{on_error:?}: two SMS delivered: {codes:?}");
        };
        if slow_code != during {
            let old = app
                .sms_verify(json!({ "phone": PHONE, "code": slow_code }))
                .await;
            assert_eq!(
                old.body["valid"], false,
                "{on_error:?}: the slow send's code was replaced"
            );
        }
        let newest = app
            .sms_verify(json!({ "phone": PHONE, "code": during }))
            .await;
        assert_eq!(newest.body["valid"], true, "{on_error:?}: {}", newest.body);
    }
}

/// Redis flaps: a send stored in Redis after a held code, whose slow
/// delivery ends after a second outage's code replaced that held code,
/// lets go of neither: the second outage's code is the newest.
#[tokio::test]
async fn a_slow_delivery_between_two_outages_leaves_the_second_ones_code() {
    let redis = PrivateRedis::start().await;
    let app = outage_app(&redis, OnStoreError::Local).await;
    let outage = |on: bool| redis.refuse_writes(on);
    outage(true);
    assert_eq!(app.sms_send(json!({ "phone": PHONE })).await.status, 200);
    outage(false);
    assert!(ready_again(&app).await, "Redis answers again");
    let held = app.sms.hold_next_delivery();
    let (slow, second) = tokio::join!(app.sms_send(json!({ "phone": PHONE })), async {
        held.arrived
            .await
            .expect("the slow send reaches the provider");
        outage(true);
        let second = app.sms_send(json!({ "phone": PHONE })).await;
        let _ = held.release.send(());
        second
    });
    assert_eq!(slow.status, 200, "{}", slow.body);
    assert_eq!(second.status, 200, "{}", second.body);
    outage(false);
    assert!(ready_again(&app).await, "Redis answers again");
    // Delivered in this order: the first outage's, the second's, the slow one's.
    let codes = delivered_codes(&app);
    let [_, newest, _] = &codes[..] else {
        panic!("three SMS delivered: {codes:?}");
    };
    let verify = app
        .sms_verify(json!({ "phone": PHONE, "code": newest }))
        .await;
    assert_eq!(verify.body["valid"], true, "{}", verify.body);
}

/// A TCP proxy to a Redis whose open connections can be silenced: they stop
/// carrying anything either way but stay open, as a connection to a host
/// that died or went behind a firewall that drops. Connections made after
/// that are carried as before, to the Redis they are sent to then (a
/// failover behind one address).
struct SilencingProxy {
    port: u16,
    to: Arc<AtomicU16>,
    silenced: Arc<Mutex<Vec<Arc<AtomicBool>>>>,
    accepted: Arc<AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

impl SilencingProxy {
    async fn start(to: u16) -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("a free port");
        let port = listener.local_addr().expect("bound").port();
        let to = Arc::new(AtomicU16::new(to));
        let silenced: Arc<Mutex<Vec<Arc<AtomicBool>>>> = Arc::default();
        let accepted = Arc::new(AtomicUsize::new(0));
        let (target, flags, count) = (to.clone(), silenced.clone(), accepted.clone());
        let task = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let to = target.load(Ordering::SeqCst);
                let Ok(server) = tokio::net::TcpStream::connect(("127.0.0.1", to)).await else {
                    continue;
                };
                count.fetch_add(1, Ordering::SeqCst);
                let flag = Arc::new(AtomicBool::new(false));
                flags.lock().expect("not poisoned").push(flag.clone());
                let (client_read, client_write) = client.into_split();
                let (server_read, server_write) = server.into_split();
                tokio::spawn(Self::pump(client_read, server_write, flag.clone()));
                tokio::spawn(Self::pump(server_read, client_write, flag));
            }
        });
        Self {
            port,
            to,
            silenced,
            accepted,
            task,
        }
    }

    /// Carry the connections made from now on to the Redis at `port`; the
    /// open ones stay where they are.
    fn send_new_connections_to(&self, port: u16) {
        self.to.store(port, Ordering::SeqCst);
    }

    /// Copy `from` to `to` until either ends; once `silenced`, hold both
    /// open and carry nothing more.
    async fn pump(
        mut from: tokio::net::tcp::OwnedReadHalf,
        mut to: tokio::net::tcp::OwnedWriteHalf,
        silenced: Arc<AtomicBool>,
    ) {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut buf = vec![0u8; 16 * 1024];
        loop {
            let n = match from.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => n,
            };
            if silenced.load(Ordering::SeqCst) {
                let _held = (from, to);
                std::future::pending::<()>().await;
                return;
            }
            if to.write_all(&buf[..n]).await.is_err() {
                return;
            }
        }
    }

    fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    fn silence_open_connections(&self) {
        for flag in self.silenced.lock().expect("not poisoned").iter() {
            flag.store(true, Ordering::SeqCst);
        }
    }

    fn accepted(&self) -> usize {
        self.accepted.load(Ordering::SeqCst)
    }
}

impl Drop for SilencingProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// A connection that stops answering without closing is replaced: the
/// calls on it time out, a probe finds it silent, and tollgate connects
/// again (through the proxy, which carries new connections), so decisions
/// come back without anyone restarting anything.
#[tokio::test]
async fn a_connection_that_goes_silent_is_replaced() {
    let redis = PrivateRedis::start().await;
    let proxy = SilencingProxy::start(redis.port).await;
    let url = proxy.url();
    let app = spawn_app(Backend::Redis, move |s| {
        s.store.redis_url = SecretUrl::new(url);
        s.store.timeout = std::time::Duration::from_millis(200);
    })
    .await;
    assert_eq!(app.login_check(json!({ "user": "a" })).await.status, 200);
    let connections = settled_connections(&proxy).await;

    proxy.silence_open_connections();
    let cut_off = app.login_check(json!({ "user": "a" })).await;
    assert_eq!(
        (cut_off.status.as_u16(), cut_off.error()),
        (503, "store_unavailable")
    );
    // Every client of the app (one per worker) is replaced once its calls
    // time out: ten answers in a row, each on a connection of its own (the
    // workers take new connections in turn), say they all were.
    ten_answers_in_a_row(&app, "/login/check", &json!({ "user": "a" }), "no answers").await;
    assert!(
        proxy.accepted() > connections,
        "answered through new connections"
    );
}

/// Ten 200s in a row from `path`, each on an HTTP connection of its own
/// (the workers take new connections in turn, so every worker's Redis
/// client answered), within 30 s; `failing` says what it is otherwise.
async fn ten_answers_in_a_row(app: &TestApp, path: &str, body: &serde_json::Value, failing: &str) {
    let fresh = reqwest::Client::builder()
        .pool_max_idle_per_host(0)
        .build()
        .expect("an HTTP client");
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut in_a_row = 0;
    while in_a_row < 10 {
        assert!(Instant::now() < deadline, "{failing} after 30 s");
        let answer = fresh
            .post(format!("{}{path}", app.address))
            .bearer_auth(crate::support::app::API_KEY)
            .json(body)
            .send()
            .await
            .map(|answer| answer.status().as_u16());
        if answer.ok() == Some(200) {
            in_a_row += 1;
        } else {
            in_a_row = 0;
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

/// How many connections `proxy` carries once every client of the app has
/// connected (each worker's in the background): once the count has stood
/// still for a second.
async fn settled_connections(proxy: &SilencingProxy) -> usize {
    let mut connections = proxy.accepted();
    loop {
        tokio::time::sleep(std::time::Duration::from_secs(1)).await;
        let now = proxy.accepted();
        if now == connections {
            break;
        }
        connections = now;
    }
    assert!(connections >= 2, "the start-up client and the workers'");
    connections
}

/// A primary turned into a replica while its clients stay connected (a
/// failover behind one name or address that closes no connection) refuses
/// every write `READONLY`: each client connects again at its first such
/// answer, and the new connections reach the new primary. Without that, a
/// deployment answered 503 until something outside cut the connections.
#[tokio::test]
async fn a_primary_turned_replica_under_open_connections_is_left() {
    let old = PrivateRedis::start().await;
    let new = PrivateRedis::start().await;
    let proxy = SilencingProxy::start(old.port).await;
    let url = proxy.url();
    let app = spawn_app(Backend::Redis, move |s| {
        s.store.redis_url = SecretUrl::new(url);
    })
    .await;
    let attempt = json!({ "user": "a", "success": true });
    assert_eq!(app.login_attempt(attempt.clone()).await.status, 200);
    let connections = settled_connections(&proxy).await;

    proxy.send_new_connections_to(new.port);
    old.replica_of(new.port);
    ten_answers_in_a_row(&app, "/login/attempt", &attempt, "writes still refused").await;
    assert!(
        proxy.accepted() > connections,
        "answered through new connections"
    );
}

/// The console says the store is down in its own words: the store's (its
/// address, its replies) go to the log, not to the page.
#[tokio::test]
async fn the_console_names_a_store_failure_without_the_stores_words() {
    let app = spawn_app(Backend::Redis, unreachable_redis(OnStoreError::Deny)).await;
    let page = crate::support::text_of(
        app.client
            .get(format!("{}/admin", app.address))
            .basic_auth("admin", Some(crate::support::app::ADMIN_TOKEN)),
    )
    .await;
    assert!(
        page.contains("The blocked number ranges cannot be read: the store is unavailable."),
        "{page}"
    );
    assert!(!page.contains("127.0.0.1:1"), "{page}");
}

/// An app on `redis` whose user locks after two failures (account-wide),
/// falling back to the local store as `on_error` says.
async fn locking_app(redis: &PrivateRedis, on_error: OnStoreError) -> TestApp {
    stalling_app(redis, move |s| {
        s.store.on_error = on_error;
        s.login.captcha_after = 100;
        s.login.lock_after = 2;
        s.login.lock_scope = tollgate::settings::LockScope::User;
    })
    .await
}

/// Two failures of alice's: she is locked where they were counted.
async fn lock_alice(app: &TestApp) {
    let mut last = None;
    for _ in 0..2 {
        let failed = app
            .login_attempt(json!({ "user": "alice", "success": false, "ip": "203.0.113.1" }))
            .await;
        assert_eq!(failed.status, 200, "{}", failed.body);
        last = Some(failed.body);
    }
    let last = last.expect("two answers");
    assert_eq!(last["locked"], true, "{last}");
}

fn unblock_rows(app: &TestApp) -> usize {
    app.audit_events()
        .iter()
        .filter(|e| e.decision == tollgate::audit::AuditDecision::Unblock)
        .count()
}

/// `answer` is the 503 a store that does not answer gives.
fn assert_store_unavailable(answer: &crate::support::app::Answer, context: &str) {
    assert_eq!(
        (answer.status.as_u16(), answer.error()),
        (503, "store_unavailable"),
        "{context}: {}",
        answer.body
    );
}

/// An unblock must reach Redis, whatever `on_error` says: the fallback
/// store would take it, answer the lock lifted and audit it, while Redis
/// kept the lock. Refused 503 and not audited; done once Redis answers.
#[tokio::test]
async fn an_unblock_while_redis_stalls_is_refused_whatever_the_fallback() {
    for on_error in [OnStoreError::Allow, OnStoreError::Local] {
        let redis = PrivateRedis::start().await;
        let app = locking_app(&redis, on_error).await;
        lock_alice(&app).await;
        redis.freeze();
        let refused = app
            .admin_post("/admin/api/subjects/user/alice/unblock")
            .await;
        redis.thaw();
        assert_store_unavailable(&refused, &format!("{on_error:?}"));
        app.flush_audit().await;
        assert_eq!(unblock_rows(&app), 0, "{on_error:?}: nothing audited");
        assert!(ready_again(&app).await, "{on_error:?}: Redis answers again");
        let done = app
            .admin_post("/admin/api/subjects/user/alice/unblock")
            .await;
        assert_eq!(done.status, 200, "{on_error:?}: {}", done.body);
        let check = app
            .login_check(json!({ "user": "alice", "ip": "203.0.113.1" }))
            .await;
        assert_eq!(check.body["locked"], false, "{on_error:?}: {}", check.body);
        app.flush_audit().await;
        assert_eq!(unblock_rows(&app), 1, "{on_error:?}");
    }
}

/// A failed login whose client resets its connection while Redis has not
/// answered yet still ends: actix drops a reset connection's handler, but
/// the decision runs on a task of its own, so the lock Redis sets is
/// audited (it was not: a lock in force that no row named).
#[tokio::test]
async fn a_lock_whose_client_went_away_is_still_audited() {
    let redis = PrivateRedis::start().await;
    // A store timeout far past the stall: the call waits for Redis.
    let app = stalling_app(&redis, |s| {
        s.store.timeout = Duration::from_secs(3);
        s.login.captcha_after = 100;
        s.login.lock_after = 2;
        s.login.lock_scope = tollgate::settings::LockScope::User;
    })
    .await;
    let first = app
        .login_attempt(json!({ "user": "alice", "success": false, "ip": "203.0.113.1" }))
        .await;
    assert_eq!(first.status, 200, "{}", first.body);
    let body = r#"{"user":"alice","success":false,"ip":"203.0.113.1"}"#;
    let key = app.api_key.as_deref().expect("the test app has an API key");
    let ask = format!(
        "POST /login/attempt HTTP/1.1\r\nHost: tollgate\r\nAuthorization: Bearer {key}\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    // Reset while the store call waits, well within `store.timeout`.
    redis.freeze();
    app.ask_and_reset(ask.as_bytes(), Duration::from_millis(300))
        .await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    redis.thaw();
    // The decision ends on its own time once Redis answers.
    let mut locks = 0;
    for _ in 0..40 {
        app.flush_audit().await;
        locks = app
            .audit_events()
            .iter()
            .filter(|e| e.decision == tollgate::audit::AuditDecision::Lock)
            .count();
        if locks > 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(locks, 1, "the lock Redis set is audited");
    let check = app
        .login_check(json!({ "user": "alice", "ip": "203.0.113.1" }))
        .await;
    assert_eq!(check.body["locked"], true, "{}", check.body);
}

/// An unblock done and audited whose read of the state after it fails (a
/// Redis that refuses scripts from then on: the index's `ZRANGE` and the
/// `DEL` pass, the state's script does not) answers 503 saying it was done,
/// not as if nothing had been: the lock is lifted and one row audits it.
#[tokio::test]
async fn an_unblock_whose_state_read_fails_says_it_was_done() {
    let redis = PrivateRedis::start().await;
    let app = locking_app(&redis, OnStoreError::Deny).await;
    lock_alice(&app).await;
    let refused = "tollgate_store_errors_total{kind=\"refused\"}";
    let refused_before = app.metric(refused).await;
    redis.acl_default(&["-@scripting"]);
    let answer = app
        .admin_post("/admin/api/subjects/user/alice/unblock")
        .await;
    redis.acl_default(&["+@scripting"]);
    assert_store_unavailable(&answer, "the state read refused");
    let message = answer.body["message"].as_str().unwrap_or_default();
    assert!(message.contains("done and audited"), "{}", answer.body);
    assert!(
        app.metric(refused).await > refused_before,
        "NOPERM is counted as refused, not as an outage"
    );
    let check = app
        .login_check(json!({ "user": "alice", "ip": "203.0.113.1" }))
        .await;
    assert_eq!(check.body["locked"], false, "{}", check.body);
    app.flush_audit().await;
    assert_eq!(unblock_rows(&app), 1);
}

/// During an outage under `on_error = "local"` the local store decides: an
/// unblock refused then (Redis does not answer) leaves its lock as it is,
/// as nothing audited it.
#[tokio::test]
async fn an_unblock_refused_in_an_outage_leaves_the_local_stores_lock() {
    let redis = PrivateRedis::start().await;
    let app = locking_app(&redis, OnStoreError::Local).await;
    redis.freeze();
    lock_alice(&app).await;
    let refused = app
        .admin_post("/admin/api/subjects/user/alice/unblock")
        .await;
    let still = app
        .login_attempt(json!({ "user": "alice", "success": true, "ip": "203.0.113.1" }))
        .await;
    redis.thaw();
    assert_store_unavailable(&refused, "on_error = local");
    assert_eq!(still.body["locked"], true, "{}", still.body);
    app.flush_audit().await;
    assert_eq!(unblock_rows(&app), 0);
}

/// What the local store counted in an outage is lifted by an unblock made
/// after it, so that the next outage does not bring the lock back.
#[tokio::test]
async fn an_unblock_clears_what_the_local_store_counted_in_an_outage() {
    let redis = PrivateRedis::start().await;
    let app = locking_app(&redis, OnStoreError::Local).await;
    redis.refuse_writes(true);
    lock_alice(&app).await;
    redis.refuse_writes(false);
    assert!(ready_again(&app).await, "Redis answers again");
    let done = app
        .admin_post("/admin/api/subjects/user/alice/unblock")
        .await;
    assert_eq!(done.status, 200, "{}", done.body);
    redis.refuse_writes(true);
    let failed = app
        .login_attempt(json!({ "user": "alice", "success": false, "ip": "203.0.113.1" }))
        .await;
    redis.refuse_writes(false);
    assert_eq!(
        (
            failed.body["decision"].as_str(),
            failed.body["locked"].as_bool()
        ),
        (Some("allow"), Some(false)),
        "the second outage starts from nothing: {}",
        failed.body
    );
}
