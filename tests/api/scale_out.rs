//! Scale-out: three real `tollgate` processes behind one store give exactly the
//! limits one process gives, on a standalone Redis and on the three-node Redis
//! Cluster (scripts/redis-cluster.sh starts one on 127.0.0.1:17000-17002).
//!
//! The processes share nothing but the store: no memory, no audit database,
//! no spool. They still agree under concurrency because none of them decides
//! from its own state. Every decision is made by atomic Redis scripts that
//! count and decide in one step: one per request on a standalone Redis, one
//! per subject (hash slot) on a cluster. A
//! phone's window, a user's failures and lock, an IP's failures: each lives
//! in one slot and is changed by one script at a time. So 60 simultaneous
//! requests, sent round-robin to three processes, meet each limit exactly
//! once. Exactly 5 sends pass a 5/1h phone window. Exactly 10 failures are
//! recorded and exactly one of them locks the user. Exactly 5 failures pass
//! an IP block of 5.

use std::collections::BTreeMap;

use serde_json::{json, Value};

use crate::support::app::{redis_url, with_redis_prefix};
use crate::support::process::Tollgate;

const PROCESSES: usize = 3;
const CONCURRENT: usize = 60;
const API_KEY: &str = "scale-key-0123456789";

fn cluster_url() -> String {
    std::env::var("TOLLGATE_TEST_REDIS_CLUSTER_URL").unwrap_or_else(|_| {
        "redis-cluster://127.0.0.1:17000,127.0.0.1:17001,127.0.0.1:17002".into()
    })
}

/// One process's config: the shared store and key prefix, its own audit
/// database and spool directory.
fn write_config(dir: &std::path::Path, redis_url: &str, prefix: &str) -> std::path::PathBuf {
    let path = dir.join("tollgate.toml");
    let config = format!(
        r#"
[server]
bind = "127.0.0.1:0"
api_keys = ["{API_KEY}"]

[store]
backend = "redis"
redis_url = "{redis_url}"
key_prefix = "{prefix}"
# The machine is busy: the default 100ms could make a loaded call time out.
timeout = "2s"

[audit]
database_url = "sqlite://{audit}?mode=rwc"
spool_dir = "{spool}"

[sms]
code_secret = "scale-out-secret"
phone_limits = [{{ limit = 5, window = "1h" }}]
# Only the phone may decide. On a cluster each subject is hit on its own and a
# refused request takes its other hits back afterwards ("a race can refuse too
# much, never admit too much"), so 60 sends passing through one 7-digit prefix
# could in principle briefly fill a 50/1h prefix window and refuse a send the
# phone admitted. That is not what this file shows.
prefix_limits = [{{ limit = 1000, window = "1h" }}]

[login]
lock_after = 10
account_lock_after = 10
ip_block_after = 5
# Above the block, so that the IP's captcha tier never answers first.
ip_captcha_after = 100
network_captcha_after = 5
"#,
        audit = dir.join("audit.db").display(),
        spool = dir.join("spool").display(),
    );
    std::fs::write(&path, config).unwrap();
    path
}

/// One answer, and which process gave it.
#[derive(Debug)]
struct Answer {
    process: usize,
    status: u16,
    body: Value,
}

impl Answer {
    /// What the answer said, in a few words: `200 sent`, `429 rate_limited
    /// phone 5/1h`, `200 allow locked`, `200 deny ip_blocked`...
    fn label(&self) -> String {
        let b = &self.body;
        let text = |v: &Value| v.as_str().unwrap_or_default().to_string();
        let mut words = vec![self.status.to_string()];
        if let Some(status) = b["status"].as_str() {
            words.push(status.to_string());
        } else if b["error"].is_string() {
            words.push(text(&b["error"]));
            if b["rule"].is_string() {
                words.push(text(&b["rule"]));
            }
        } else if b["decision"].is_string() {
            words.push(text(&b["decision"]));
            if b["reason"].is_string() {
                words.push(text(&b["reason"]));
            }
            if b["locked"] == true {
                words.push("locked".into());
            }
        } else {
            words.push(b.to_string());
        }
        words.join(" ")
    }
}

/// Every answer, counted by label overall and per process.
fn summary(answers: &[Answer]) -> String {
    let mut overall = BTreeMap::<String, usize>::new();
    let mut per_process = BTreeMap::<(usize, String), usize>::new();
    for a in answers {
        *overall.entry(a.label()).or_default() += 1;
        *per_process.entry((a.process, a.label())).or_default() += 1;
    }
    let mut out = format!("answers: {overall:?}\nper process:");
    for ((process, label), n) in per_process {
        out.push_str(&format!("\n  process {process}: {label} x{n}"));
    }
    out
}

/// Three processes on one store, and a client that spreads requests over them.
struct Fleet {
    servers: Vec<Tollgate>,
    client: reqwest::Client,
    // Kept until the end: the processes' audit databases and spools.
    _dirs: Vec<tempfile::TempDir>,
}

impl Fleet {
    async fn start(redis_url: &str, prefix: &str) -> Self {
        let dirs: Vec<_> = (0..PROCESSES)
            .map(|_| tempfile::tempdir().unwrap())
            .collect();
        let configs: Vec<_> = dirs
            .iter()
            .map(|d| write_config(d.path(), redis_url, prefix))
            .collect();
        let servers = futures::future::join_all(configs.iter().map(|c| Tollgate::start(c))).await;
        let fleet = Self {
            servers,
            client: reqwest::Client::new(),
            _dirs: dirs,
        };
        for (i, server) in fleet.servers.iter().enumerate() {
            let ready = fleet
                .client
                .get(format!("{}/readyz", server.address))
                .send()
                .await
                .unwrap();
            let status = ready.status();
            assert_eq!(
                status,
                200,
                "process {i} reaches {redis_url}: {}",
                ready.text().await.unwrap_or_default()
            );
        }
        fleet
    }

    /// POST to process `n % 3`, as the API-key caller that may name the IP.
    /// `/login/check` of `body` asked of every process, in order.
    async fn check_everywhere(&self, body: Value) -> Vec<Answer> {
        let mut answers = Vec::with_capacity(PROCESSES);
        for n in 0..PROCESSES {
            answers.push(self.post(n, "/login/check", body.clone()).await);
        }
        answers
    }

    async fn post(&self, n: usize, path: &str, body: Value) -> Answer {
        let process = n % self.servers.len();
        let response = self
            .client
            .post(format!("{}{path}", self.servers[process].address))
            .bearer_auth(API_KEY)
            .json(&body)
            .send()
            .await
            .unwrap_or_else(|e| panic!("process {process} answers {path}: {e}"));
        let status = response.status().as_u16();
        let text = response.text().await.unwrap();
        let body = serde_json::from_str(&text).unwrap_or(Value::String(text));
        Answer {
            process,
            status,
            body,
        }
    }

    /// `CONCURRENT` requests at once, round-robin over the processes.
    async fn burst(&self, path: &str, body: impl Fn(usize) -> Value) -> Vec<Answer> {
        let requests = (0..CONCURRENT).map(|i| self.post(i, path, body(i)));
        futures::future::join_all(requests).await
    }
}

/// 1. One phone, 60 sends at once: the phone's 5/1h window alone decides.
async fn sends_for_one_phone_pass_the_phone_window_exactly(fleet: &Fleet) {
    let answers = fleet
        .burst("/sms/send", |i| {
            json!({
                "phone": "+8613800138000",
                "ip": format!("198.51.100.{i}"),
                "captcha_passed": true,
            })
        })
        .await;
    let sent = answers
        .iter()
        .filter(|a| a.status == 200 && a.body["status"] == "sent")
        .count();
    let limited = answers
        .iter()
        .filter(|a| {
            a.status == 429 && a.body["error"] == "rate_limited" && a.body["rule"] == "phone 5/1h"
        })
        .count();
    assert_eq!(
        (sent, limited),
        (5, CONCURRENT - 5),
        "60 sends for one phone over {PROCESSES} processes: 5 sent, 55 rate_limited by phone 5/1h\n{}",
        summary(&answers)
    );
}

/// 2. One user, 60 failures at once: 10 recorded, the 10th locks, once.
async fn failures_for_one_user_lock_it_once(fleet: &Fleet) {
    let answers = fleet
        .burst("/login/attempt", |i| {
            json!({
                "user": "alice",
                "success": false,
                "captcha_passed": true,
                "ip": format!("192.0.2.{i}"),
            })
        })
        .await;
    let allowed: Vec<&Answer> = answers
        .iter()
        .filter(|a| a.status == 200 && a.body["decision"] == "allow")
        .collect();
    let locking: Vec<&Answer> = allowed
        .iter()
        .copied()
        .filter(|a| a.body["locked"] == true)
        .collect();
    let denied = answers
        .iter()
        .filter(|a| {
            a.status == 200 && a.body["decision"] == "deny" && a.body["reason"] == "user_locked"
        })
        .count();
    let shown = summary(&answers);
    assert_eq!(
        (allowed.len(), locking.len(), denied),
        (10, 1, CONCURRENT - 10),
        "60 failures for one user over {PROCESSES} processes: 10 allow (one of them locked), 50 deny user_locked\n{shown}"
    );
    // Each recorded failure saw its own count: the script ran them one by one.
    let mut failures: Vec<u64> = allowed
        .iter()
        .map(|a| a.body["failures"].as_u64().unwrap_or(0))
        .collect();
    failures.sort_unstable();
    assert_eq!(
        failures,
        (1..=10).collect::<Vec<u64>>(),
        "the recorded failures counted 1 to 10\n{shown}"
    );
    assert_eq!(
        locking[0].body["failures"], 10,
        "the 10th failure locked: {}",
        locking[0].body
    );

    // Every process now sees the lock.
    let checks = fleet.check_everywhere(json!({ "user": "alice" })).await;
    for (n, check) in checks.iter().enumerate() {
        assert_eq!(
            (
                check.status,
                &check.body["decision"],
                &check.body["reason"],
                &check.body["locked"]
            ),
            (200, &json!("deny"), &json!("user_locked"), &json!(true)),
            "process {n} sees alice locked: {}",
            check.body
        );
    }
}

/// 3. One IP, 60 failures at once for 60 users: the IP's block of 5 decides.
async fn failures_from_one_ip_block_it_exactly(fleet: &Fleet) {
    let answers = fleet
        .burst("/login/attempt", |i| {
            json!({
                "user": format!("scale-user-{i}"),
                "success": false,
                "captcha_passed": true,
                "ip": "203.0.113.9",
            })
        })
        .await;
    let allowed = answers
        .iter()
        .filter(|a| a.status == 200 && a.body["decision"] == "allow")
        .count();
    let blocked = answers
        .iter()
        .filter(|a| {
            a.status == 200 && a.body["decision"] == "deny" && a.body["reason"] == "ip_blocked"
        })
        .count();
    assert_eq!(
        (allowed, blocked),
        (5, CONCURRENT - 5),
        "60 failures from one IP over {PROCESSES} processes: 5 allow, 55 deny ip_blocked\n{}",
        summary(&answers)
    );

    // Every process now refuses the IP, even for a user it has never seen.
    let checks = fleet
        .check_everywhere(json!({ "user": "scale-newcomer", "ip": "203.0.113.9" }))
        .await;
    for (n, check) in checks.iter().enumerate() {
        assert_eq!(
            (check.status, &check.body["decision"], &check.body["reason"]),
            (200, &json!("deny"), &json!("ip_blocked")),
            "process {n} sees 203.0.113.9 blocked: {}",
            check.body
        );
    }
}

/// 4. One IPv6 /48, 60 failures at once from 60 of its /64s for 60 users:
///    the network's captcha tier of 5 decides.
async fn failures_from_one_network_fill_its_tier_exactly(fleet: &Fleet) {
    let answers = fleet
        .burst("/login/attempt", |i| {
            json!({
                "user": format!("scale-net-user-{i}"),
                "success": false,
                "ip": format!("2001:db8:5ca1:{i:x}::1"),
            })
        })
        .await;
    let decided = |decision: &str| {
        answers
            .iter()
            .filter(|a| a.status == 200 && a.body["decision"] == decision)
            .count()
    };
    assert_eq!(
        (decided("allow"), decided("challenge")),
        (5, CONCURRENT - 5),
        "60 failures from one /48 over {PROCESSES} processes: 5 allow, 55 challenge\n{}",
        summary(&answers)
    );

    // Every process now asks a captcha of any /64 of the network.
    let checks = fleet
        .check_everywhere(json!({ "user": "scale-newcomer", "ip": "2001:db8:5ca1:ffff::7" }))
        .await;
    for (n, check) in checks.iter().enumerate() {
        assert_eq!(
            (check.status, &check.body["decision"]),
            (200, &json!("challenge")),
            "process {n} sees the network's tier full: {}",
            check.body
        );
    }
}

/// Start three processes on `redis_url` with a fresh key prefix, run the four
/// cases, and delete the prefix's keys whatever happened.
async fn three_processes_give_exact_limits(redis_url: &str) {
    let prefix = format!("tgscale{}", uuid::Uuid::new_v4().simple());
    // The fleet is dropped before the cleanup: its processes are killed.
    with_redis_prefix(redis_url, &prefix, async {
        let fleet = Fleet::start(redis_url, &prefix).await;
        sends_for_one_phone_pass_the_phone_window_exactly(&fleet).await;
        failures_for_one_user_lock_it_once(&fleet).await;
        failures_from_one_ip_block_it_exactly(&fleet).await;
        failures_from_one_network_fill_its_tier_exactly(&fleet).await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_processes_give_exact_limits_on_one_redis() {
    three_processes_give_exact_limits(&redis_url()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_processes_give_exact_limits_on_the_cluster() {
    three_processes_give_exact_limits(&cluster_url()).await;
}
