//! The real binary under a low `RLIMIT_NOFILE` (set by `prlimit`): slow
//! clients, from one address or many, cannot take the descriptors the other
//! listener needs; the limit is raised and the caps derived from it; and
//! SIGTERM with slow clients hanging stops within `server.shutdown_timeout`
//! with the audit queue written (docs/connections.md).

use std::time::Duration;

use serde_json::{json, Value};
use tokio::io::AsyncWriteExt;
use tollgate::connections::ConnectionPlan;
use tollgate::settings::Settings;

use crate::connections::{
    read_to_close, slow_post_head, socket_addr, trickle, try_connect_from, Raw,
};
use crate::support::process::{config_file, Tollgate};

const BODY: &str = r#"{"phone":"+8613800138000"}"#;

/// The fields of the `connection caps` line tollgate logs at start-up.
fn logged_caps(server: &Tollgate) -> Value {
    let log = server.log.lock();
    let line = log
        .iter()
        .find(|l| l.contains("\"connection caps\""))
        .unwrap_or_else(|| panic!("no `connection caps` line: {log:?}"));
    serde_json::from_str(line).unwrap()
}

fn cpus() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// A client on `from` whose POST head is in and whose body trickles: its
/// answer once the server closes.
fn slow_client(from: &'static str, to: std::net::SocketAddr) -> tokio::task::JoinHandle<Raw> {
    tokio::spawn(async move {
        let Ok(stream) = try_connect_from(from, to, None).await else {
            return Raw { bytes: Vec::new() };
        };
        let (mut read, mut write) = stream.into_split();
        let _ = write
            .write_all(slow_post_head("/sms/send", BODY).as_bytes())
            .await;
        let trickler = trickle(write, BODY.as_bytes().to_vec());
        let answer = read_to_close(&mut read).await;
        trickler.abort();
        answer
    })
}

async fn healthz_from(client: &reqwest::Client, address: &str) -> u16 {
    match client.get(format!("{address}/healthz")).send().await {
        Ok(response) => response.status().as_u16(),
        Err(e) => panic!("/healthz on {address}: {e}"),
    }
}

fn client_from(local: &str) -> reqwest::Client {
    reqwest::Client::builder()
        .local_address(Some(local.parse().unwrap()))
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap()
}

/// One series' value in Prometheus text (0 when absent).
async fn metric(admin: &str, series: &str) -> f64 {
    let text = reqwest::get(format!("{admin}/metrics"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    text.lines()
        .find(|l| l.starts_with(series) && l[series.len()..].starts_with(' '))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0.0)
}

/// Wait (polling, at most `bound`) until `done`.
async fn until<F, Fut>(what: &str, bound: Duration, mut done: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + bound;
    while !done().await {
        assert!(tokio::time::Instant::now() < deadline, "never: {what}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The attack of the issue, under a 256-descriptor limit: 240 connections
/// from one address trickling a body. One address gets its cap, the rest
/// are closed at accept; `/healthz` answers on the public port from another
/// address and on the admin port; the held ones get 408 at the timeout.
/// Then many addresses, each under its cap, fill the public listener: it
/// holds exactly its cap (the rest wait in the backlog), the admin listener
/// still answers, and no accept ever fails for want of a descriptor.
#[tokio::test]
async fn under_256_descriptors_slow_clients_leave_both_listeners_answering() {
    let dir = tempfile::tempdir().unwrap();
    let config = config_file(
        dir.path(),
        "admin_bind = \"127.0.0.1:0\"\nrequest_timeout = \"3s\"",
        "",
    );
    let server = Tollgate::start_with_nofile(&config, 256, 256).await;
    let admin = server.admin_address.clone().expect("an admin listener");
    let plan =
        ConnectionPlan::derive(&Settings::load(Some(&config)).unwrap(), 256, cpus()).unwrap();
    let caps = logged_caps(&server);
    assert_eq!(
        (
            &caps["nofile_soft"],
            &caps["max_connections"],
            &caps["admin_max_connections"],
            &caps["max_connections_per_ip"],
        ),
        (
            &json!(256),
            &json!(plan.public.total()),
            &json!(plan.admin.unwrap().total()),
            &json!(plan.per_ip),
        ),
        "{caps}"
    );
    let per_ip = plan.per_ip as usize;
    let public = socket_addr(&server.address);

    // 1. One address, 240 slow bodies.
    let flood: Vec<_> = (0..240).map(|_| slow_client("127.0.0.1", public)).collect();
    let other = client_from("127.0.0.2");
    assert_eq!(healthz_from(&other, &server.address).await, 200);
    assert_eq!(healthz_from(&other, &admin).await, 200);
    let mut answers = Vec::new();
    for client in flood {
        answers.push(client.await.unwrap());
    }
    let timed_out = answers
        .iter()
        .filter(|a| a.status() == Some(408) && a.json()["error"] == "request_timeout")
        .count();
    let unanswered = answers.iter().filter(|a| a.bytes.is_empty()).count();
    assert_eq!((timed_out, unanswered), (per_ip, 240 - per_ip));
    let refused = "tollgate_connections_refused_total{listener=\"public\",reason=\"per_ip\"}";
    assert_eq!(metric(&admin, refused).await, (240 - per_ip) as f64);

    // 2. Enough addresses, each at its cap, to fill the public listener.
    const ADDRESSES: [&str; 12] = [
        "127.0.1.1",
        "127.0.1.2",
        "127.0.1.3",
        "127.0.1.4",
        "127.0.1.5",
        "127.0.1.6",
        "127.0.1.7",
        "127.0.1.8",
        "127.0.1.9",
        "127.0.1.10",
        "127.0.1.11",
        "127.0.1.12",
    ];
    let needed = plan.public.total() as usize / per_ip + 2;
    assert!(needed <= ADDRESSES.len(), "{needed} addresses needed");
    let flood: Vec<_> = ADDRESSES[..needed]
        .iter()
        .flat_map(|from| (0..per_ip).map(move |_| slow_client(from, public)))
        .collect();
    let open = "tollgate_connections_open{listener=\"public\"}";
    until(
        "the public listener full",
        Duration::from_secs(10),
        || async { metric(&admin, open).await == plan.public.total() as f64 },
    )
    .await;
    assert_eq!(healthz_from(&client_from("127.0.0.2"), &admin).await, 200);
    assert_eq!(
        metric(&admin, open).await,
        plan.public.total() as f64,
        "never more than the cap"
    );
    for client in flood {
        let answer = client.await.unwrap();
        assert_eq!(answer.status(), Some(408), "{answer:?}");
    }
    assert_eq!(healthz_from(&other, &server.address).await, 200);
    let log = server.log.lock();
    let starved: Vec<&String> = log
        .iter()
        .filter(|l| l.contains("Too many open files") || l.contains("Error accepting"))
        .collect();
    assert!(starved.is_empty(), "{starved:#?}");
}

/// A soft limit below the hard one is raised to it, and both are logged.
#[tokio::test]
async fn the_soft_descriptor_limit_is_raised_to_the_hard_one() {
    let dir = tempfile::tempdir().unwrap();
    let config = config_file(dir.path(), "", "");
    let server = Tollgate::start_with_nofile(&config, 200, 300).await;
    let caps = logged_caps(&server);
    assert_eq!(
        (
            &caps["nofile_started"],
            &caps["nofile_soft"],
            &caps["nofile_hard"]
        ),
        (&json!(200), &json!(300), &json!(300)),
        "{caps}"
    );
}

/// An explicit cap the limit cannot hold stops start-up, naming its key.
#[tokio::test]
async fn a_cap_over_the_descriptor_limit_stops_start_up_naming_the_key() {
    let dir = tempfile::tempdir().unwrap();
    let config = config_file(dir.path(), "max_connections = 1000", "");
    let output = std::process::Command::new("prlimit")
        .arg("--nofile=256:256")
        .arg("--")
        .arg(env!("CARGO_BIN_EXE_tollgate"))
        .arg("--config")
        .arg(&config)
        .current_dir(dir.path())
        .output()
        .expect("prlimit runs the binary");
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains(
            "invalid setting `server.max_connections`: 1000 does not fit the descriptor limit \
             (RLIMIT_NOFILE 256"
        ),
        "{stderr}"
    );
}

/// SIGTERM while slow clients hang (their own timeout is a minute away):
/// the connections get `server.shutdown_timeout` (1 s), then the audit
/// queue is written, every answered refusal in it, and the process exits 0
/// well inside the unit's 30 s (the code before waited 30 s for the
/// connections alone).
#[tokio::test]
async fn sigterm_with_slow_clients_drains_for_the_shutdown_timeout_then_writes_the_audit() {
    let dir = tempfile::tempdir().unwrap();
    let config = config_file(
        dir.path(),
        "request_timeout = \"60s\"\nshutdown_timeout = \"1s\"",
        "[sms]\nphone_limits = [{ limit = 1, window = \"1h\" }]",
    );
    // Events wait in the queue until the shutdown writes them.
    let text = std::fs::read_to_string(&config).unwrap().replacen(
        "[audit]\n",
        "[audit]\nflush_interval = \"10s\"\n",
        1,
    );
    std::fs::write(&config, text).unwrap();
    let server = Tollgate::start(&config).await;
    let client = reqwest::Client::new();
    let sent = client
        .post(format!("{}/sms/send", server.address))
        .json(&json!({ "phone": "+8613800138000" }))
        .send()
        .await
        .unwrap();
    assert_eq!(sent.status(), 200);
    let ids: Vec<String> = (0..5).map(|i| format!("drained-{i}")).collect();
    for id in &ids {
        server.refused_send(&client, id).await;
    }
    let public = socket_addr(&server.address);
    let hanging: Vec<_> = (0..20).map(|_| slow_client("127.0.0.1", public)).collect();
    // Every slow client is in before the signal.
    let public_metrics = server.address.clone();
    until("20 slow clients open", Duration::from_secs(10), || async {
        metric(
            &public_metrics,
            "tollgate_connections_open{listener=\"public\"}",
        )
        .await
            >= 21.0
    })
    .await;

    let signalled = std::time::Instant::now();
    server.signal("-TERM");
    let mut server = server;
    let status = tokio::time::timeout(Duration::from_secs(20), server.child.wait())
        .await
        .expect("tollgate stops within 20 s")
        .unwrap();
    assert!(status.success(), "exit status {status:?}");
    // 1 s of drain, then the audit queue: far below the 10 s default a
    // shutdown ignoring the setting would take.
    let stopped_in = signalled.elapsed();
    assert!(stopped_in < Duration::from_secs(7), "{stopped_in:?}");
    for client in hanging {
        let answer = client.await.unwrap();
        assert_eq!(answer.status(), None, "closed unanswered: {answer:?}");
    }
    // The audit table as DESIGN.md §4 names it, read with plain SQL.
    let mut db = <sqlx::SqliteConnection as sqlx::Connection>::connect(&format!(
        "sqlite://{}/audit.db",
        dir.path().display()
    ))
    .await
    .unwrap();
    for id in &ids {
        let written: i64 =
            sqlx::query_scalar("SELECT count(*) FROM audit_events WHERE request_id = ?")
                .bind(id)
                .fetch_one(&mut db)
                .await
                .unwrap();
        assert_eq!(written, 1, "{id} written on shutdown");
    }
    let log = server.log.lock();
    let position = |text: &str| {
        log.iter()
            .position(|l| l.contains(text))
            .unwrap_or_else(|| panic!("no {text:?} in {log:#?}"))
    };
    assert!(
        position("stopping: finishing open connections")
            < position("connections closed; writing the audit queue")
    );
}
