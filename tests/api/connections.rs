//! What a client can hold through its connections (docs/connections.md),
//! over raw TCP, on the application in this process: slow bodies answered
//! 408 before anything is decided, slow heads and unread answers cut, the
//! per-address cap, trusted proxies, no HTTP/2 in clear text. The
//! descriptor limit and SIGTERM are in `descriptors` (the real binary).

use std::io::ErrorKind;
use std::net::SocketAddr;
use std::time::Duration;

use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};

use crate::support::app::{spawn_app, Backend, TestApp, API_KEY};

/// Longest any answer or close is waited for: far above the 1 s timeouts
/// these tests set, far below the "never" of the code before them.
const BOUND: Duration = Duration::from_secs(15);
/// Pace of a trickled body: its 20-odd bytes would take seconds.
const TRICKLE: Duration = Duration::from_millis(300);

/// A TCP connection to `to` from the loopback address `from` (127.0.0.0/8
/// is all this host's on Linux), with a small receive buffer when asked.
pub async fn connect_from(from: &str, to: SocketAddr, receive_buffer: Option<u32>) -> TcpStream {
    try_connect_from(from, to, receive_buffer)
        .await
        .expect("the listener accepts")
}

/// [`connect_from`], which a connection closed at accept can fail (the
/// reset can come before `connect` returns).
pub async fn try_connect_from(
    from: &str,
    to: SocketAddr,
    receive_buffer: Option<u32>,
) -> std::io::Result<TcpStream> {
    let socket = TcpSocket::new_v4()?;
    if let Some(size) = receive_buffer {
        socket.set_recv_buffer_size(size)?;
    }
    socket.bind(format!("{from}:0").parse().unwrap())?;
    socket.connect(to).await
}

pub fn socket_addr(address: &str) -> SocketAddr {
    address
        .trim_start_matches("http://")
        .parse()
        .expect("an address")
}

/// An HTTP/1.1 answer as read off the wire, up to the server's close (or
/// reset).
#[derive(Debug)]
pub struct Raw {
    /// The bytes received before the close.
    pub bytes: Vec<u8>,
}

impl Raw {
    pub fn status(&self) -> Option<u16> {
        let text = String::from_utf8_lossy(&self.bytes);
        text.strip_prefix("HTTP/1.1 ")?.get(..3)?.parse().ok()
    }

    pub fn header(&self, name: &str) -> Option<String> {
        let text = String::from_utf8_lossy(&self.bytes);
        let (head, _) = text.split_once("\r\n\r\n")?;
        head.lines().find_map(|line| {
            let (key, value) = line.split_once(':')?;
            key.eq_ignore_ascii_case(name)
                .then(|| value.trim().to_string())
        })
    }

    pub fn json(&self) -> Value {
        let text = String::from_utf8_lossy(&self.bytes);
        let (_, body) = text.split_once("\r\n\r\n").expect("a head");
        serde_json::from_str(body).unwrap_or_else(|_| panic!("a JSON body: {text}"))
    }
}

/// Read until the server closes the connection (or resets it).
pub async fn read_to_close(read: &mut (impl AsyncReadExt + Unpin)) -> Raw {
    let mut bytes = Vec::new();
    let mut chunk = [0u8; 8192];
    tokio::time::timeout(BOUND, async {
        while let Ok(n @ 1..) = read.read(&mut chunk).await {
            bytes.extend_from_slice(&chunk[..n]);
        }
    })
    .await
    .unwrap_or_else(|_| {
        panic!(
            "the server did not close the connection within {BOUND:?}; received {:?}",
            String::from_utf8_lossy(&bytes)
        )
    });
    Raw { bytes }
}

/// Write `bytes` one at a time, `TRICKLE` apart, until done or refused.
pub fn trickle(
    mut write: impl AsyncWriteExt + Unpin + Send + 'static,
    bytes: Vec<u8>,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        for byte in bytes {
            tokio::time::sleep(TRICKLE).await;
            if write.write_all(&[byte]).await.is_err() {
                return;
            }
        }
    })
}

/// A POST whose head goes out at once and whose JSON body trickles.
pub fn slow_post_head(path: &str, body: &str) -> String {
    format!(
        "POST {path} HTTP/1.1\r\nHost: tollgate\r\nAuthorization: Bearer {API_KEY}\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        body.len()
    )
}

async fn one_second_app() -> TestApp {
    spawn_app(Backend::Memory, |s| {
        s.server.request_timeout = Duration::from_secs(1);
    })
    .await
}

/// POST `body` to `path` with the body trickling; the server's answer.
async fn post_slowly(app: &TestApp, path: &str, body: &str) -> Raw {
    let stream = connect_from("127.0.0.1", socket_addr(&app.address), None).await;
    let (mut read, mut write) = stream.into_split();
    write
        .write_all(slow_post_head(path, body).as_bytes())
        .await
        .unwrap();
    let trickler = trickle(write, body.as_bytes().to_vec());
    let answer = read_to_close(&mut read).await;
    trickler.abort();
    answer
}

fn assert_request_timeout(answer: &Raw) {
    assert_eq!(answer.status(), Some(408), "{answer:?}");
    assert_eq!(
        answer.header("content-type").as_deref(),
        Some("application/json")
    );
    assert_eq!(answer.header("connection").as_deref(), Some("close"));
    assert_eq!(answer.json()["error"], "request_timeout", "{answer:?}");
}

/// The body of `/sms/send` would be a valid request, were it not slower
/// than `server.request_timeout`: 408, nothing sent, nothing counted,
/// nothing audited.
#[tokio::test]
async fn a_send_whose_body_trickles_past_the_timeout_is_answered_408_and_sends_nothing() {
    let app = one_second_app().await;
    let answer = post_slowly(&app, "/sms/send", r#"{"phone":"+8613800138000"}"#).await;
    assert_request_timeout(&answer);
    assert!(app.sms.messages().is_empty());
    app.flush_audit().await;
    assert!(app.audit_events().is_empty(), "{:?}", app.audit_events());
    // The phone's quota is untouched: a normal send goes through.
    let sent = app.sms_send(json!({ "phone": "+8613800138000" })).await;
    assert_eq!(sent.status, 200, "{}", sent.body);
}

/// A failed login whose body trickles counts no failure.
#[tokio::test]
async fn a_login_attempt_whose_body_trickles_counts_no_failure() {
    let app = one_second_app().await;
    let answer = post_slowly(
        &app,
        "/login/attempt",
        r#"{"user":"slow-victim","success":false}"#,
    )
    .await;
    assert_request_timeout(&answer);
    let state = app.login_check(json!({ "user": "slow-victim" })).await;
    assert_eq!(state.body["failures"], 0, "{}", state.body);
    app.flush_audit().await;
    assert!(app.audit_events().is_empty());
}

/// The console's forms read their body as bytes, not JSON: the same 408.
#[tokio::test]
async fn a_console_form_whose_body_trickles_is_answered_408() {
    let app = one_second_app().await;
    let body = "kind=ip&value=192.0.2.1&csrf=x";
    let stream = connect_from("127.0.0.1", socket_addr(&app.address), None).await;
    let (mut read, mut write) = stream.into_split();
    let head = format!(
        "POST /admin/lists HTTP/1.1\r\nHost: tollgate\r\n\
         Authorization: Basic {}\r\nContent-Type: application/x-www-form-urlencoded\r\n\
         Content-Length: {}\r\n\r\n",
        base64_admin(),
        body.len()
    );
    write.write_all(head.as_bytes()).await.unwrap();
    let trickler = trickle(write, body.as_bytes().to_vec());
    let answer = read_to_close(&mut read).await;
    trickler.abort();
    assert_request_timeout(&answer);
}

fn base64_admin() -> String {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD
        .encode(format!("admin:{}", crate::support::app::ADMIN_TOKEN))
}

/// A first head that never completes, and a second one on a kept-alive
/// connection (which actix alone would wait for forever), are cut without
/// an answer once the timeout has passed.
#[tokio::test]
async fn a_head_that_trickles_is_cut_first_or_after_a_kept_alive_answer() {
    let app = one_second_app().await;
    let head =
        b"GET /healthz HTTP/1.1\r\nHost: tollgate\r\nX-Padding: aaaaaaaaaaaaaaaaaaaa\r\n\r\n";

    let first = connect_from("127.0.0.1", socket_addr(&app.address), None).await;
    let (mut read, write) = first.into_split();
    let trickler = trickle(write, head.to_vec());
    let cut = read_to_close(&mut read).await;
    trickler.abort();
    assert!(cut.bytes.is_empty(), "no answer to half a head: {cut:?}");

    let second = connect_from("127.0.0.1", socket_addr(&app.address), None).await;
    let (mut read, mut write) = second.into_split();
    write
        .write_all(b"GET /healthz HTTP/1.1\r\nHost: tollgate\r\n\r\n")
        .await
        .unwrap();
    let mut answer = vec![0u8; 1024];
    let n = read.read(&mut answer).await.unwrap();
    assert!(
        answer[..n].starts_with(b"HTTP/1.1 200"),
        "the first request is answered: {:?}",
        String::from_utf8_lossy(&answer[..n])
    );
    let trickler = trickle(write, head.to_vec());
    let cut = read_to_close(&mut read).await;
    trickler.abort();
    assert!(cut.bytes.is_empty(), "no answer to half a head: {cut:?}");
}

/// A client that asks for answers and never reads them is cut: the server
/// resets the connection instead of holding the answers forever.
#[tokio::test]
async fn a_client_that_never_reads_its_answers_is_reset() {
    let app = one_second_app().await;
    let stream = connect_from("127.0.0.1", socket_addr(&app.address), Some(4096)).await;
    // 200 × the OpenAPI document (over 100 KB each) fills every buffer
    // between the two ends many times over.
    let requests = "GET /openapi.json HTTP/1.1\r\nHost: tollgate\r\n\r\n".repeat(200);
    let (read, mut write) = stream.into_split();
    write.write_all(requests.as_bytes()).await.unwrap();
    let stream = read.reunite(write).unwrap();
    let deadline = tokio::time::Instant::now() + BOUND;
    let error = loop {
        if let Some(error) = stream.take_error().unwrap() {
            break error;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the unread connection was still open after {BOUND:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(error.kind(), ErrorKind::ConnectionReset);
}

/// Over `server.max_connections_per_ip`, a connection is closed before a
/// byte is read; another address, or a freed slot, connects as before.
#[tokio::test]
async fn the_per_address_cap_closes_the_extra_connection_at_once() {
    let app = spawn_app(Backend::Memory, |s| {
        s.server.max_connections_per_ip = Some(2);
    })
    .await;
    let to = socket_addr(&app.address);
    let held = [
        connect_from("127.0.0.1", to, None).await,
        connect_from("127.0.0.1", to, None).await,
    ];
    // Both held connections are accepted (they answer) before the third
    // comes, so the third is the one over the cap.
    let mut held = held;
    for conn in &mut held {
        assert_kept_alive_healthz(conn).await;
    }
    let refused = healthz_from("127.0.0.1", to).await;
    assert!(refused.bytes.is_empty(), "closed unanswered: {refused:?}");

    assert_eq!(healthz_from("127.0.0.2", to).await.status(), Some(200));

    drop(held);
    // The server frees the slots as it sees the two connections close.
    let deadline = tokio::time::Instant::now() + BOUND;
    loop {
        if healthz_from("127.0.0.1", to).await.status() == Some(200) {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "slots never freed");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The admin listener holds at most half its cap per address (by
/// default): one peer that reaches it and never finishes its heads leaves
/// the other half to admins elsewhere.
#[tokio::test]
async fn one_address_holds_at_most_half_the_admin_listener() {
    let app = spawn_app(Backend::Memory, |s| {
        s.server.admin_bind = Some("127.0.0.1:0".parse().unwrap());
        s.server.workers = Some(1);
        s.server.admin_max_connections = Some(20);
    })
    .await;
    let admin = app.admin_address.as_deref().expect("an admin listener");
    let to = socket_addr(admin);
    let mut held = Vec::new();
    for _ in 0..10 {
        held.push(connect_from("127.0.0.1", to, None).await);
    }
    for conn in &mut held {
        assert_kept_alive_healthz(conn).await;
    }
    let refused = healthz_from("127.0.0.1", to).await;
    assert!(refused.bytes.is_empty(), "closed unanswered: {refused:?}");
    assert_eq!(healthz_from("127.0.0.2", to).await.status(), Some(200));
    assert_eq!(healthz_from("127.0.0.3", to).await.status(), Some(200));
}

/// `server.workers` sets the listener's worker threads, over which the
/// connection cap is split: one worker holds all of a cap of CPUs + 1,
/// where one worker per CPU (two or more) would hold one connection each
/// and leave the last unanswered in the backlog until a held one closed.
#[tokio::test]
async fn one_worker_holds_the_whole_cap() {
    let cap = std::thread::available_parallelism().map_or(1, |n| n.get()) as u32 + 1;
    let app = spawn_app(Backend::Memory, |s| {
        s.server.workers = Some(1);
        s.server.max_connections = Some(cap);
        s.server.max_connections_per_ip = Some(cap);
    })
    .await;
    let to = socket_addr(&app.address);
    let mut held = Vec::new();
    for n in 1..=cap {
        let mut conn = connect_from("127.0.0.1", to, None).await;
        tokio::time::timeout(Duration::from_secs(2), assert_kept_alive_healthz(&mut conn))
            .await
            .unwrap_or_else(|_| panic!("connection {n} unanswered while {} are held", n - 1));
        held.push(conn);
    }
}

/// `GET /healthz` on `conn`, kept open: the answer's status line is 200.
async fn assert_kept_alive_healthz(conn: &mut TcpStream) {
    conn.write_all(b"GET /healthz HTTP/1.1\r\nHost: tollgate\r\n\r\n")
        .await
        .unwrap();
    let mut answer = [0u8; 12];
    conn.read_exact(&mut answer).await.unwrap();
    assert_eq!(&answer, b"HTTP/1.1 200");
}

/// `GET /healthz` on a connection of its own from `from`: the answer, or
/// nothing when the connection is closed at accept.
async fn healthz_from(from: &str, to: SocketAddr) -> Raw {
    let Ok(mut conn) = try_connect_from(from, to, None).await else {
        return Raw { bytes: Vec::new() };
    };
    let request = b"GET /healthz HTTP/1.1\r\nHost: tollgate\r\nConnection: close\r\n\r\n";
    let _ = conn.write_all(request).await;
    read_to_close(&mut conn).await
}

/// A trusted proxy carries many clients: its connections are not capped
/// per address.
#[tokio::test]
async fn a_trusted_proxy_is_not_capped_per_address() {
    let app = spawn_app(Backend::Memory, |s| {
        s.server.max_connections_per_ip = Some(1);
        s.server.trusted_proxies = vec!["127.0.0.3/32".parse().unwrap()];
    })
    .await;
    let to = socket_addr(&app.address);
    let mut open = Vec::new();
    for _ in 0..5 {
        open.push(connect_from("127.0.0.3", to, None).await);
    }
    for conn in &mut open {
        assert_kept_alive_healthz(conn).await;
    }
}

/// With `server.trusted_proxy_hops`, every peer is a proxy by position (a
/// balancer whose address is not listed): none is capped per address.
#[tokio::test]
async fn proxies_trusted_by_position_are_not_capped_per_address() {
    let app = spawn_app(Backend::Memory, |s| {
        s.server.max_connections_per_ip = Some(1);
        s.server.trusted_proxy_hops = 1;
    })
    .await;
    let to = socket_addr(&app.address);
    let mut open = Vec::new();
    for _ in 0..5 {
        open.push(connect_from("127.0.0.4", to, None).await);
    }
    for conn in &mut open {
        assert_kept_alive_healthz(conn).await;
    }
}

/// The listeners serve HTTP/1 only: an HTTP/2 preface in clear text (h2c
/// "prior knowledge") is refused as a bad request, so HTTP/2's streams and
/// their limits are not reachable at all.
#[tokio::test]
async fn http2_in_clear_text_is_not_served() {
    let app = spawn_app(Backend::Memory, |_| {}).await;
    let mut conn = connect_from("127.0.0.1", socket_addr(&app.address), None).await;
    conn.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")
        .await
        .unwrap();
    let answer = read_to_close(&mut conn).await;
    assert_eq!(answer.status(), Some(400), "{answer:?}");
}

/// A streamed answer keeps its request in the application until its last
/// chunk: an admin whose CSV export is bigger than every buffer between the
/// two ends, and who reads none of it for twice the timeout, still gets all
/// of it.
#[tokio::test]
async fn a_csv_export_read_late_is_not_cut() {
    use tollgate::audit::{AuditDecision, AuditEvent};
    use tollgate::domain::{Action, Subject, SubjectKind};

    // About 700 bytes a row: 3.5 MB, over loopback's send buffer (its
    // 64 KiB segments let it grow past a megabyte).
    const ROWS: usize = 5000;
    let padding = "x".repeat(600);
    let db = crate::support::audit_db::TestDb::new(crate::support::audit_db::DbKind::Sqlite).await;
    let events: Vec<AuditEvent> = (0..ROWS)
        .map(|i| {
            let subject = Subject::new(SubjectKind::User, format!("late-reader-{i}"));
            let mut event = AuditEvent::new(
                Action::LoginAttempt,
                AuditDecision::Deny,
                "rate_limited",
                &subject,
            );
            event.user_agent = Some(padding.clone());
            event
        })
        .collect();
    let pool = db.connect().await;
    for batch in events.chunks(500) {
        pool.insert(batch, 7).await.unwrap();
    }
    let (url, spool) = (db.url.clone(), db.spool_dir());
    let app = crate::support::app::spawn_app_with_audit_db(Backend::Memory, move |s| {
        s.audit.database_url = tollgate::settings::SecretUrl::new(url);
        s.audit.spool_dir = spool.display().to_string();
        s.server.request_timeout = Duration::from_secs(1);
    })
    .await;
    let mut conn = connect_from("127.0.0.1", socket_addr(&app.address), Some(4096)).await;
    let request = format!(
        "GET /admin/api/events.csv HTTP/1.1\r\nHost: tollgate\r\n\
         Authorization: Bearer {}\r\nConnection: close\r\n\r\n",
        crate::support::app::ADMIN_TOKEN
    );
    conn.write_all(request.as_bytes()).await.unwrap();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let mut bytes = Vec::new();
    let read = tokio::time::timeout(BOUND, conn.read_to_end(&mut bytes))
        .await
        .expect("the export ends");
    let text = String::from_utf8_lossy(&bytes);
    assert!(read.is_ok(), "cut after {} bytes: {read:?}", bytes.len());
    assert!(text.starts_with("HTTP/1.1 200"), "{}", &text[..200]);
    let rows = text.matches("late-reader-").count();
    assert_eq!(rows, ROWS, "every row, {} bytes", bytes.len());
}

/// Stopping through `Application::handle` (as tests and embedders do)
/// takes the same road as SIGTERM: connections drained, then the audit
/// queue written (its flush interval is a minute away), and `Ok`.
#[tokio::test]
async fn stopping_through_the_handle_writes_the_audit_queue_and_returns_ok() {
    let db = crate::support::audit_db::TestDb::new(crate::support::audit_db::DbKind::Sqlite).await;
    let mut settings = crate::support::app::test_settings(Backend::Memory);
    settings.audit.database_url = tollgate::settings::SecretUrl::new(db.url.clone());
    settings.audit.spool_dir = db.spool_dir().display().to_string();
    settings.audit.flush_interval = Duration::from_secs(60);
    settings.sms.phone_limits = crate::support::app::limits(&[(1, 3_600_000)]);
    let app = tollgate::startup::Application::build(settings)
        .await
        .expect("the application builds");
    let address = format!("http://127.0.0.1:{}", app.port());
    let handle = app.handle();
    let run = tokio::spawn(app.run_until_stopped());
    let client = reqwest::Client::new();
    for expected in [200, 429] {
        let answer = client
            .post(format!("{address}/sms/send"))
            .bearer_auth(API_KEY)
            .header("x-request-id", "handle-stop")
            .json(&json!({ "phone": "+8613800138000" }))
            .send()
            .await
            .unwrap();
        assert_eq!(answer.status(), expected);
    }
    handle.stop(true).await;
    let stopped = tokio::time::timeout(BOUND, run)
        .await
        .expect("run_until_stopped returns")
        .expect("run_until_stopped does not panic");
    assert!(stopped.is_ok(), "{stopped:?}");
    let rows = db
        .connect()
        .await
        .page(&Default::default(), None, 10)
        .await
        .unwrap();
    let ids: Vec<_> = rows.iter().map(|r| r.request_id.as_deref()).collect();
    assert_eq!(ids, [Some("handle-stop")]);
}

/// The new `[server]` keys are checked at load, each error naming its key.
#[test]
fn bad_timeouts_and_caps_are_refused_naming_their_key() {
    let cases = [
        (
            "request_timeout = \"0s\"",
            "invalid setting `server.request_timeout`: must be at least 1ms",
        ),
        (
            "shutdown_timeout = \"2h\"",
            "invalid setting `server.shutdown_timeout`: must be at most 1h",
        ),
        (
            "max_connections = 0",
            "invalid setting `server.max_connections`: must be positive",
        ),
        (
            "admin_max_connections = 0",
            "invalid setting `server.admin_max_connections`: must be positive",
        ),
        (
            "admin_max_connections_per_ip = 0",
            "invalid setting `server.admin_max_connections_per_ip`: must be positive",
        ),
        (
            "workers = 0",
            "invalid setting `server.workers`: must be positive",
        ),
        (
            "workers = 513",
            "invalid setting `server.workers`: must be at most 512",
        ),
        (
            "workers = -1",
            "invalid setting `server.workers`: invalid value signed int `-1`, expected u32 (from TOML file)",
        ),
        (
            "max_connections = 10\nmax_connections_per_ip = 11",
            "invalid setting `server.max_connections_per_ip`: must not exceed \
             server.max_connections (10)",
        ),
    ];
    for (lines, expected) in cases {
        let error = crate::support::app::config_error(&format!("[server]\n{lines}\n"));
        assert_eq!(error, expected, "{lines}");
    }
    let loaded = crate::support::app::load_config(
        "[server]\nrequest_timeout = \"1500ms\"\nmax_connections_per_ip = 3\n",
    )
    .unwrap();
    assert_eq!(
        (
            loaded.server.request_timeout,
            loaded.server.shutdown_timeout,
            loaded.server.max_connections,
            loaded.server.max_connections_per_ip,
        ),
        (
            Duration::from_millis(1500),
            Duration::from_secs(10),
            None,
            Some(3)
        )
    );
}

/// Every duration is at most a century, the error naming its key, whether
/// a setting of its own or a limit's window.
#[test]
fn a_duration_over_a_century_is_refused_naming_its_key() {
    for (toml, key) in [
        ("[login]\nlock_duration = \"36501d\"", "login.lock_duration"),
        (
            "[sms]\nphone_limits = [{ limit = 1, window = \"99999999999999d\" }]",
            "sms.phone_limits[0].window",
        ),
    ] {
        let error = crate::support::app::config_error(toml);
        assert!(
            error.starts_with(&format!("invalid setting `{key}`: must be at most 36500d")),
            "{toml}: {error}"
        );
    }
    assert_eq!(
        crate::support::app::config_error("[login]\nlock_max_duration = \"36500d\""),
        ""
    );
}
