//! `spawn_app`: the real application on port 0, with a random Redis key prefix,
//! a capturing SMS provider and a capturing audit sink.

use std::sync::Arc;
use std::time::Duration;

use actix_web::dev::ServerHandle;
use async_trait::async_trait;
use parking_lot::Mutex;
use reqwest::{Response, StatusCode};
use serde_json::Value;
use tollgate::audit::{AuditEvent, AuditSink, CapturingSink};
use tollgate::delivery::{DeliveryError, SmsMessage, SmsSender};
use tollgate::settings::{LimitSetting, Settings, StoreBackend};
use tollgate::startup::{Application, Overrides};
use tollgate::store::redis::RedisStore;
use tollgate::store::{Clock, ManualClock};

pub const API_KEY: &str = "test-api-key-0123456789";
pub const ADMIN_TOKEN: &str = "test-admin-token-0123456789";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    Memory,
    Redis,
}

/// A port nothing listens on (bound, read, released).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

pub fn redis_url() -> String {
    std::env::var("TOLLGATE_TEST_REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into())
}

/// Runs each named `async fn name(backend: Backend)` once per backend:
/// `module::name::on_memory` and `module::name::on_redis`, named as the
/// store conformance cases are (`store_conformance::on_both_backends!`).
#[macro_export]
macro_rules! on_both_backends {
    ($($name:ident),* $(,)?) => {$(
        mod $name {
            #[tokio::test]
            async fn on_memory() {
                super::$name($crate::support::app::Backend::Memory).await
            }

            #[tokio::test]
            async fn on_redis() {
                super::$name($crate::support::app::Backend::Redis).await
            }
        }
    )*};
}

/// An SMS provider that keeps every message, and fails while told to.
#[derive(Default, Clone)]
pub struct CapturingSender {
    messages: Arc<Mutex<Vec<SmsMessage>>>,
    failing: Arc<Mutex<bool>>,
    declining: Arc<Mutex<bool>>,
    refusing: Arc<Mutex<bool>>,
    held: Arc<Mutex<Option<Hold>>>,
}

/// The provider's side of [`CapturingSender::hold_next_failure`].
struct Hold {
    arrived: tokio::sync::oneshot::Sender<()>,
    release: tokio::sync::oneshot::Receiver<()>,
    delivers: bool,
}

/// The test's side of a held send: `arrived` resolves once the send is at
/// the provider; sending on `release` (or dropping it) lets it fail.
pub struct HeldSend {
    pub arrived: tokio::sync::oneshot::Receiver<()>,
    pub release: tokio::sync::oneshot::Sender<()>,
}

impl CapturingSender {
    /// The next send waits at the provider until released, then fails:
    /// for a test of what happens meanwhile.
    pub fn hold_next_failure(&self) -> HeldSend {
        self.hold_next(false)
    }

    /// The next send waits at the provider until released, then is
    /// delivered.
    pub fn hold_next_delivery(&self) -> HeldSend {
        self.hold_next(true)
    }

    fn hold_next(&self, delivers: bool) -> HeldSend {
        let (arrived_tx, arrived) = tokio::sync::oneshot::channel();
        let (release, release_rx) = tokio::sync::oneshot::channel();
        *self.held.lock() = Some(Hold {
            arrived: arrived_tx,
            release: release_rx,
            delivers,
        });
        HeldSend { arrived, release }
    }

    pub fn messages(&self) -> Vec<SmsMessage> {
        self.messages.lock().clone()
    }
    pub fn fail(&self, failing: bool) {
        *self.failing.lock() = failing;
    }
    /// While `declining`, every send is declined as the request's own
    /// pick (Twilio's 21408: a region the account may not text).
    pub fn decline(&self, declining: bool) {
        *self.declining.lock() = declining;
    }
    /// While `refusing`, every number is refused for good (Twilio's 21211).
    pub fn refuse(&self, refusing: bool) {
        *self.refusing.lock() = refusing;
    }
    /// The code in the last message to `phone`.
    pub fn last_code(&self, phone: &str) -> String {
        let messages = self.messages();
        let body = &messages
            .iter()
            .rev()
            .find(|m| m.to == phone)
            .unwrap_or_else(|| panic!("no SMS was sent to {phone}"))
            .body;
        body.split(|c: char| !c.is_ascii_digit())
            .find(|run| run.len() == 6)
            .unwrap_or_else(|| panic!("no 6-digit code in {body:?}"))
            .to_string()
    }
}

#[async_trait]
impl SmsSender for CapturingSender {
    async fn send(&self, message: &SmsMessage) -> Result<(), DeliveryError> {
        let held = self.held.lock().take();
        if let Some(hold) = held {
            let _ = hold.arrived.send(());
            let _ = hold.release.await;
            if hold.delivers {
                self.messages.lock().push(message.clone());
                return Ok(());
            }
            return Err(DeliveryError::Rejected(
                "held, then failed by the test".into(),
            ));
        }
        if *self.failing.lock() {
            return Err(DeliveryError::Rejected("503 from the test provider".into()));
        }
        if *self.refusing.lock() {
            return Err(DeliveryError::Refused(
                "twilio answered 400 Bad Request, error code 21211".into(),
            ));
        }
        if *self.declining.lock() {
            return Err(DeliveryError::Declined(
                "twilio answered 400 Bad Request, error code 21408".into(),
            ));
        }
        self.messages.lock().push(message.clone());
        Ok(())
    }
}

pub struct TestApp {
    pub address: String,
    /// The admin listener's address, when `server.admin_bind` is set.
    pub admin_address: Option<String>,
    pub client: reqwest::Client,
    pub sms: CapturingSender,
    pub audit: CapturingSink,
    pub backend: Backend,
    pub key_prefix: String,
    /// The Redis (or cluster) the app talks to; its test keys are deleted on drop.
    pub redis_url: String,
    /// Sent as `Authorization: Bearer` by the helpers when set.
    pub api_key: Option<String>,
    /// Sent as `Authorization: Bearer` by the admin helpers.
    pub admin_token: Option<String>,
    sink: Arc<dyn AuditSink>,
    handle: ServerHandle,
    /// The in-process store's clock, when the test drives it.
    clock: Option<ManualClock>,
}

/// Loose limits everywhere, so that each test tightens only what it checks.
pub fn test_settings(backend: Backend) -> Settings {
    let mut s = Settings::defaults().expect("the embedded defaults are valid");
    s.server.bind = "127.0.0.1:0".parse().unwrap();
    s.server.api_keys = vec![tollgate::settings::Secret::new(API_KEY)];
    s.server.admin_tokens = vec![tollgate::settings::AdminToken::plain(ADMIN_TOKEN)];
    s.store.backend = match backend {
        Backend::Memory => StoreBackend::Memory,
        Backend::Redis => StoreBackend::Redis,
    };
    s.store.redis_url = tollgate::settings::SecretUrl::new(redis_url());
    if backend == Backend::Redis {
        // Required with Redis (a config file without it does not load).
        s.sms.code_secret = tollgate::settings::Secret::new("test-code-secret-0123456789");
    }
    s.store.key_prefix = format!("tgtest-{}", uuid::Uuid::new_v4().simple());
    s.store.timeout = Duration::from_secs(2);
    let loose = |limit| vec![LimitSetting::new(limit, Duration::from_secs(3600))];
    s.sms.phone_limits = loose(1000);
    s.sms.ip_limits = loose(1000);
    s.sms.prefix_limits = loose(1000);
    s.sms.global_limits = loose(100_000);
    s.sms.verify_ip_limits = loose(1000);
    s.sms.verify_network_limits = loose(10_000);
    s.sms.captcha_after = 1000;
    s.sms.network_captcha_after = 1000;
    s
}

pub fn limits(pairs: &[(u32, u64)]) -> Vec<LimitSetting> {
    pairs
        .iter()
        .map(|&(limit, ms)| LimitSetting::new(limit, Duration::from_millis(ms)))
        .collect()
}

pub async fn spawn_app(backend: Backend, configure: impl FnOnce(&mut Settings)) -> TestApp {
    spawn_app_with_clock(backend, None, configure).await
}

/// Like [`spawn_app`], for a test that lets time pass with
/// [`TestApp::pass`]: on the in-process store a manual clock moves at once;
/// Redis keeps its own time, so there the test sleeps.
pub async fn spawn_app_timed(backend: Backend, configure: impl FnOnce(&mut Settings)) -> TestApp {
    let clock = (backend == Backend::Memory).then(|| ManualClock::new(1_700_000_000_000));
    spawn_app_with_clock(backend, clock, configure).await
}

pub async fn spawn_app_with_clock(
    backend: Backend,
    clock: Option<ManualClock>,
    configure: impl FnOnce(&mut Settings),
) -> TestApp {
    spawn(
        backend,
        SpawnOptions {
            clock,
            capture_sms: true,
            capture_audit: true,
        },
        configure,
    )
    .await
}

/// Like [`spawn_app`], but audit events go to the real sink and database that
/// `[audit]` configures (see `crate::support::audit_db::TestDb`); `app.audit` stays empty.
pub async fn spawn_app_with_audit_db(
    backend: Backend,
    configure: impl FnOnce(&mut Settings),
) -> TestApp {
    spawn(
        backend,
        SpawnOptions {
            clock: None,
            capture_sms: true,
            capture_audit: false,
        },
        configure,
    )
    .await
}

/// Like [`spawn_app`], but SMS go through the provider `[sms.provider]`
/// configures (webhook, twilio) instead of the capturing one; `app.sms` stays empty.
pub async fn spawn_app_with_sms_provider(
    backend: Backend,
    configure: impl FnOnce(&mut Settings),
) -> TestApp {
    spawn(
        backend,
        SpawnOptions {
            clock: None,
            capture_sms: false,
            capture_audit: true,
        },
        configure,
    )
    .await
}

struct SpawnOptions {
    clock: Option<ManualClock>,
    capture_sms: bool,
    capture_audit: bool,
}

async fn spawn(
    backend: Backend,
    options: SpawnOptions,
    configure: impl FnOnce(&mut Settings),
) -> TestApp {
    let SpawnOptions {
        clock,
        capture_sms,
        capture_audit,
    } = options;
    let mut settings = test_settings(backend);
    configure(&mut settings);
    let sms = CapturingSender::default();
    let audit = CapturingSink::default();
    let overrides = Overrides {
        sms_sender: capture_sms.then(|| Arc::new(sms.clone()) as Arc<dyn SmsSender>),
        audit: capture_audit.then(|| Arc::new(audit.clone()) as Arc<dyn AuditSink>),
        clock: clock.clone().map(|c| Arc::new(c) as Arc<dyn Clock>),
    };
    let key_prefix = settings.store.key_prefix.clone();
    let redis_url = settings.store.redis_url.expose().to_string();
    let api_key = (!settings.server.api_keys.is_empty())
        .then(|| settings.server.api_keys[0].expose().to_string());
    let app = Application::build_with(settings, overrides)
        .await
        .expect("the application builds");
    let address = format!("http://127.0.0.1:{}", app.port());
    let admin_address = app
        .admin_port()
        .map(|port| format!("http://127.0.0.1:{port}"));
    let handle = app.handle();
    let sink = app.audit_sink();
    tokio::spawn(app.run_until_stopped());
    TestApp {
        address,
        admin_address,
        client: reqwest::Client::new(),
        sms,
        audit,
        backend,
        key_prefix,
        redis_url,
        api_key,
        admin_token: Some(ADMIN_TOKEN.to_string()),
        sink,
        handle,
        clock,
    }
}

/// A parsed answer: status, headers and JSON body.
pub struct Answer {
    pub status: StatusCode,
    pub retry_after: Option<String>,
    pub content_type: Option<String>,
    pub headers: reqwest::header::HeaderMap,
    pub body: Value,
}

impl Answer {
    async fn from(response: Response) -> Self {
        let status = response.status();
        let header = |name: &str| {
            response
                .headers()
                .get(name)
                .and_then(|v| v.to_str().ok())
                .map(str::to_string)
        };
        let retry_after = header("retry-after");
        let content_type = header("content-type");
        let headers = response.headers().clone();
        let text = response.text().await.expect("a readable body");
        let body = serde_json::from_str(&text).unwrap_or(Value::String(text));
        Self {
            status,
            retry_after,
            content_type,
            headers,
            body,
        }
    }

    pub fn error(&self) -> &str {
        self.body["error"].as_str().unwrap_or("<no error code>")
    }
}

impl TestApp {
    /// Let `time` pass for the store: the manual clock moves when the app
    /// has one ([`spawn_app_timed`]), else the test sleeps.
    pub async fn pass(&self, time: Duration) {
        match &self.clock {
            Some(clock) => clock.advance_ms(time.as_millis() as u64),
            None => tokio::time::sleep(time).await,
        }
    }

    pub async fn post(&self, path: &str, body: Value) -> Answer {
        let mut request = self
            .client
            .post(format!("{}{path}", self.address))
            .json(&body);
        if let Some(key) = &self.api_key {
            request = request.bearer_auth(key);
        }
        Answer::from(request.send().await.expect("the request is answered")).await
    }

    /// Send `raw` (a whole HTTP/1.1 request) on a connection of its own,
    /// wait `wait`, then reset the connection: an RST, not a FIN, since
    /// actix drops a reset connection's handler and keeps a half-closed
    /// one's. What a client that gives up mid-answer does to the server.
    pub async fn ask_and_reset(&self, raw: &[u8], wait: Duration) {
        use tokio::io::AsyncWriteExt;
        let host = self.address.trim_start_matches("http://");
        let mut stream = tokio::net::TcpStream::connect(host)
            .await
            .expect("the app listens");
        stream.write_all(raw).await.expect("the request is sent");
        tokio::time::sleep(wait).await;
        socket2::SockRef::from(&stream)
            .set_linger(Some(Duration::ZERO))
            .expect("SO_LINGER");
        drop(stream);
    }

    pub async fn send_raw(&self, request: reqwest::RequestBuilder) -> Answer {
        Answer::from(request.send().await.expect("the request is answered")).await
    }

    pub async fn get(&self, path: &str) -> Answer {
        self.send_raw(self.client.get(format!("{}{path}", self.address)))
            .await
    }

    pub async fn sms_send(&self, body: Value) -> Answer {
        self.post("/sms/send", body).await
    }
    pub async fn sms_verify(&self, body: Value) -> Answer {
        self.post("/sms/verify", body).await
    }
    pub async fn login_check(&self, body: Value) -> Answer {
        self.post("/login/check", body).await
    }
    pub async fn login_attempt(&self, body: Value) -> Answer {
        self.post("/login/attempt", body).await
    }

    /// One series of `/metrics` (0 when absent). The recorder is process-wide,
    /// so tests compare values before and after what they do.
    pub async fn metric(&self, series: &str) -> f64 {
        let text = self.get("/metrics").await.body;
        let text = text.as_str().expect("Prometheus text");
        text.lines()
            .find(|l| l.starts_with(series) && l[series.len()..].starts_with(' '))
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.parse().ok())
            .unwrap_or(0.0)
    }

    /// What the audit sink tells `/readyz`.
    pub fn sink_health(&self) -> tollgate::audit::AuditHealth {
        self.sink.health()
    }

    /// Wait until the audit events recorded so far are durable.
    pub async fn flush_audit(&self) {
        self.sink.flush().await;
    }

    pub async fn admin_get(&self, path: &str) -> Answer {
        let mut request = self.client.get(format!("{}{path}", self.address));
        if let Some(token) = &self.admin_token {
            request = request.bearer_auth(token);
        }
        self.send_raw(request).await
    }

    /// A `GET` of `path` with the admin token `token`.
    pub async fn admin_get_as(&self, token: &str, path: &str) -> Answer {
        let request = self.client.get(format!("{}{path}", self.address));
        self.send_raw(request.bearer_auth(token)).await
    }

    pub async fn admin_post(&self, path: &str) -> Answer {
        let mut request = self.client.post(format!("{}{path}", self.address));
        if let Some(token) = &self.admin_token {
            request = request.bearer_auth(token);
        }
        self.send_raw(request).await
    }

    pub fn audit_events(&self) -> Vec<AuditEvent> {
        self.audit.events()
    }

    /// Stop the server, as SIGTERM does when `graceful`: requests in flight
    /// get `server.shutdown_timeout`, then are dropped.
    pub async fn stop(&self, graceful: bool) {
        self.handle.stop(graceful).await;
    }
}

impl Drop for TestApp {
    fn drop(&mut self) {
        let handle = self.handle.clone();
        let backend = self.backend;
        let prefix = self.key_prefix.clone();
        let url = self.redis_url.clone();
        super::run_detached(move || async move {
            if backend == Backend::Redis {
                if let Ok(store) = RedisStore::connect(&url, Duration::from_secs(2)).await {
                    // A fresh client may still be connecting (a cluster's
                    // nodes one by one): retry briefly.
                    for _ in 0..30 {
                        if store.delete_prefix(&prefix).await.is_ok() {
                            break;
                        }
                        tokio::time::sleep(Duration::from_millis(100)).await;
                    }
                }
            }
        });
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            rt.spawn(async move { handle.stop(false).await });
        }
    }
}

/// Run `case` (real processes on the Redis at `redis_url`, under `prefix`),
/// then delete the prefix's keys whatever happened; a failure of the case is
/// raised after the cleanup.
pub async fn with_redis_prefix(
    redis_url: &str,
    prefix: &str,
    case: impl std::future::Future<Output = ()>,
) {
    use futures::FutureExt;
    let outcome = std::panic::AssertUnwindSafe(case).catch_unwind().await;
    let cleanup = async {
        RedisStore::connect(redis_url, Duration::from_secs(2))
            .await?
            .delete_prefix(prefix)
            .await
    }
    .await;
    if let Err(panic) = outcome {
        std::panic::resume_unwind(panic);
    }
    cleanup.unwrap_or_else(|e| panic!("delete the keys under {prefix}: {e}"));
}

/// `Settings::load` of a config file holding `toml` (written to a temporary
/// file, removed after).
pub fn load_config(toml: &str) -> Result<Settings, tollgate::settings::SettingsError> {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let path = dir.path().join("tollgate.toml");
    std::fs::write(&path, toml).expect("the config file is written");
    Settings::load(Some(&path))
}

/// Why `toml` does not load, as the error says it ("" when it loads).
pub fn config_error(toml: &str) -> String {
    load_config(toml)
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default()
}

/// Each `(path, value)`: the setting at the dotted `path` of `output` (what
/// `check-config` prints) is the TOML `value`: `("server.workers", "1")`,
/// `("store.timeout", "\"100ms\"")`. By its whole path, since a last name
/// alone (`timeout`) is a key of several sections.
pub fn assert_settings(output: &str, settings: &[(&str, &str)]) {
    let printed: toml::Table = output
        .parse()
        .unwrap_or_else(|e| panic!("not TOML ({e}):\n{output}"));
    for (path, value) in settings {
        let expected: toml::Table = format!("value = {value}")
            .parse()
            .expect("the expected value is TOML");
        let mut keys = path.split('.');
        let first = keys.next().and_then(|key| printed.get(key));
        let found = keys.fold(first, |table, key| table.and_then(|t| t.get(key)));
        assert_eq!(found, expected.get("value"), "`{path}` in:\n{output}");
    }
}

/// Run the binary with `args` (no `TOLLGATE_CONFIG` from the environment):
/// whether it succeeded, its stdout and its stderr.
pub fn run_binary(args: &[&str], envs: &[(&str, &str)]) -> (bool, String, String) {
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_tollgate"))
        .args(args)
        .envs(envs.iter().copied())
        .env_remove("TOLLGATE_CONFIG")
        .output()
        .expect("the binary runs");
    (
        output.status.success(),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}
