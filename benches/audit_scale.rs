//! The audit trail at attack scale, on PostgreSQL. Fills a scratch database
//! with N rows spread over the last 30 days the way the service writes them
//! (batches through `AuditDb::insert`, rollups in the same transaction), then
//! runs the release `tollgate` binary on it and prints plain tables:
//!
//! - the admin requests (newest page, filters, a day and its 51st page, the
//!   overview and `/admin/api/stats` per period): the first (cold) answer
//!   and the median of the next runs;
//! - a day's and an hour's CSV export: time, bytes and the service's peak
//!   RSS while it streams (flat in the rows exported, or not);
//! - the retention cut: the service restarted with `retention = 7d` on the
//!   30-day trail, with a login-failure flood (wrk) from the moment it
//!   listens; after it, `spooled` must be 0.
//!
//! Run it with the wrapper, which builds the service first:
//!
//! ```text
//! scripts/audit-bench.sh                    # 1 M rows
//! scripts/audit-bench.sh --rows 10000000    # the recorded run
//! ```
//!
//! or `cargo bench --bench audit_scale -- --rows N` once
//! `cargo build --release --bin tollgate` has built the service. Options
//! (`--help`): `--rows` (TOLLGATE_BENCH_ROWS), `--database-url`
//! (TOLLGATE_BENCH_DATABASE_URL, default
//! `postgres://postgres@127.0.0.1:5432/postgres`; a scratch database is
//! created beside it and dropped), `--tollgate` (TOLLGATE_BENCH_BIN, default
//! the `tollgate` built next to this bench), `--wrk` (TOLLGATE_BENCH_WRK).

use std::collections::HashMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use chrono::{DateTime, Days, NaiveDate, Utc};
use clap::Parser;
use sqlx::{Connection, PgConnection};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, ChildStderr, Command};
use tokio::sync::watch;
use tollgate::audit::db::partitions;
use tollgate::audit::{retention, rfc3339_ms, AuditDb, AuditDecision, AuditEvent};
use tollgate::domain::{Action, Subject, SubjectKind};

// ---------------------------------------------------------------------------
// Options
// ---------------------------------------------------------------------------

#[derive(Parser, Debug, Clone)]
#[command(about = "The audit trail at attack scale (PostgreSQL)")]
struct Args {
    /// Rows to fill, spread over the last 30 days.
    #[arg(long, env = "TOLLGATE_BENCH_ROWS", default_value_t = 1_000_000)]
    rows: u64,
    /// A database to create the scratch database beside (it is dropped at
    /// the end).
    #[arg(
        long,
        env = "TOLLGATE_BENCH_DATABASE_URL",
        default_value = "postgres://postgres@127.0.0.1:5432/postgres"
    )]
    database_url: String,
    /// The service's binary; default: the release `tollgate` next to this
    /// bench (`cargo build --release --bin tollgate`).
    #[arg(long, env = "TOLLGATE_BENCH_BIN")]
    tollgate: Option<PathBuf>,
    /// wrk, which floods the service during the cut.
    #[arg(long, env = "TOLLGATE_BENCH_WRK", default_value = "wrk")]
    wrk: PathBuf,
    /// Events per insert.
    #[arg(long, default_value_t = 5_000)]
    batch: u64,
    /// Inserts running at once.
    #[arg(long, default_value_t = 4)]
    inserters: usize,
    /// Timed runs of each admin request after its first (cold) one.
    #[arg(long, default_value_t = 5)]
    runs: usize,
    /// How long the flood lasts, from the moment the service listens.
    #[arg(long, default_value_t = 20)]
    flood_seconds: u64,
    /// wrk's connections.
    #[arg(long, default_value_t = 64)]
    flood_connections: u32,
    /// Leave the scratch database for a look afterwards (its name is printed).
    #[arg(long)]
    keep_database: bool,
    /// Passed by `cargo bench` to every bench; ignored.
    #[arg(long, hide = true)]
    bench: bool,
}

impl Args {
    /// The service's binary: as given, or the release build beside this
    /// bench (target/release/deps/audit_scale-… → target/release/tollgate).
    fn tollgate(&self) -> PathBuf {
        if let Some(path) = &self.tollgate {
            return path.clone();
        }
        let exe = std::env::current_exe().expect("the bench knows its own path");
        exe.parent()
            .and_then(Path::parent)
            .map(|release| release.join("tollgate"))
            .expect("the bench runs from target/release/deps")
    }
}

// ---------------------------------------------------------------------------
// The trail: what the rows look like
// ---------------------------------------------------------------------------

/// How far back the trail reaches.
const DAYS: u64 = 30;
const USERS: u64 = 1_000_000;
const ADDRESSES: u64 = 200_000;
const PHONES: u64 = 1_000_000;
/// `sms.prefix_digits`' default, as the service cuts phones for the rollups.
const PREFIX_DIGITS: u32 = 7;
/// What the restarted service keeps.
const RETENTION: Duration = Duration::from_secs(7 * 86_400);
const RETENTION_SETTING: &str = "7d";
const HOUR_MS: i64 = 3_600_000;
const USER_AGENTS: [&str; 4] = [
    "Mozilla/5.0 (Windows NT 10.0; Win64; x64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/131.0 Safari/537.36",
    "Mozilla/5.0 (iPhone; CPU iPhone OS 17_5 like Mac OS X) AppleWebKit/605.1.15 (KHTML, like Gecko) Mobile/15E148",
    "okhttp/4.12.0",
    "python-requests/2.32.3",
];

/// splitmix64: cheap, and seeded per batch so that two runs fill the same
/// trail whatever order the inserters take the batches in.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }

    /// One of `n`: a quarter of the draws from its first hundredth, since
    /// an attack keeps coming back to the same accounts and addresses (it
    /// gives the top lists something to rank).
    fn skewed(&mut self, n: u64) -> u64 {
        if self.below(4) == 0 {
            self.below(n / 100)
        } else {
            self.below(n)
        }
    }

    fn bytes<const N: usize>(&mut self) -> [u8; N] {
        let mut out = [0; N];
        for chunk in out.chunks_mut(8) {
            chunk.copy_from_slice(&self.next().to_le_bytes()[..chunk.len()]);
        }
        out
    }
}

/// What a row records.
#[derive(Clone, Copy)]
enum Shape {
    SendDeny,
    SendChallenge,
    VerifyDeny,
    LoginChallenge,
    LoginDeny,
    LoginLock,
    AddressLock,
    AddressDeny,
    /// An admin's unblock: rare, so that `decision=unblock` is a filter
    /// that matches almost nothing.
    Unblock,
}

/// Rows of each shape per 100,000.
const MIX: [(u64, Shape); 9] = [
    (30_000, Shape::SendDeny),
    (10_000, Shape::SendChallenge),
    (10_000, Shape::VerifyDeny),
    (20_000, Shape::LoginChallenge),
    (18_000, Shape::LoginDeny),
    (10_000, Shape::LoginLock),
    (499, Shape::AddressLock),
    (1_500, Shape::AddressDeny),
    (1, Shape::Unblock),
];

fn pick_shape(rng: &mut Rng) -> Shape {
    let mut draw = rng.below(100_000);
    for (weight, shape) in MIX {
        if draw < weight {
            return shape;
        }
        draw -= weight;
    }
    unreachable!("MIX's weights add up to 100,000")
}

fn user(rng: &mut Rng) -> Subject {
    Subject::new(SubjectKind::User, format!("user{:07}", rng.skewed(USERS)))
}

/// Distinct numbers over a thousand 7-digit prefixes (+86 130 00 … 139 99).
fn phone(rng: &mut Rng) -> Subject {
    let n = 13_000_000_000 + (rng.skewed(PHONES) * 9_973) % 1_000_000_000;
    Subject::new(SubjectKind::Phone, format!("+86{n}"))
}

/// 100.64.0.0/10 holds the 200,000 addresses.
fn address(rng: &mut Rng) -> String {
    let i = rng.skewed(ADDRESSES);
    format!("100.{}.{}.{}", 64 + (i >> 16), (i >> 8) & 255, i & 255)
}

/// The rule a row names: its name, limit and window.
struct Rule(&'static str, i64, i64);

/// A row at `at`, as the guard of its shape would have written it.
fn event(rng: &mut Rng, at: DateTime<Utc>) -> AuditEvent {
    use AuditDecision::{Challenge, Deny, Lock, Unblock};
    let ip = address(rng);
    let (action, decision, reason, subject, rule) = match pick_shape(rng) {
        Shape::SendDeny => (
            Action::SmsSend,
            Deny,
            "rate_limited",
            phone(rng),
            Some(Rule("phone 5/1h", 5, HOUR_MS)),
        ),
        Shape::SendChallenge => (
            Action::SmsSend,
            Challenge,
            "captcha_required",
            phone(rng),
            Some(Rule("phone 3/1h", 3, HOUR_MS)),
        ),
        Shape::VerifyDeny => (
            Action::SmsVerify,
            Deny,
            "verify_attempts_exhausted",
            phone(rng),
            None,
        ),
        Shape::LoginChallenge => (
            Action::LoginAttempt,
            Challenge,
            "captcha_required",
            user(rng),
            Some(Rule("user 3/15m", 3, HOUR_MS / 4)),
        ),
        Shape::LoginDeny => (
            Action::LoginAttempt,
            Deny,
            "user_locked",
            user(rng),
            Some(Rule("user 10/1h", 10, HOUR_MS)),
        ),
        Shape::LoginLock => (
            Action::LoginAttempt,
            Lock,
            "too_many_failures",
            user(rng),
            Some(Rule("user 10/1h", 10, HOUR_MS)),
        ),
        Shape::AddressLock => (
            Action::LoginAttempt,
            Lock,
            "too_many_failures",
            Subject::new(SubjectKind::Ip, ip.clone()),
            Some(Rule("ip 100/1h", 100, HOUR_MS)),
        ),
        Shape::AddressDeny => (
            Action::LoginAttempt,
            Deny,
            "ip_blocked",
            Subject::new(SubjectKind::Ip, ip.clone()),
            Some(Rule("ip 100/1h", 100, HOUR_MS)),
        ),
        Shape::Unblock => (Action::Admin, Unblock, "admin_unblock", user(rng), None),
    };
    let mut e = AuditEvent::new(action, decision, reason, &subject);
    let ms = u64::try_from(at.timestamp_millis()).expect("the trail is after 1970");
    e.id = uuid::Builder::from_unix_timestamp_millis(ms, &rng.bytes()).into_uuid();
    e.occurred_at = at;
    e.request_id = Some(
        uuid::Builder::from_random_bytes(rng.bytes())
            .into_uuid()
            .to_string(),
    );
    if decision == Unblock {
        e.actor = Some("token:1".into());
        e.ip = Some("127.0.0.1".into());
        e.user_agent = Some("curl/8.5.0".into());
        return e;
    }
    e.ip = Some(ip);
    e.user_agent = Some(USER_AGENTS[rng.below(USER_AGENTS.len() as u64) as usize].into());
    if let Some(Rule(name, limit, window_ms)) = rule {
        e.rule = Some(name.into());
        e.observed = Some(limit);
        e.limit = Some(limit);
        e.window_ms = Some(window_ms);
    }
    e.retry_after_ms = Some(match decision {
        // login.lock_duration's default.
        Lock => 900_000,
        _ => 1 + rng.below(e.window_ms.unwrap_or(HOUR_MS) as u64) as i64,
    });
    e
}

// ---------------------------------------------------------------------------
// Filling
// ---------------------------------------------------------------------------

/// The rows of the trail, cut into batches; batch `b` covers its share of
/// the 30 days, so that a batch spans a few minutes of the trail as the
/// service's writer batches do, and touches only that stretch's rollups.
#[derive(Clone, Copy)]
struct Plan {
    rows: u64,
    batch: u64,
    from: DateTime<Utc>,
    span_ms: u64,
}

impl Plan {
    fn batches(&self) -> u64 {
        self.rows.div_ceil(self.batch)
    }

    /// Batch `b`'s events, each at a random time of its stretch (not in
    /// order: nothing in the trail needs them to be).
    fn events(&self, b: u64) -> Vec<AuditEvent> {
        let first = b * self.batch;
        let end = (first + self.batch).min(self.rows);
        let start_ms = self.from.timestamp_millis() as u64 + first * self.span_ms / self.rows;
        let stretch_ms = ((end - first) * self.span_ms / self.rows).max(1);
        let mut rng = Rng(b);
        (first..end)
            .map(|_| {
                let ms = (start_ms + rng.below(stretch_ms)) as i64;
                let at = DateTime::from_timestamp_millis(ms).expect("a time within the trail");
                event(&mut rng, at)
            })
            .collect()
    }
}

struct Filled {
    rows: u64,
    elapsed: Duration,
}

/// Insert the plan's batches with `inserters` tasks taking the next batch
/// as they finish one.
async fn fill(db: &AuditDb, plan: Plan, inserters: usize) -> Filled {
    let next = Arc::new(AtomicU64::new(0));
    let written = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let tasks: Vec<_> = (0..inserters)
        .map(|_| {
            let (db, next, written) = (db.clone(), next.clone(), written.clone());
            tokio::spawn(async move {
                loop {
                    let b = next.fetch_add(1, Ordering::Relaxed);
                    if b >= plan.batches() {
                        break;
                    }
                    let events = plan.events(b);
                    let n = db
                        .insert(&events, PREFIX_DIGITS)
                        .await
                        .expect("the scratch database takes a batch");
                    let total = written.fetch_add(n, Ordering::Relaxed) + n;
                    report_progress(total - n, total, plan.rows, started);
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.expect("an inserter failed");
    }
    Filled {
        rows: written.load(Ordering::Relaxed),
        elapsed: started.elapsed(),
    }
}

/// A line on stderr at each tenth of the fill.
fn report_progress(before: u64, now: u64, rows: u64, started: Instant) {
    if before * 10 / rows != now * 10 / rows {
        let secs = started.elapsed().as_secs_f64();
        eprintln!(
            "  filled {now} of {rows} rows in {secs:.0} s ({:.0} rows/s)",
            now as f64 / secs
        );
    }
}

// ---------------------------------------------------------------------------
// The scratch database
// ---------------------------------------------------------------------------

#[derive(Clone)]
struct Scratch {
    admin_url: String,
    name: String,
    url: String,
}

impl Scratch {
    async fn create(admin_url: &str) -> Self {
        let mut admin = PgConnection::connect(admin_url)
            .await
            .expect("PostgreSQL answers at --database-url");
        let name = format!("tgscale_{}", uuid::Uuid::new_v4().simple());
        sqlx::query(&format!("CREATE DATABASE {name}"))
            .execute(&mut admin)
            .await
            .expect("the scratch database can be created");
        let url = match admin_url.rfind('/') {
            Some(i) => format!("{}/{name}", &admin_url[..i]),
            None => format!("{admin_url}/{name}"),
        };
        Scratch {
            admin_url: admin_url.to_string(),
            name,
            url,
        }
    }

    async fn connect(&self) -> PgConnection {
        PgConnection::connect(&self.url)
            .await
            .expect("the scratch database answers")
    }

    async fn drop_database(self) {
        let mut admin = PgConnection::connect(&self.admin_url)
            .await
            .expect("PostgreSQL answers at --database-url");
        sqlx::query(&format!("DROP DATABASE {} WITH (FORCE)", self.name))
            .execute(&mut admin)
            .await
            .expect("the scratch database can be dropped");
    }
}

async fn database_size(conn: &mut PgConnection) -> i64 {
    sqlx::query_scalar("SELECT pg_database_size(current_database())")
        .fetch_one(conn)
        .await
        .expect("pg_database_size answers")
}

/// Vacuum and analyse everything, as autovacuum would have over the 30
/// days the trail took to write: plans and index-only scans then see the
/// trail as a service running for a month would.
async fn settle(conn: &mut PgConnection) -> Duration {
    let started = Instant::now();
    sqlx::query("VACUUM (ANALYZE)")
        .execute(conn)
        .await
        .expect("VACUUM ANALYZE runs");
    started.elapsed()
}

/// The server's version and the settings the figures depend on most.
async fn server_settings(conn: &mut PgConnection) -> String {
    let (version, shared_buffers, work_mem, jit): (String, String, String, String) =
        sqlx::query_as(
            "SELECT current_setting('server_version'), current_setting('shared_buffers'), \
             current_setting('work_mem'), current_setting('jit')",
        )
        .fetch_one(conn)
        .await
        .expect("the server's settings can be read");
    format!("PostgreSQL {version}, shared_buffers {shared_buffers}, work_mem {work_mem}, jit {jit}")
}

/// The partitions of `audit_events` and their estimated rows, oldest first.
async fn partition_list(conn: &mut PgConnection) -> Vec<(String, f32)> {
    sqlx::query_as(
        "SELECT c.relname::text, c.reltuples FROM pg_inherits i \
         JOIN pg_class c ON c.oid = i.inhrelid \
         WHERE i.inhparent = 'audit_events'::regclass ORDER BY 1",
    )
    .fetch_all(conn)
    .await
    .expect("the partitions can be listed")
}

/// Subjects the filters look for: those of the newest user and IP rows.
struct Probe {
    user: String,
    ip: String,
    /// A whole day of the trail, kept by the cut (3 days back).
    day: NaiveDate,
}

async fn probe(conn: &mut PgConnection, now: DateTime<Utc>) -> Probe {
    let user = sqlx::query_scalar(
        "SELECT subject FROM audit_events WHERE subject_kind = 'user' \
         ORDER BY occurred_at DESC LIMIT 1",
    )
    .fetch_one(&mut *conn)
    .await
    .expect("the trail has user rows");
    let ip = sqlx::query_scalar(
        "SELECT ip FROM audit_events WHERE ip IS NOT NULL ORDER BY occurred_at DESC LIMIT 1",
    )
    .fetch_one(&mut *conn)
    .await
    .expect("the trail has rows with an address");
    let day = partitions::day(now) - Days::new(3);
    Probe { user, ip, day }
}

// ---------------------------------------------------------------------------
// The service
// ---------------------------------------------------------------------------

const ADMIN_TOKEN: &str = "audit-scale-bench-admin-token-0123456789";
const CUT_LINE: &str = "cut audit rows past audit.retention";

/// A free port on loopback (asked of the kernel, then let go).
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port on loopback")
}

/// A service's config file, the ports it names and where its log goes.
struct Config {
    path: PathBuf,
    public: u16,
    admin: u16,
    log: PathBuf,
}

/// A config for the scratch trail: the in-process store (no Redis), the
/// admin routes and `/metrics` on their own listener.
fn write_config(dir: &Path, database_url: &str, retention: &str) -> Config {
    let (public, admin) = (free_port(), free_port());
    let spool = dir.join("spool");
    let text = format!(
        r#"[server]
bind = "127.0.0.1:{public}"
admin_bind = "127.0.0.1:{admin}"
watch_config = false
admin_tokens = ["{ADMIN_TOKEN}"]

[store]
backend = "memory"

[audit]
database_url = "{database_url}"
spool_dir = "{}"
retention = "{retention}"
"#,
        spool.display()
    );
    let path = dir.join(format!("tollgate-{retention}.toml"));
    std::fs::write(&path, text).expect("the config can be written");
    Config {
        path,
        public,
        admin,
        log: dir.join(format!("tollgate-{retention}.log")),
    }
}

/// When the service logged its cut, and the line.
#[derive(Clone, Default)]
struct Marks {
    cut: Option<(Instant, String)>,
}

struct Service {
    child: Child,
    pid: u32,
    marks: watch::Receiver<Marks>,
    log: PathBuf,
}

impl Service {
    /// Start `tollgate serve` and wait until its admin listener answers.
    async fn start(bin: &Path, config: &Config) -> Self {
        let mut child = Command::new(bin)
            .args(["serve", "--config"])
            .arg(&config.path)
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {}: {e}", bin.display()));
        let pid = child.id().expect("a running child has a pid");
        let (marks_tx, marks) = watch::channel(Marks::default());
        let stderr = child.stderr.take().expect("stderr is piped");
        tokio::spawn(keep_log(stderr, config.log.clone(), marks_tx));
        let mut service = Service {
            child,
            pid,
            marks,
            log: config.log.clone(),
        };
        service.wait_listening(config.admin).await;
        service
    }

    /// Until `port` takes a connection; the service dying first is fatal.
    async fn wait_listening(&mut self, port: u16) {
        let deadline = Instant::now() + Duration::from_secs(60);
        while tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .is_err()
        {
            if let Ok(Some(status)) = self.child.try_wait() {
                panic!("tollgate exited ({status}); see {}", self.log.display());
            }
            assert!(
                Instant::now() < deadline,
                "tollgate did not listen on {port} within 60 s"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    /// SIGTERM, and wait for the drain and exit.
    async fn stop(mut self) {
        let pid = libc::pid_t::try_from(self.pid).expect("a pid fits pid_t");
        // SAFETY: signals our own child, which has not been reaped yet.
        unsafe { libc::kill(pid, libc::SIGTERM) };
        match tokio::time::timeout(Duration::from_secs(60), self.child.wait()).await {
            Ok(status) => {
                status.expect("tollgate can be waited for");
            }
            Err(_) => panic!("tollgate did not stop within 60 s of SIGTERM"),
        }
    }

    async fn wait_for_cut(&mut self, within: Duration) -> (Instant, String) {
        let marks = tokio::time::timeout(within, self.marks.wait_for(|m| m.cut.is_some()))
            .await
            .unwrap_or_else(|_| {
                panic!(
                    "no {CUT_LINE:?} within {within:?}; see {}",
                    self.log.display()
                )
            })
            .expect("the log reader runs");
        marks.cut.clone().expect("waited for it")
    }

    /// (VmRSS, VmHWM) in KiB.
    fn rss(&self) -> (u64, u64) {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.pid))
            .expect("the service's /proc status is readable");
        let field = |name: &str| {
            status
                .lines()
                .find_map(|l| {
                    l.strip_prefix(name)?
                        .trim()
                        .strip_suffix("kB")?
                        .trim()
                        .parse()
                        .ok()
                })
                .unwrap_or_else(|| panic!("{name} in /proc/{}/status", self.pid))
        };
        (field("VmRSS:"), field("VmHWM:"))
    }

    /// Start VmHWM (the peak RSS) again from the current RSS.
    fn reset_peak(&self) {
        std::fs::write(format!("/proc/{}/clear_refs", self.pid), "5")
            .expect("the service's peak RSS can be reset (/proc/PID/clear_refs)");
    }
}

/// Copy the service's log to a file, noting when the cut's line came.
async fn keep_log(stderr: ChildStderr, path: PathBuf, marks: watch::Sender<Marks>) {
    let mut file = std::fs::File::create(&path).expect("the service log can be written");
    let mut lines = BufReader::new(stderr).lines();
    while let Ok(Some(line)) = lines.next_line().await {
        if line.contains(CUT_LINE) {
            let at = Instant::now();
            marks.send_modify(|m| m.cut = Some((at, line.clone())));
        }
        let _ = writeln!(file, "{line}");
    }
}

/// The sum of a metric's samples whose labels include every pair given.
fn metric(text: &str, name: &str, labels: &[(&str, &str)]) -> f64 {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| l.rsplit_once(' '))
        .filter(|(series, _)| *series == name || series.starts_with(&format!("{name}{{")))
        .filter(|(series, _)| {
            labels
                .iter()
                .all(|(k, v)| series.contains(&format!("{k}=\"{v}\"")))
        })
        .filter_map(|(_, value)| value.parse::<f64>().ok())
        // Not `sum()`, whose empty sum is -0 and prints as such.
        .fold(0.0, |total, value| total + value)
}

// ---------------------------------------------------------------------------
// Admin requests
// ---------------------------------------------------------------------------

struct AdminClient {
    http: reqwest::Client,
    base: String,
}

/// An answer, read to its end.
struct Answer {
    status: u16,
    bytes: u64,
    lines: u64,
    /// Kept only when asked for (not for exports).
    body: Vec<u8>,
}

impl Answer {
    fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body).expect("the admin API answers JSON")
    }
}

impl AdminClient {
    fn new(admin_port: u16) -> Self {
        let mut headers = reqwest::header::HeaderMap::new();
        let bearer = format!("Bearer {ADMIN_TOKEN}")
            .parse()
            .expect("a valid header");
        headers.insert(reqwest::header::AUTHORIZATION, bearer);
        let http = reqwest::Client::builder()
            .default_headers(headers)
            .timeout(Duration::from_secs(600))
            .build()
            .expect("an HTTP client");
        AdminClient {
            http,
            base: format!("http://127.0.0.1:{admin_port}"),
        }
    }

    fn url(&self, path: &str, query: &[(&str, String)]) -> reqwest::Url {
        reqwest::Url::parse_with_params(&format!("{}{path}", self.base), query)
            .expect("a valid admin URL")
    }

    /// GET `url` and read the whole answer; how long that took.
    async fn get(&self, url: &reqwest::Url, keep_body: bool) -> (Duration, Answer) {
        let started = Instant::now();
        let mut response = self
            .http
            .get(url.clone())
            .send()
            .await
            .unwrap_or_else(|e| panic!("GET {url}: {e}"));
        let mut answer = Answer {
            status: response.status().as_u16(),
            bytes: 0,
            lines: 0,
            body: Vec::new(),
        };
        while let Some(chunk) = response
            .chunk()
            .await
            .unwrap_or_else(|e| panic!("reading GET {url}: {e}"))
        {
            answer.bytes += chunk.len() as u64;
            answer.lines += chunk.iter().filter(|b| **b == b'\n').count() as u64;
            if keep_body {
                answer.body.extend_from_slice(&chunk);
            }
        }
        (started.elapsed(), answer)
    }

    async fn metrics(&self) -> String {
        let (_, answer) = self.get(&self.url("/metrics", &[]), true).await;
        String::from_utf8(answer.body).expect("metrics are text")
    }
}

/// One request's figures: the first answer, and the median of the runs
/// after it.
struct Timed {
    name: String,
    first: Duration,
    median: Duration,
    status: u16,
    answer: String,
}

fn median(mut times: Vec<Duration>) -> Duration {
    times.sort();
    times[times.len() / 2]
}

/// What a JSON page or an HTML page holds, for the table.
fn describe(answer: &Answer) -> String {
    if answer.status != 200 {
        return String::from_utf8_lossy(&answer.body)
            .chars()
            .take(60)
            .collect();
    }
    match serde_json::from_slice::<serde_json::Value>(&answer.body) {
        Ok(json) => match json.get("events").and_then(|e| e.as_array()) {
            Some(events) => format!("{} events", events.len()),
            None => format!("{} bytes JSON", answer.bytes),
        },
        Err(_) => format!("{} bytes HTML", answer.bytes),
    }
}

async fn time(admin: &AdminClient, name: &str, url: &reqwest::Url, runs: usize) -> Timed {
    let (first, answer) = admin.get(url, true).await;
    let mut times = Vec::with_capacity(runs);
    for _ in 0..runs {
        times.push(admin.get(url, true).await.0);
    }
    Timed {
        name: name.to_string(),
        first,
        median: median(times),
        status: answer.status,
        answer: describe(&answer),
    }
}

fn day_bounds(day: NaiveDate) -> (String, String) {
    let start = day.and_time(chrono::NaiveTime::MIN).and_utc();
    let end = start + chrono::Duration::days(1) - chrono::Duration::milliseconds(1);
    (rfc3339_ms::format(&start), rfc3339_ms::format(&end))
}

fn hour_bounds(day: NaiveDate) -> (String, String) {
    let start = day.and_time(chrono::NaiveTime::MIN).and_utc() + chrono::Duration::hours(12);
    let end = start + chrono::Duration::hours(1) - chrono::Duration::milliseconds(1);
    (rfc3339_ms::format(&start), rfc3339_ms::format(&end))
}

/// Every timed admin request but the exports.
async fn time_requests(admin: &AdminClient, probe: &Probe, runs: usize) -> Vec<Timed> {
    let events = |query: &[(&str, String)]| admin.url("/admin/api/events", query);
    let (since, until) = day_bounds(probe.day);
    let day = [("since", since), ("until", until)];
    let mut timed = vec![
        time(admin, "events: newest page", &events(&[]), runs).await,
        time(
            admin,
            "events: user",
            &events(&[
                ("subject_kind", "user".into()),
                ("subject", probe.user.clone()),
            ]),
            runs,
        )
        .await,
        time(
            admin,
            "events: ip",
            &events(&[("ip", probe.ip.clone())]),
            runs,
        )
        .await,
        time(
            admin,
            "events: decision=lock",
            &events(&[("decision", "lock".into())]),
            runs,
        )
        .await,
        time(
            admin,
            "events: decision=unblock (rare)",
            &events(&[("decision", "unblock".into())]),
            runs,
        )
        .await,
        time(admin, "events: one day, first page", &events(&day), runs).await,
    ];
    timed.push(time_page_51(admin, &day, runs).await);
    for period in ["1h", "24h", "7d"] {
        let url = admin.url("/admin/overview", &[("period", period.into())]);
        timed.push(time(admin, &format!("overview {period} (HTML)"), &url, runs).await);
    }
    for period in ["1h", "24h", "7d"] {
        let url = admin.url("/admin/api/stats", &[("period", period.into())]);
        timed.push(time(admin, &format!("stats {period}"), &url, runs).await);
    }
    timed
}

/// Follow a day's cursors through 50 pages, then time the 51st (or the
/// last, on a trail too small for 51 pages a day).
async fn time_page_51(admin: &AdminClient, day: &[(&str, String)], runs: usize) -> Timed {
    let url = |cursor: Option<&String>| {
        let mut query = day.to_vec();
        query.extend(cursor.map(|c| ("cursor", c.clone())));
        admin.url("/admin/api/events", &query)
    };
    let started = Instant::now();
    let mut cursor: Option<String> = None;
    let mut page = 1;
    while page < 51 {
        let (_, answer) = admin.get(&url(cursor.as_ref()), true).await;
        assert_eq!(answer.status, 200, "page {page} of the day");
        match answer.json()["next_cursor"].as_str() {
            Some(next) => cursor = Some(next.to_string()),
            None => break,
        }
        page += 1;
    }
    let followed = started.elapsed();
    let name = format!("events: one day, page {page}");
    let mut timed = time(admin, &name, &url(cursor.as_ref()), runs).await;
    timed.answer = format!(
        "{} ({} pages before: {:.0} ms)",
        timed.answer,
        page - 1,
        ms(followed)
    );
    timed
}

// ---------------------------------------------------------------------------
// CSV exports and memory
// ---------------------------------------------------------------------------

struct Export {
    name: &'static str,
    rows: u64,
    bytes: u64,
    first: Duration,
    median: Duration,
    rss_before_kib: u64,
    /// The highest peak RSS over the runs, each measured from a reset.
    peak_kib: u64,
}

async fn time_export(
    service: &Service,
    admin: &AdminClient,
    name: &'static str,
    (since, until): (String, String),
    runs: usize,
) -> Export {
    let url = admin.url(
        "/admin/api/events.csv",
        &[("since", since), ("until", until)],
    );
    let rss_before_kib = service.rss().0;
    let mut peak_kib = 0;
    let mut times = Vec::new();
    let mut last = None;
    for _ in 0..=runs {
        service.reset_peak();
        let (elapsed, answer) = admin.get(&url, false).await;
        assert_eq!(answer.status, 200, "the {name}'s CSV");
        peak_kib = peak_kib.max(service.rss().1);
        times.push(elapsed);
        last = Some(answer);
    }
    let answer = last.expect("at least one run");
    let first = times.remove(0);
    Export {
        name,
        rows: answer.lines.saturating_sub(1),
        bytes: answer.bytes,
        first,
        median: median(times),
        rss_before_kib,
        peak_kib,
    }
}

// ---------------------------------------------------------------------------
// The cut under a flood
// ---------------------------------------------------------------------------

/// Login failures for distinct users from 256 addresses: past
/// `login.ip_captcha_after` an attempt is challenged and past
/// `login.ip_block_after` refused, each refusal an audit row.
const FLOOD_LUA: &str = r#"
local counter = 0
local threads = {}

function setup(thread)
  thread:set("id", #threads)
  table.insert(threads, thread)
end

function request()
  counter = counter + 1
  local body = string.format('{"user":"flood%d_%d","ip":"198.18.0.%d","success":false}',
    id, counter, counter % 256)
  return wrk.format("POST", "/login/attempt", {["Content-Type"] = "application/json"}, body)
end

function done(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    "FLOOD requests=%d duration_s=%.3f non2xx=%d socket_errors=%d timeouts=%d p50_ms=%.2f p99_ms=%.2f max_ms=%.2f\n",
    summary.requests, summary.duration / 1e6, e.status, e.connect + e.read + e.write, e.timeout,
    latency:percentile(50) / 1000, latency:percentile(99) / 1000, latency.max / 1000))
end
"#;

/// `key=value` pairs of wrk's FLOOD line.
fn flood_fields(output: &str) -> HashMap<String, f64> {
    let line = output
        .lines()
        .find(|l| l.starts_with("FLOOD "))
        .unwrap_or_else(|| panic!("wrk printed no FLOOD line:\n{output}"));
    line.split_whitespace()
        .filter_map(|kv| kv.split_once('='))
        .filter_map(|(k, v)| Some((k.to_string(), v.parse().ok()?)))
        .collect()
}

struct Cut {
    partitions_before: usize,
    /// Partitions wholly before the cut's day that held rows.
    filled_before_cutoff: usize,
    dropped: usize,
    rows_cut: f64,
    cut_seconds: f64,
    start_to_cut_done: Duration,
    /// From the start until the flood's first request was sent.
    start_to_flood: Duration,
    flood: HashMap<String, f64>,
    refusals: f64,
    queued: f64,
    written: f64,
    spooled: f64,
    dropped_events: f64,
    partitions_after: usize,
}

/// The same flood against the running service with nothing being cut: what
/// the writer keeps up with on its own, to read the flood during the cut
/// against. Prints one line.
async fn flood_without_cut(args: &Args, config: &Config, dir: &Path) {
    let script = dir.join("flood-alone.lua");
    std::fs::write(&script, FLOOD_LUA).expect("the flood script can be written");
    let admin = AdminClient::new(config.admin);
    let outcome = |metrics: &str, outcome| {
        metric(
            metrics,
            "tollgate_audit_events_total",
            &[("outcome", outcome)],
        )
    };
    let before = admin.metrics().await;
    let flood = Command::new(&args.wrk)
        .args(["-t1", &format!("-c{}", args.flood_connections)])
        .args([
            &format!("-d{}s", args.flood_seconds),
            "--timeout",
            "5s",
            "-s",
        ])
        .arg(&script)
        .arg(format!("http://127.0.0.1:{}/login/attempt", config.public))
        .stdin(Stdio::null())
        .stderr(Stdio::inherit())
        .output()
        .await
        .expect("wrk runs");
    let flood = flood_fields(&String::from_utf8_lossy(&flood.stdout));
    tokio::time::sleep(Duration::from_secs(2)).await;
    let after = admin.metrics().await;
    let rate = flood.get("requests").copied().unwrap_or(0.0)
        / flood.get("duration_s").copied().unwrap_or(1.0);
    println!(
        "flood without a cut (retention 90d, same wrk): {rate:.0} req/s, written {:.0}, spooled {:.0}, p99 {:.2} ms",
        outcome(&after, "written") - outcome(&before, "written"),
        outcome(&after, "spooled") - outcome(&before, "spooled"),
        flood.get("p99_ms").copied().unwrap_or(0.0),
    );
}

/// Restart with `retention = 7d` and flood it from the moment it listens;
/// the cut runs at start-up.
async fn cut_under_flood(args: &Args, scratch: &Scratch, dir: &Path) -> Cut {
    let mut conn = scratch.connect().await;
    let before = partition_list(&mut conn).await;
    let cutoff = partitions::name(partitions::day(retention::cutoff(Utc::now(), RETENTION)));
    let filled_before_cutoff = before
        .iter()
        .filter(|(name, rows)| *name < cutoff && *rows > 0.0)
        .count();
    let config = write_config(dir, &scratch.url, RETENTION_SETTING);
    let script = dir.join("flood.lua");
    std::fs::write(&script, FLOOD_LUA).expect("the flood script can be written");

    let started = Instant::now();
    let mut service = Service::start(&args.tollgate(), &config).await;
    service.wait_listening(config.public).await;
    let start_to_flood = started.elapsed();
    let flood = Command::new(&args.wrk)
        .args(["-t1", &format!("-c{}", args.flood_connections)])
        .args([
            &format!("-d{}s", args.flood_seconds),
            "--timeout",
            "5s",
            "-s",
        ])
        .arg(&script)
        .arg(format!("http://127.0.0.1:{}/login/attempt", config.public))
        .stdin(Stdio::null())
        .stderr(Stdio::inherit())
        .output();
    let flood = tokio::spawn(flood);
    let (cut_at, line) = service.wait_for_cut(Duration::from_secs(600)).await;
    let flood = flood.await.expect("the flood task").unwrap_or_else(|e| {
        panic!(
            "cannot run {}: {e} (apt-get install wrk)",
            args.wrk.display()
        )
    });
    let flood = flood_fields(&String::from_utf8_lossy(&flood.stdout));
    // The writer flushes every audit.flush_interval (200 ms): let it catch up.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let metrics = AdminClient::new(config.admin).metrics().await;
    service.stop().await;
    let events = |outcome| {
        metric(
            &metrics,
            "tollgate_audit_events_total",
            &[("outcome", outcome)],
        )
    };
    let refused = |decision| {
        metric(
            &metrics,
            "tollgate_requests_total",
            &[("route", "login_attempt"), ("decision", decision)],
        )
    };
    Cut {
        partitions_before: before.len(),
        filled_before_cutoff,
        dropped: line.matches("audit_events_p").count(),
        rows_cut: metric(&metrics, "tollgate_audit_retention_rows_total", &[]),
        cut_seconds: metric(&metrics, "tollgate_audit_retention_seconds", &[]),
        start_to_cut_done: cut_at - started,
        start_to_flood,
        flood,
        refusals: refused("deny") + refused("challenge"),
        queued: events("queued"),
        written: events("written"),
        spooled: events("spooled"),
        dropped_events: events("dropped") + events("unjournaled"),
        partitions_after: partition_list(&mut conn).await.len(),
    }
}

// ---------------------------------------------------------------------------
// The run and its tables
// ---------------------------------------------------------------------------

struct Report {
    server: String,
    filled: Filled,
    settle: Duration,
    size_filled: i64,
    probe: Probe,
    requests: Vec<Timed>,
    exports: Vec<Export>,
    cut: Cut,
    size_cut: i64,
}

async fn run(args: &Args, scratch: &Scratch) -> Report {
    let db = AuditDb::connect_lazy(&scratch.url).expect("a PostgreSQL URL");
    db.migrate().await.expect("the migrations apply");
    let now = Utc::now();
    let from = now - chrono::Duration::days(DAYS as i64);
    // What the service's retention task does at start-up for its period.
    db.prepare_partitions(partitions::day(from), now)
        .await
        .expect("the trail's partitions can be made");
    let plan = Plan {
        rows: args.rows,
        batch: args.batch,
        from,
        span_ms: (now - from).num_milliseconds() as u64,
    };
    eprintln!("filling {} rows into {} ...", args.rows, scratch.name);
    let filled = fill(&db, plan, args.inserters).await;
    let mut conn = scratch.connect().await;
    let server = server_settings(&mut conn).await;
    eprintln!("VACUUM ANALYZE ...");
    let settle = settle(&mut conn).await;
    let size_filled = database_size(&mut conn).await;
    let probe = probe(&mut conn, now).await;

    let dir = tempfile::tempdir().expect("a temporary directory");
    let config = write_config(dir.path(), &scratch.url, "90d");
    let service = Service::start(&args.tollgate(), &config).await;
    let admin = AdminClient::new(config.admin);
    eprintln!("timing admin requests ...");
    let requests = time_requests(&admin, &probe, args.runs).await;
    eprintln!("timing CSV exports ...");
    let mut exports = Vec::new();
    for (name, bounds) in [
        ("hour", hour_bounds(probe.day)),
        ("day", day_bounds(probe.day)),
    ] {
        exports.push(time_export(&service, &admin, name, bounds, args.runs).await);
    }
    eprintln!("flooding without a cut ...");
    flood_without_cut(args, &config, dir.path()).await;
    service.stop().await;

    eprintln!("restarting with retention = {RETENTION_SETTING} under a flood ...");
    let cut = cut_under_flood(args, scratch, dir.path()).await;
    let size_cut = database_size(&mut conn).await;
    Report {
        server,
        filled,
        settle,
        size_filled,
        probe,
        requests,
        exports,
        cut,
        size_cut,
    }
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

fn gib(bytes: i64) -> f64 {
    bytes as f64 / (1u64 << 30) as f64
}

fn mib(kib: u64) -> f64 {
    kib as f64 / 1024.0
}

fn print_report(args: &Args, r: &Report) {
    println!();
    println!(
        "== audit_scale: {} rows over {DAYS} days (1 M users, 200 k addresses, 1 M phones; sms_send/sms_verify/login_attempt, deny/challenge/lock) ==",
        r.filled.rows
    );
    println!(
        "fill             {} rows in {:.1} s = {:.0} rows/s (batches of {}, {} inserters, AuditDb::insert with rollups)",
        r.filled.rows,
        r.filled.elapsed.as_secs_f64(),
        r.filled.rows as f64 / r.filled.elapsed.as_secs_f64(),
        args.batch,
        args.inserters
    );
    println!("server           {}", r.server);
    println!("VACUUM ANALYZE   {:.1} s", r.settle.as_secs_f64());
    println!(
        "database size    {:.2} GiB after the fill, {:.2} GiB after the cut and the flood",
        gib(r.size_filled),
        gib(r.size_cut)
    );
    println!(
        "probes           user {}, ip {}, day {}",
        r.probe.user, r.probe.ip, r.probe.day
    );
    println!();
    println!(
        "{:<34} {:>9} {:>10} {:>6}  answer",
        "admin request",
        "first ms",
        format!("median/{}", args.runs),
        "status"
    );
    for t in &r.requests {
        println!(
            "{:<34} {:>9.1} {:>10.1} {:>6}  {}",
            t.name,
            ms(t.first),
            ms(t.median),
            t.status,
            t.answer
        );
    }
    println!();
    println!(
        "{:<8} {:>9} {:>11} {:>9} {:>10} {:>11} {:>13} {:>10}",
        "CSV", "rows", "bytes", "first s", "median s", "RSS before", "peak RSS", "peak-before"
    );
    for e in &r.exports {
        println!(
            "{:<8} {:>9} {:>11} {:>9.2} {:>10.2} {:>7.1} MiB {:>9.1} MiB {:>6.1} MiB",
            e.name,
            e.rows,
            e.bytes,
            e.first.as_secs_f64(),
            e.median.as_secs_f64(),
            mib(e.rss_before_kib),
            mib(e.peak_kib),
            mib(e.peak_kib.saturating_sub(e.rss_before_kib))
        );
    }
    print_cut(args, &r.cut);
}

fn print_cut(args: &Args, c: &Cut) {
    let f = |k: &str| c.flood.get(k).copied().unwrap_or(f64::NAN);
    let duration = f("duration_s");
    let cut_started = c.start_to_cut_done.as_secs_f64() - c.cut_seconds;
    let overlap =
        c.start_to_cut_done.as_secs_f64() - c.start_to_flood.as_secs_f64().max(cut_started);
    println!();
    println!("retention cut: restart with retention = {RETENTION_SETTING} on the {DAYS}-day trail");
    println!(
        "  partitions before              {} ({} of them before the cut's day and holding rows)",
        c.partitions_before, c.filled_before_cutoff
    );
    println!(
        "  partitions dropped             {} (left: {})",
        c.dropped, c.partitions_after
    );
    println!("  rows cut (estimate)            {:.0}", c.rows_cut);
    println!("  tollgate_audit_retention_seconds {:.3} s", c.cut_seconds);
    println!(
        "  start → cut done               {:.3} s",
        c.start_to_cut_done.as_secs_f64()
    );
    println!(
        "  start → flood begins           {:.3} s (flood overlapped the cut for {:.3} s)",
        c.start_to_flood.as_secs_f64(),
        overlap.max(0.0)
    );
    println!();
    println!("flood during the cut: wrk -t1 -c{} POST /login/attempt, failures for distinct users from 256 addresses", args.flood_connections);
    println!("  requests                       {:.0} in {:.1} s = {:.0}/s (non-2xx {:.0}, socket errors {:.0}, timeouts {:.0})", f("requests"), duration, f("requests") / duration, f("non2xx"), f("socket_errors"), f("timeouts"));
    println!(
        "  latency                        p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms",
        f("p50_ms"),
        f("p99_ms"),
        f("max_ms")
    );
    println!(
        "  refusals (deny + challenge)    {:.0} = {:.0}/s",
        c.refusals,
        c.refusals / duration
    );
    println!("  audit events                   queued {:.0}, written {:.0}, spooled {:.0}, dropped/unjournaled {:.0}", c.queued, c.written, c.spooled, c.dropped_events);
    println!(
        "  spooled = 0                    {}",
        if c.spooled == 0.0 { "yes" } else { "NO" }
    );
}

#[tokio::main]
async fn main() {
    let args = Args::parse();
    let tollgate = args.tollgate();
    assert!(
        tollgate.is_file(),
        "no tollgate binary at {} (cargo build --release --bin tollgate, or --tollgate)",
        tollgate.display()
    );
    let scratch = Scratch::create(&args.database_url).await;
    eprintln!(
        "scratch database {} ({})",
        scratch.name,
        if args.keep_database {
            "kept"
        } else {
            "dropped at the end"
        }
    );
    // Run in a task so that a panic still drops the scratch database.
    let outcome = tokio::spawn({
        let (args, scratch) = (args.clone(), scratch.clone());
        async move { run(&args, &scratch).await }
    })
    .await;
    if !args.keep_database {
        scratch.drop_database().await;
    }
    match outcome {
        Ok(report) => print_report(&args, &report),
        Err(_) => std::process::exit(1),
    }
}
