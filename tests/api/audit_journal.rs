//! The audit journal: an answered refusal survives `kill -9` (database up or
//! down), exactly once; an unusable spool directory stops start-up; a
//! failing journal still answers, counts and says not ready; a database
//! dropped and made again is migrated again, and a migration held up past
//! start-up goes on while the service serves; a database that stops
//! answering is given up on within `audit.write_timeout`; `/readyz` tells
//! the public nothing but "not ready"; a full queue says so once in the log.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use serde_json::json;
use sqlx::Connection;
use tollgate::audit::query::EventFilter;
use tollgate::audit::{AuditDb, AuditEvent};

use crate::support::app::{limits, spawn_app_with_audit_db, Backend, TestApp};
use crate::support::audit_db::{postgres_admin_url, DbKind, FaultProxy, TestDb};
use crate::support::audit_trail::{all_rows, each_once, refused_send, request_id_counts};
use crate::support::process::Tollgate;
use crate::support::wait::eventually;

const PHONE: &str = "+8613800138000";
const CLIENTS: usize = 4;
/// The fewest answered refusals that make the kill a kill under load.
const MIN_ANSWERED: usize = 100;

fn config(dir: &std::path::Path, name: &str, database_url: &str) -> std::path::PathBuf {
    config_with(dir, name, database_url, "")
}

/// `config`, with `audit` lines added to its `[audit]` section.
fn config_with(
    dir: &std::path::Path,
    name: &str,
    database_url: &str,
    audit: &str,
) -> std::path::PathBuf {
    let path = dir.join(name);
    std::fs::write(
        &path,
        format!(
            r#"
[server]
bind = "127.0.0.1:0"
[audit]
database_url = "{database_url}"
spool_dir = "{spool}"
{audit}
[sms]
phone_limits = [{{ limit = 1, window = "1h" }}]
"#,
            spool = dir.join("spool").display()
        ),
    )
    .unwrap();
    path
}

/// `CLIENTS` clients send refused sends until the server stops answering;
/// each returns the request ids that got a 429 back, and counts them in
/// `refused` as they come.
fn hammer(
    address: &str,
    stop: Arc<AtomicBool>,
    refused: Arc<AtomicUsize>,
) -> Vec<tokio::task::JoinHandle<Vec<String>>> {
    (0..CLIENTS)
        .map(|c| {
            let address = address.to_string();
            let stop = stop.clone();
            let refused = refused.clone();
            tokio::spawn(async move {
                let client = reqwest::Client::new();
                let mut answered = Vec::new();
                for i in 0.. {
                    if stop.load(Ordering::Relaxed) {
                        break;
                    }
                    let id = format!("c{c}-{i}");
                    let sent = client
                        .post(format!("{address}/sms/send"))
                        .header("x-request-id", &id)
                        .json(&json!({ "phone": PHONE }))
                        .send()
                        .await;
                    match sent {
                        Ok(response) if response.status() == 429 => {
                            answered.push(id);
                            refused.fetch_add(1, Ordering::Relaxed);
                        }
                        Ok(response) => panic!("{id}: {}", response.status()),
                        Err(_) => break, // killed mid-request: no answer
                    }
                }
                answered
            })
        })
        .collect()
}

/// Refusals hammered at a process that is SIGKILLed mid-load, with its audit
/// database at `first_url`; a second process on the same spool directory
/// and the real database then holds every answered refusal exactly once.
async fn killed_mid_load_loses_no_answered_refusal(kind: DbKind, database_up: bool) {
    let db = TestDb::new(kind).await;
    let dir = db.dir.path().to_path_buf();
    let first_url = if database_up {
        db.url.clone()
    } else {
        format!(
            "postgres://postgres@127.0.0.1:{}/nowhere",
            crate::support::app::free_port()
        )
    };
    let mut first = Tollgate::start(&config(&dir, "first.toml", &first_url)).await;
    let client = reqwest::Client::new();
    let sent = client
        .post(format!("{}/sms/send", first.address))
        .json(&json!({ "phone": PHONE }))
        .send()
        .await
        .unwrap();
    assert_eq!(sent.status(), 200);

    let stop = Arc::new(AtomicBool::new(false));
    let refused = Arc::new(AtomicUsize::new(0));
    let clients = hammer(&first.address, stop.clone(), refused.clone());
    // Killed once a real load has been answered, however slow the machine.
    let loaded = async {
        while refused.load(Ordering::Relaxed) <= 2 * MIN_ANSWERED {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    };
    tokio::time::timeout(Duration::from_secs(60), loaded)
        .await
        .expect("the clients got refusals back");
    first.child.start_kill().unwrap(); // SIGKILL, mid-load
    first.child.wait().await.unwrap();
    stop.store(true, Ordering::Relaxed);
    let mut answered = Vec::new();
    for client in clients {
        answered.extend(client.await.unwrap());
    }
    assert!(
        answered.len() > MIN_ANSWERED,
        "a real load: {}",
        answered.len()
    );

    let _second = Tollgate::start(&config(&dir, "second.toml", &db.url)).await;
    let pool = db.connect().await;
    every_id_arrives(&pool, &answered).await;
    let rows = all_rows(&pool).await;
    let counts = request_id_counts(&rows);
    let answered_set: std::collections::HashSet<&String> = answered.iter().collect();
    for id in &answered {
        assert_eq!(counts.get(id), Some(&1), "{id} exactly once");
    }
    // Rows beyond the answered ones can only be the requests in flight at
    // the kill (journaled, their answer never sent): one per client at most.
    let unanswered: Vec<&String> = counts
        .keys()
        .filter(|id| !answered_set.contains(id))
        .collect();
    assert!(
        unanswered.len() <= CLIENTS && counts.values().all(|&n| n == 1),
        "{} answered, {} rows; unanswered rows {unanswered:?}",
        answered.len(),
        rows.len()
    );
    // Replayed segments are deleted, once every chunk of them is committed:
    // only then are the rows and the rollups read at rest (they are read by
    // separate queries).
    eventually("the journal emptied", Duration::from_secs(30), || {
        let left = std::fs::read_dir(dir.join("spool"))
            .unwrap()
            .filter_map(|e| e.ok())
            .filter(|e| e.path().extension().is_some_and(|x| x == "jsonl"))
            .count();
        async move { left == 0 }
    })
    .await;
    crate::support::audit_trail::assert_rollups_match(&pool).await;
}

#[tokio::test]
async fn kill_9_mid_load_with_the_database_up_loses_no_answered_refusal() {
    killed_mid_load_loses_no_answered_refusal(DbKind::Postgres, true).await;
}

/// SQLite too: every answered refusal once, and the rollups equal the rows.
#[tokio::test]
async fn kill_9_mid_load_on_sqlite_loses_no_answered_refusal() {
    killed_mid_load_loses_no_answered_refusal(DbKind::Sqlite, true).await;
}

#[tokio::test]
async fn kill_9_mid_load_with_the_database_down_loses_no_answered_refusal() {
    killed_mid_load_loses_no_answered_refusal(DbKind::Postgres, false).await;
}

#[tokio::test]
async fn an_unusable_spool_dir_stops_start_up_naming_the_key() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("a-file");
    std::fs::write(&file, "not a directory").unwrap();
    let path = dir.path().join("tollgate.toml");
    std::fs::write(
        &path,
        format!(
            "[server]\nbind = \"127.0.0.1:0\"\n[audit]\ndatabase_url = \"sqlite://{}/audit.db?mode=rwc\"\nspool_dir = \"{}/spool\"\n",
            dir.path().display(),
            file.display()
        ),
    )
    .unwrap();
    let run = tokio::process::Command::new(env!("CARGO_BIN_EXE_tollgate"))
        .current_dir(dir.path())
        .arg("--config")
        .arg(&path)
        .env_remove("TOLLGATE_CONFIG")
        .kill_on_drop(true)
        .output();
    let output = tokio::time::timeout(Duration::from_secs(30), run)
        .await
        .expect("start-up stops instead of serving")
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success());
    assert!(stderr.contains("audit.spool_dir"), "{stderr}");
}

/// `/readyz` answers 200 (again) within 30 s.
async fn ready_again(app: &TestApp) {
    eventually("ready", Duration::from_secs(30), || async {
        app.get("/readyz").await.status == 200
    })
    .await;
}

pub(crate) async fn app_with(
    db_url: String,
    spool: std::path::PathBuf,
    admin_port: bool,
) -> TestApp {
    app_configured(db_url, spool, admin_port, |_| {}).await
}

async fn app_configured(
    db_url: String,
    spool: std::path::PathBuf,
    admin_port: bool,
    configure: impl FnOnce(&mut tollgate::settings::Settings) + Send + 'static,
) -> TestApp {
    spawn_app_with_audit_db(Backend::Memory, move |s| {
        configure(s);
        s.audit.database_url = tollgate::settings::SecretUrl::new(db_url);
        s.audit.spool_dir = spool.display().to_string();
        s.audit.flush_interval = Duration::from_millis(20);
        s.sms.phone_limits = limits(&[(1, 3_600_000)]);
        if admin_port {
            s.server.admin_bind = Some("127.0.0.1:0".parse().unwrap());
        }
    })
    .await
}

/// Every journaled refusal counts one `queued` event, and once written one
/// `written` (the load benchmark checks the two agree). The recorder is
/// process-wide and other tests add to it too: at least as many.
#[tokio::test]
async fn each_refusal_counts_one_queued_and_one_written_event() {
    let db = TestDb::new(DbKind::Postgres).await;
    let app = app_with(db.url.clone(), db.spool_dir(), false).await;
    assert_eq!(app.sms_send(json!({ "phone": PHONE })).await.status, 200);
    let series = |o: &str| format!("tollgate_audit_events_total{{outcome=\"{o}\"}}");
    app.flush_audit().await;
    let (queued, written) = (
        app.metric(&series("queued")).await,
        app.metric(&series("written")).await,
    );
    for i in 0..5 {
        refused_send(&app, &format!("counted-{i}")).await;
    }
    app.flush_audit().await;
    assert!(app.metric(&series("queued")).await >= queued + 5.0);
    assert!(app.metric(&series("written")).await >= written + 5.0);
}

/// The public `/readyz` says 503 `not_ready` and nothing more while the
/// audit database is down; the admin listener's says which part.
#[tokio::test]
async fn readiness_fails_from_state_and_tells_the_public_no_detail() {
    let dir = tempfile::tempdir().unwrap();
    let down = "postgres://postgres@127.0.0.1:1/nowhere".to_string();
    let app = app_with(down, dir.path().join("spool"), true).await;
    assert_eq!(app.get("/healthz").await.status, 200);
    let ready = app.get("/readyz").await;
    assert_eq!(
        (ready.status.as_u16(), ready.error()),
        (503, "not_ready"),
        "{}",
        ready.body
    );
    assert_eq!(
        ready.body,
        json!({ "error": "not_ready", "message": "not ready" })
    );
    let admin = app.admin_address.clone().expect("an admin listener");
    let detailed: serde_json::Value = app
        .client
        .get(format!("{admin}/readyz"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(
        (
            &detailed["audit_database"],
            &detailed["audit_journal"],
            &detailed["store"],
            &detailed["lists"]
        ),
        (
            &json!("unavailable"),
            &json!("ok"),
            &json!("ok"),
            // Its admins' block entries are unknown until the database
            // answers: not ready for that too.
            &json!("not_read")
        ),
        "{detailed}"
    );
    // Left out, the database does not count, but the lists read from it do
    // until they are read: their block entries are not in force. The admin
    // listener leaves out any part; the public one the database alone, so
    // that outsiders learn no more and cannot answer 200 for a pod that is
    // not ready.
    let admin_status = |query: String| {
        let request = app.client.get(format!("{admin}/readyz?{query}"));
        async move { request.send().await.unwrap().status().as_u16() }
    };
    for (query, status) in [
        ("exclude=audit_database", 503),
        ("exclude=audit_database,lists", 200),
        ("exclude=lists&exclude=audit_database", 200),
    ] {
        assert_eq!(admin_status(query.into()).await, status, "{query} (admin)");
    }
    let ready = app.get("/readyz?exclude=audit_database").await;
    assert_eq!(ready.status, 503, "{}", ready.body);
    assert_eq!(
        ready.body,
        json!({ "error": "not_ready", "message": "not ready" })
    );
    // A part that is none, or one the public listener keeps, is refused,
    // not ignored: a misspelt probe would wait on the part it meant to
    // leave out.
    for query in [
        "exclude=database",
        "exclude=Store",
        "exclude=lists;store",
        "exclude=%20lists",
        "exclude=audit_database,",
        "exclude=",
    ] {
        assert_eq!(admin_status(query.into()).await, 400, "{query} (admin)");
    }
    for query in [
        "exclude=lists",
        "exclude=audit_database,lists",
        "exclude=audit_database&exclude=store",
        "exclude=database",
    ] {
        let refused = app.get(&format!("/readyz?{query}")).await;
        assert_eq!(refused.status, 400, "{query}: {}", refused.body);
        assert_eq!(refused.error(), "invalid_request", "{query}");
    }
}

/// The spool directory replaced by a file while running: refusals are
/// still answered, each failed append is counted, `/readyz` says 503; once
/// the directory is back, ready again and the events held in memory arrive.
#[tokio::test]
async fn a_failing_journal_still_answers_counts_and_is_not_ready() {
    let db = TestDb::new(DbKind::Sqlite).await;
    let spool = db.dir.path().join("spool");
    let app = app_with(db.url.clone(), spool.clone(), false).await;
    assert_eq!(app.sms_send(json!({ "phone": PHONE })).await.status, 200);
    assert_eq!(app.get("/readyz").await.status, 200);
    let series = "tollgate_audit_journal_errors_total{op=\"append\"}";
    let before = app.metric(series).await;

    std::fs::remove_dir_all(&spool).unwrap();
    std::fs::write(&spool, "in the way").unwrap();
    for i in 0..3 {
        refused_send(&app, &format!("unjournaled-{i}")).await;
    }
    assert!(app.metric(series).await - before >= 3.0);
    assert_eq!(app.get("/readyz").await.status, 503);

    std::fs::remove_file(&spool).unwrap();
    std::fs::create_dir(&spool).unwrap();
    ready_again(&app).await;
    let pool = db.connect().await;
    eventually(
        "the held events written",
        Duration::from_secs(30),
        || async {
            let ids = (0..3).map(|i| format!("unjournaled-{i}"));
            each_once(&all_rows(&pool).await, ids)
        },
    )
    .await;
}

/// The audit database dropped and made again while running: the writer
/// migrates it again, the rows arrive, and `/readyz` is 200 again.
#[tokio::test]
async fn a_database_dropped_and_recreated_is_migrated_again() {
    let db = TestDb::new(DbKind::Postgres).await;
    let app = app_with(db.url.clone(), db.spool_dir(), false).await;
    assert_eq!(app.sms_send(json!({ "phone": PHONE })).await.status, 200);
    refused_send(&app, "before-drop").await;
    app.flush_audit().await;
    assert_eq!(all_rows(&db.connect().await).await.len(), 1);

    let name = db.url.rsplit('/').next().unwrap().to_string();
    let mut admin = sqlx::PgConnection::connect(&postgres_admin_url())
        .await
        .unwrap();
    for sql in [
        format!("DROP DATABASE {name} WITH (FORCE)"),
        format!("CREATE DATABASE {name}"),
    ] {
        sqlx::query(&sql).execute(&mut admin).await.unwrap();
    }
    for i in 0..3 {
        refused_send(&app, &format!("after-drop-{i}")).await;
    }
    let pool = AuditDb::connect_lazy(&db.url).unwrap();
    eventually(
        "rows in the recreated database",
        Duration::from_secs(30),
        || async {
            app.flush_audit().await;
            // No table until the writer has migrated again: no rows yet.
            let rows = pool.page(&EventFilter::default(), None, 1_000).await;
            let ids = (0..3).map(|i| format!("after-drop-{i}"));
            each_once(&rows.unwrap_or_default(), ids)
        },
    )
    .await;
    ready_again(&app).await;
}

/// An upgrade whose migration waits past start-up's 5 s for a lock (a
/// long report, a `pg_dump` holding the trail): the service serves
/// meanwhile, not ready, its refusals answered into the journal; once the
/// lock is free the migration completes, and the rows arrive in the
/// upgraded trail. A flush (what `SIGTERM` does) meanwhile gives up on the
/// writer, stuck behind the migration, within its bound:
/// `audit.write_timeout` and a second. (It would also pass with the
/// migration dropped at the wait: the writer migrates again. That one
/// migration runs, not two, is by reading of `startup::audit`.)
#[tokio::test]
async fn a_migration_held_past_start_up_goes_on_while_the_service_serves() {
    const COLLATION_MIGRATION: i64 = 20261129000001;
    let db = TestDb::new(DbKind::Postgres).await;
    drop(db.migrated_before(COLLATION_MIGRATION).await);
    let mut holder = sqlx::PgConnection::connect(&db.url).await.unwrap();
    let mut lock = holder.begin().await.unwrap();
    sqlx::query("LOCK TABLE audit_events IN ACCESS SHARE MODE")
        .execute(&mut *lock)
        .await
        .unwrap();

    let app = app_configured(db.url.clone(), db.spool_dir(), false, |s| {
        s.audit.write_timeout = Duration::from_secs(1);
    })
    .await;
    let applied = || async {
        let mut check = sqlx::PgConnection::connect(&db.url).await.unwrap();
        let found: Option<(bool,)> =
            sqlx::query_as("SELECT success FROM _sqlx_migrations WHERE version = $1")
                .bind(COLLATION_MIGRATION)
                .fetch_optional(&mut check)
                .await
                .unwrap();
        found.is_some_and(|(success,)| success)
    };
    // Start-up has stopped waiting; the lock still holds the migration.
    assert!(!applied().await);
    assert_eq!(app.sms_send(json!({ "phone": PHONE })).await.status, 200);
    refused_send(&app, "during-the-migration").await;
    assert_eq!(app.get("/readyz").await.status, 503);
    tokio::time::timeout(Duration::from_secs(30), app.flush_audit())
        .await
        .expect("a flush does not wait on a migration held up");
    assert!(!applied().await, "the lock still holds the migration");

    lock.commit().await.unwrap();
    eventually("the migration applied", Duration::from_secs(30), applied).await;
    let pool = AuditDb::connect_lazy(&db.url).unwrap();
    eventually("the row in the trail", Duration::from_secs(30), || async {
        app.flush_audit().await;
        let rows = pool.page(&EventFilter::default(), None, 1_000).await;
        each_once(&rows.unwrap_or_default(), ["during-the-migration"])
    })
    .await;
    ready_again(&app).await;
}

/// How a database stops answering the writer.
#[derive(Clone, Copy, Debug)]
enum Hang {
    /// Someone holds a lock the insert waits on (an operator's `ALTER
    /// TABLE`, a `CREATE INDEX`): the connection answers pings, the insert
    /// never returns. Only `audit.write_timeout` ends the wait (PostgreSQL's
    /// `lock_timeout`, which the writer sets to it).
    Locked,
    /// Every byte stops on the way (a network that drops packets, a hung
    /// server): the pool's own acquire timeout ends the wait of an insert
    /// that has not started, `audit.write_timeout` that of one under way.
    /// (This freezes between batches, so the pool's timeout is what ends
    /// it here.)
    Frozen,
    /// The same, from the moment the batch's `BEGIN` reaches the database:
    /// its answer never comes back. Only the writer's own bound, twice
    /// `audit.write_timeout`, ends the wait; and the connection, cut off
    /// mid-transaction, must not serve again: once the network comes back
    /// (what it held goes on), that connection's server process has ended.
    FrozenInBegin,
}

/// A database that stops answering: within `audit.write_timeout` the
/// writer leaves the batch to the journal and `/readyz` says 503, instead
/// of waiting on the insert while readiness keeps its last good word; a
/// flush (what `SIGTERM` does) returns; once the database answers again,
/// every refusal is in it, once.
async fn a_database_that_stops_answering_is_given_up_on(hang: Hang) {
    let db = TestDb::new(DbKind::Postgres).await;
    let proxy = FaultProxy::start("127.0.0.1:5432").await;
    let url = in_clear(db.url_via(proxy.port));
    let app = app_configured(url, db.spool_dir(), false, |s| {
        s.audit.write_timeout = Duration::from_secs(2);
    })
    .await;
    assert_eq!(app.sms_send(json!({ "phone": PHONE })).await.status, 200);
    refused_send(&app, "before-the-hang").await;
    app.flush_audit().await;
    assert_eq!(app.get("/readyz").await.status, 200);
    let spooled = "tollgate_audit_events_total{outcome=\"spooled\"}";
    let spooled_before = app.metric(spooled).await;

    // The hang starts straight after a write, so that the writer's next
    // word with the database is these refusals' insert, not its idle probe
    // (which has a timeout of its own).
    let mut holder = sqlx::PgConnection::connect(&db.url).await.unwrap();
    let mut lock = holder.begin().await.unwrap();
    match hang {
        Hang::Locked => {
            sqlx::query("LOCK TABLE audit_events IN ACCESS EXCLUSIVE MODE")
                .execute(&mut *lock)
                .await
                .unwrap();
        }
        Hang::Frozen => proxy.freeze(),
        Hang::FrozenInBegin => proxy.freeze_after(b"SET LOCAL lock_timeout"),
    }
    for i in 0..3 {
        refused_send(&app, &format!("during-the-hang-{i}")).await;
    }
    eventually("not ready", Duration::from_secs(20), || async {
        app.get("/readyz").await.status == 503
    })
    .await;
    let health = app.sink_health();
    assert!(!health.database && health.journal, "{health:?}");
    // The shipped Kubernetes probe: the journal holds the trail, so the pod
    // stays in its Service.
    let excluded = app.get("/readyz?exclude=audit_database").await;
    assert_eq!(excluded.status, 200, "{}", excluded.body);
    assert!(app.metric(spooled).await - spooled_before >= 3.0);
    tokio::time::timeout(Duration::from_secs(30), app.flush_audit())
        .await
        .expect("a flush does not wait on a database that does not answer");

    if let Hang::FrozenInBegin = hang {
        // PostgreSQL ran the batch's BEGIN; its answer is held. Pooled
        // again, that connection would carry the next batch inside a
        // transaction no one commits: the writer closes it. The network
        // comes back with what it held, the close among it.
        let cut_off = backend_of(&db.url, "BEGIN; SET LOCAL lock_timeout").await;
        assert_eq!(cut_off.state.as_deref(), Some("idle in transaction"));
        proxy.resume();
        eventually(
            "the cut-off connection closed",
            Duration::from_secs(15),
            || async { !runs(&db.url, &cut_off).await },
        )
        .await;
    } else {
        proxy.thaw();
    }
    lock.commit().await.unwrap();
    ready_again(&app).await;
    let pool = db.connect().await;
    eventually(
        "every refusal in the trail, once",
        Duration::from_secs(30),
        || async {
            let during = (0..3).map(|i| format!("during-the-hang-{i}"));
            let ids = std::iter::once("before-the-hang".to_string()).chain(during);
            each_once(&all_rows(&pool).await, ids)
        },
    )
    .await;
    // No refusal is under way any more, so rows and rollups are at rest.
    crate::support::audit_trail::assert_rollups_match(&pool).await;
}

/// `url` without TLS, so that a [`FaultProxy`] can see a batch's `BEGIN`
/// go by.
fn in_clear(url: String) -> String {
    if url.contains('?') {
        format!("{url}&sslmode=disable")
    } else {
        format!("{url}?sslmode=disable")
    }
}

/// A PostgreSQL server process, told from a later one with its pid.
#[derive(Debug, sqlx::FromRow)]
struct ServerProcess {
    pid: i32,
    backend_start: chrono::DateTime<chrono::Utc>,
    state: Option<String>,
}

/// The one server backend whose last statement starts with `query`.
async fn backend_of(url: &str, query: &str) -> ServerProcess {
    let mut conn = sqlx::PgConnection::connect(url).await.unwrap();
    let mut found: Vec<ServerProcess> = sqlx::query_as(
        "SELECT pid, backend_start, state FROM pg_stat_activity \
         WHERE datname = current_database() AND pid <> pg_backend_pid() \
           AND starts_with(query, $1)",
    )
    .bind(query)
    .fetch_all(&mut conn)
    .await
    .unwrap();
    assert_eq!(found.len(), 1, "one backend ran `{query}`: {found:?}");
    found.remove(0)
}

/// Whether `backend` still runs.
async fn runs(url: &str, backend: &ServerProcess) -> bool {
    let mut conn = sqlx::PgConnection::connect(url).await.unwrap();
    sqlx::query_scalar(
        "SELECT EXISTS (SELECT 1 FROM pg_stat_activity WHERE pid = $1 AND backend_start = $2)",
    )
    .bind(backend.pid)
    .bind(backend.backend_start)
    .fetch_one(&mut conn)
    .await
    .unwrap()
}

#[tokio::test]
async fn a_database_locked_against_the_insert_is_given_up_on_and_loses_nothing() {
    a_database_that_stops_answering_is_given_up_on(Hang::Locked).await;
}

#[tokio::test]
async fn a_database_behind_a_frozen_network_is_given_up_on_and_loses_nothing() {
    a_database_that_stops_answering_is_given_up_on(Hang::Frozen).await;
}

#[tokio::test]
async fn a_database_frozen_mid_transaction_is_given_up_on_and_loses_nothing() {
    a_database_that_stops_answering_is_given_up_on(Hang::FrozenInBegin).await;
}

/// `audit.write_timeout` is 1 s to 1 h: below, ordinary batches would be
/// given up and the trail never written; above, PostgreSQL refuses the
/// `lock_timeout` (at most 2^31 - 1 ms) and every batch with it. 10 s
/// unless set.
#[test]
fn the_write_timeout_is_validated() {
    for (value, says) in [
        ("0ms", "at least 1ms"),
        ("999ms", "from 1s to 1h"),
        ("61m", "from 1s to 1h"),
        ("30d", "from 1s to 1h"),
    ] {
        let error =
            crate::support::app::config_error(&format!("[audit]\nwrite_timeout = \"{value}\""));
        assert!(
            error.contains("audit.write_timeout") && error.contains(says),
            "{value}: {error}"
        );
    }
    for value in ["1s", "1h"] {
        let loaded =
            crate::support::app::load_config(&format!("[audit]\nwrite_timeout = \"{value}\""));
        assert!(loaded.is_ok(), "{value}: {:?}", loaded.err());
    }
    let settings = crate::support::app::load_config("").unwrap();
    assert_eq!(settings.audit.write_timeout, Duration::from_secs(10));
}

/// A batch whose `BEGIN` PostgreSQL refused leaves no connection in an
/// aborted transaction: sqlx rolls back no transaction whose `BEGIN`
/// failed, and pooled again that connection would fail every batch it
/// carried. The refusal here is a bound past what `lock_timeout` takes
/// (start-up refuses such a setting; a server can refuse a `SET` for its
/// own reasons). The pool hands out its idle connections in turn, so as
/// many batches as it holds connections, and one more, meet each of them.
#[tokio::test]
async fn a_batch_whose_begin_was_refused_leaves_no_aborted_transaction_pooled() {
    const POOL_SIZE: usize = 5;
    let db = TestDb::new(DbKind::Postgres).await;
    let audit = db.connect().await;
    let past_lock_timeout = Some(Duration::from_secs(30 * 86_400));
    let refused = audit
        .insert_within(&[a_refusal("refused")], 7, past_lock_timeout)
        .await;
    assert!(refused.is_err(), "{refused:?}");
    for i in 0..=POOL_SIZE {
        let after = a_refusal(&format!("after-{i}"));
        assert_eq!(audit.insert(&[after], 7).await.unwrap(), 1, "batch {i}");
    }
}

pub(crate) fn a_refusal(user: &str) -> AuditEvent {
    use tollgate::audit::AuditDecision;
    use tollgate::domain::{Action, Subject, SubjectKind};
    AuditEvent::new(
        Action::LoginAttempt,
        AuditDecision::Deny,
        "user_locked",
        &Subject::new(SubjectKind::User, user),
    )
}

fn bytes_on_disk(dir: &std::path::Path) -> u64 {
    std::fs::read_dir(dir)
        .unwrap()
        .filter_map(|e| e.ok()?.metadata().ok())
        .map(|m| m.len())
        .sum()
}

/// A refusal flood while the database is down cannot fill the disk: the
/// journal stops at its bound, what an earlier process left counts toward
/// it, and deleting a segment makes room again.
#[test]
fn the_journal_stops_at_its_bound() {
    use tollgate::audit::Journal;
    const MAX: u64 = 16 << 10;
    let dir = tempfile::tempdir().unwrap();
    let journal = Journal::open(dir.path(), MAX).unwrap();
    let mut taken = 0;
    while journal.append(&a_refusal(&format!("u{taken}"))).is_some() {
        taken += 1;
        assert!(taken < 10_000, "no bound");
    }
    assert!(taken > 10, "{taken} events before the bound");
    assert!(journal.append(&a_refusal("more")).is_none(), "still full");
    assert!(journal.healthy(), "a full journal is not a failing one");
    assert!(
        bytes_on_disk(dir.path()) <= MAX,
        "{}",
        bytes_on_disk(dir.path())
    );
    assert_eq!(journal.bytes(), bytes_on_disk(dir.path()));

    drop(journal); // as a dead process: its segment left behind
    let next = Journal::open(dir.path(), MAX).unwrap();
    assert!(next.append(&a_refusal("next")).is_none(), "leftovers count");
    for segment in next.sealed() {
        next.remove(&segment).unwrap();
    }
    assert!(next.append(&a_refusal("room")).is_some(), "room again");
}

/// Past `audit.journal_max_bytes` (here, left by an earlier process) with
/// the database down: a refusal is still answered, counted as
/// unjournaled, and the journal does not grow; it is not a failure.
#[tokio::test]
async fn past_the_journal_bound_refusals_are_answered_and_counted() {
    let dir = tempfile::tempdir().unwrap();
    let spool = dir.path().join("spool");
    // The old spool's file name, adopted as a leftover: events, 1 MiB of
    // them, which wait for the database.
    let leftover = leave_a_full_journal(&spool);
    let down = "postgres://postgres@127.0.0.1:1/nowhere".to_string();
    let app = app_configured(down, spool.clone(), false, |s| {
        s.audit.journal_max_bytes = 1 << 20; // the leftover is a little past it
    })
    .await;
    let series = "tollgate_audit_events_total{outcome=\"unjournaled\"}";
    let before = app.metric(series).await;
    assert_eq!(app.sms_send(json!({ "phone": PHONE })).await.status, 200);
    for i in 0..3 {
        refused_send(&app, &format!("past-the-bound-{i}")).await;
    }
    assert!(app.metric(series).await - before >= 3.0);
    assert_eq!(bytes_on_disk(&spool), leftover, "the journal did not grow");
    assert!(
        app.sink_health().journal,
        "a full journal is not an unwritable one"
    );
}

/// Past the bound with the database down, refusals wait in memory; a
/// flush (`SIGTERM`'s, before the process exits) puts them in the journal
/// past its bound, where the next process on the spool directory finds them.
#[tokio::test]
async fn past_the_journal_bound_a_flush_journals_what_memory_holds() {
    let dir = tempfile::tempdir().unwrap();
    let spool = dir.path().join("spool");
    let leftover = leave_a_full_journal(&spool);
    let down = "postgres://postgres@127.0.0.1:1/nowhere".to_string();
    let app = app_configured(down, spool.clone(), false, |s| {
        s.audit.journal_max_bytes = 1 << 20;
    })
    .await;
    assert_eq!(app.sms_send(json!({ "phone": PHONE })).await.status, 200);
    let ids: Vec<String> = (0..3).map(|i| format!("held-{i}")).collect();
    for id in &ids {
        refused_send(&app, id).await;
    }
    assert_eq!(bytes_on_disk(&spool), leftover, "in memory only, so far");
    assert!(!each_once(&journaled(&spool), &ids));

    app.flush_audit().await;
    assert!(
        each_once(&journaled(&spool), &ids),
        "each in the journal once"
    );
    app.flush_audit().await;
    assert!(
        each_once(&journaled(&spool), &ids),
        "a second flush journals nothing again"
    );
}

/// Past the bound, an insert that has taken the refusals held in memory
/// and outlasts `SIGTERM`'s flush (the database stops answering in the
/// batch's first statement: the insert is given up at twice
/// `audit.write_timeout`, the flush at once and a second) does not take
/// them with it, nor those answered while it hangs: the flush journals
/// them all the same. The process goes on here, so it replays them once
/// the database answers: each in the trail once.
#[tokio::test]
async fn past_the_journal_bound_a_flush_journals_what_a_hung_insert_has_taken() {
    let db = TestDb::new(DbKind::Postgres).await;
    let spool = db.spool_dir();
    leave_a_full_journal(&spool);
    let proxy = FaultProxy::start("127.0.0.1:5432").await;
    proxy.cut(); // down at start-up, so that the leftover stays
    let url = in_clear(db.url_via(proxy.port));
    let app = app_configured(url, spool.clone(), false, |s| {
        s.audit.journal_max_bytes = 1 << 20;
        s.audit.write_timeout = Duration::from_secs(5);
    })
    .await;
    assert_eq!(app.sms_send(json!({ "phone": PHONE })).await.status, 200);
    let ids: Vec<String> = (0..3).map(|i| format!("taken-{i}")).collect();
    for id in &ids {
        refused_send(&app, id).await;
    }
    let counts = request_id_counts(&journaled(&spool));
    assert!(
        ids.iter().all(|id| !counts.contains_key(id)),
        "in memory only, so far"
    );

    // The database comes back and hangs in the next batch, which takes
    // the refusals (or in the leftover's replay, with them still held).
    proxy.freeze_after(b"SET LOCAL lock_timeout");
    proxy.restore();
    eventually("an insert hangs", Duration::from_secs(30), || async {
        proxy.frozen()
    })
    .await;
    // Refusals answered while it hangs wait behind it.
    let meanwhile: Vec<String> = (0..2).map(|i| format!("meanwhile-{i}")).collect();
    for id in &meanwhile {
        refused_send(&app, id).await;
    }
    let ids: Vec<String> = ids.into_iter().chain(meanwhile).collect();
    let flushed = tokio::time::Instant::now();
    tokio::time::timeout(Duration::from_secs(30), app.flush_audit())
        .await
        .expect("a flush does not wait on the hung insert");
    assert!(
        flushed.elapsed() < Duration::from_secs(9),
        "the flush ended before the insert was given up: {:?}",
        flushed.elapsed()
    );
    assert!(
        each_once(&journaled(&spool), &ids),
        "each in the journal once"
    );

    proxy.thaw();
    let pool = db.connect().await;
    eventually(
        "every refusal in the trail, once",
        Duration::from_secs(60),
        || async { each_once(&all_rows(&pool).await, &ids) },
    )
    .await;
}

/// A segment that cannot be read (here a directory where a file should
/// be) holds back none after it: the later segment's events arrive, and
/// the journal, which still takes events, stays ready. Once
/// it is gone altogether (deleted by hand, or by a cleaner of old files),
/// it is forgotten, not tried again and again.
#[tokio::test]
async fn an_unreadable_segment_holds_back_none_after_it_and_a_deleted_one_is_forgotten() {
    let db = TestDb::new(DbKind::Postgres).await;
    let spool = db.spool_dir();
    std::fs::create_dir_all(spool.join("replay-a.jsonl")).unwrap();
    let mut event = a_refusal("kept");
    event.request_id = Some("kept".to_string());
    let line = serde_json::to_string(&event).unwrap();
    std::fs::write(spool.join("replay-b.jsonl"), format!("{line}\n")).unwrap();
    // An earlier process's spool files, adopted oldest first.
    let app = app_with(db.url.clone(), spool.clone(), false).await;
    let pool = db.connect().await;
    eventually(
        "the later segment replayed",
        Duration::from_secs(30),
        || async { each_once(&all_rows(&pool).await, ["kept"]) },
    )
    .await;
    eventually(
        "the replayed segment deleted",
        Duration::from_secs(10),
        || async { segment_files(&spool).len() == 1 },
    )
    .await;
    let unreadable = segment_files(&spool);
    assert!(
        unreadable[0].is_dir(),
        "the directory is left: {unreadable:?}"
    );
    // Each pass of the writer tries it again, and counts the failure.
    let reads = "tollgate_audit_journal_errors_total{op=\"read\"}";
    let before = app.metric(reads).await;
    eventually("a failed read counted", Duration::from_secs(10), || async {
        app.metric(reads).await > before
    })
    .await;
    // A file it cannot read is no journal it cannot write: ready all along.
    for _ in 0..10 {
        assert!(app.sink_health().journal, "the journal still takes events");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    std::fs::remove_dir(&unreadable[0]).unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await;
    let forgotten = app.metric(reads).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(
        app.metric(reads).await,
        forgotten,
        "a segment whose file is gone is not tried again"
    );
}

/// A leftover journal a little past 1 MiB in `spool` (made here), as an
/// earlier process left it; its size.
fn leave_a_full_journal(spool: &std::path::Path) -> u64 {
    std::fs::create_dir(spool).unwrap();
    let mut leftover = Vec::new();
    while leftover.len() < 1 << 20 {
        serde_json::to_writer(&mut leftover, &a_refusal("earlier")).unwrap();
        leftover.push(b'\n');
    }
    std::fs::write(spool.join("spool.jsonl"), &leftover).unwrap();
    leftover.len() as u64
}

/// The journal's segment files, oldest first.
pub(crate) fn segment_files(spool: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut files: Vec<_> = std::fs::read_dir(spool)
        .unwrap()
        .filter_map(|e| Some(e.ok()?.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "jsonl"))
        .collect();
    files.sort();
    files
}

/// Every event in the journal's segments.
fn journaled(spool: &std::path::Path) -> Vec<AuditEvent> {
    segment_files(spool)
        .iter()
        .flat_map(|f| tollgate::audit::journal::read_lines(f).unwrap().events)
        .collect()
}

#[test]
fn the_journal_max_bytes_is_validated() {
    let error = crate::support::app::config_error("[audit]\njournal_max_bytes = \"512KiB\"");
    assert!(
        error.contains("audit.journal_max_bytes") && error.contains("1MiB"),
        "{error}"
    );
    let settings =
        crate::support::app::load_config("[audit]\njournal_max_bytes = \"2GiB\"").unwrap();
    assert_eq!(settings.audit.journal_max_bytes, 2 << 30);
    let settings = crate::support::app::load_config("").unwrap();
    assert_eq!(settings.audit.journal_max_bytes, 1 << 30);
}

#[test]
fn the_journal_sync_interval_is_validated() {
    for (value, says) in [("0ms", "at least 1ms"), ("2m", "at most 60s")] {
        let error = crate::support::app::config_error(&format!(
            "[audit]\njournal_sync_interval = \"{value}\""
        ));
        assert!(
            error.contains("audit.journal_sync_interval") && error.contains(says),
            "{value}: {error}"
        );
    }
    let settings = crate::support::app::load_config("").unwrap();
    assert_eq!(
        settings.audit.journal_sync_interval,
        Duration::from_millis(200)
    );
}

/// The writer's counts are bounded: a slip of a digit would take the memory
/// it names at start-up, or overflow what is computed from it.
#[test]
fn the_writer_counts_are_bounded() {
    for (setting, says) in [
        ("batch_size = 0", "audit.batch_size"),
        ("batch_size = 100001", "audit.batch_size"),
        ("queue_capacity = 0", "audit.queue_capacity"),
        ("queue_capacity = 10000001", "audit.queue_capacity"),
    ] {
        let error = crate::support::app::config_error(&format!("[audit]\n{setting}"));
        assert!(
            error.contains(says) && error.contains("must be from 1 to"),
            "{setting}: {error}"
        );
    }
    let settings =
        crate::support::app::load_config("[audit]\nbatch_size = 100000\nqueue_capacity = 10000000")
            .unwrap();
    assert_eq!(settings.audit.batch_size, 100_000);
}

/// Processes may share a spool directory: a new one adopts the segments of
/// a process that is gone (its lock is free), never a live one's.
#[test]
fn a_shared_spool_dir_adopts_only_the_segments_of_processes_that_are_gone() {
    use tollgate::audit::journal::read_lines;
    use tollgate::audit::{AuditDecision, Journal};
    use tollgate::domain::{Action, Subject, SubjectKind};

    let dir = tempfile::tempdir().unwrap();
    let event = |user: &str| {
        AuditEvent::new(
            Action::LoginAttempt,
            AuditDecision::Deny,
            "user_locked",
            &Subject::new(SubjectKind::User, user),
        )
    };
    let live = Journal::open(dir.path(), 1 << 30).unwrap();
    let gone = Journal::open(dir.path(), 1 << 30).unwrap();
    live.append(&event("live")).unwrap();
    let lost = event("gone");
    gone.append(&lost).unwrap();
    drop(gone); // as a dead process: its lock released, its segment left

    let next = Journal::open(dir.path(), 1 << 30).unwrap();
    let adopted = next.sealed();
    assert_eq!(adopted.len(), 1, "only the dead run's segment");
    let events = read_lines(adopted[0].path()).unwrap().events;
    assert_eq!(events.iter().map(|e| e.id).collect::<Vec<_>>(), [lost.id]);
    assert!(live.sealed().is_empty(), "the live run keeps its own");
}

/// Adopting a file deletes it once replayed: only the journal's own names
/// are taken (a run's segments, the old spool's `spool.jsonl` and
/// `replay-*.jsonl`), never another file an operator keeps there.
#[test]
fn only_the_journals_own_files_are_adopted() {
    use tollgate::audit::Journal;

    let dir = tempfile::tempdir().unwrap();
    let line = |user: &str| {
        let mut line = serde_json::to_vec(&a_refusal(user)).unwrap();
        line.push(b'\n');
        line
    };
    std::fs::write(dir.path().join("spool.jsonl"), line("old-spool")).unwrap();
    std::fs::write(dir.path().join("replay-7.jsonl"), line("old-replay")).unwrap();
    let kept: Vec<(&str, Vec<u8>)> = [
        "export.jsonl",
        "journal-notes.jsonl",
        "journal-2024-05.jsonl",
        "replay.jsonl",
    ]
    .into_iter()
    .map(|name| (name, line(name)))
    .collect();
    for (name, text) in &kept {
        std::fs::write(dir.path().join(name), text).unwrap();
    }

    let next = Journal::open(dir.path(), 1 << 30).unwrap();
    let adopted: Vec<String> = next
        .sealed()
        .iter()
        .flat_map(|s| {
            tollgate::audit::journal::read_lines(s.path())
                .unwrap()
                .events
        })
        .map(|e| e.subject)
        .collect();
    assert_eq!(adopted, ["old-replay", "old-spool"]);
    for (name, text) in &kept {
        let now = std::fs::read(dir.path().join(name)).expect("left where it was");
        assert_eq!(&now, text, "{name} untouched");
    }
}

/// A run's lock that cannot be opened for another reason than its absence
/// (another user's run, no descriptor left; here a directory in its place)
/// may be a live run's: its segments stay where they are.
#[test]
fn a_lock_that_cannot_be_opened_keeps_its_runs_segments() {
    use tollgate::audit::Journal;

    let dir = tempfile::tempdir().unwrap();
    let gone = Journal::open(dir.path(), 1 << 30).unwrap();
    gone.append(&a_refusal("kept")).unwrap();
    drop(gone);
    let files: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    let with = |ext: &str| {
        files
            .iter()
            .find(|p| p.extension().is_some_and(|x| x == ext))
            .expect("the run's file")
            .clone()
    };
    let (lock, segment) = (with("lock"), with("jsonl"));
    std::fs::remove_file(&lock).unwrap();
    std::fs::create_dir(&lock).unwrap();

    let next = Journal::open(dir.path(), 1 << 30).unwrap();
    assert!(next.sealed().is_empty(), "nothing adopted");
    assert!(segment.exists(), "the run's segment is where it was");
}

/// Processes starting at once on one spool directory all start: none finds
/// another's lock file before it is locked (it would take that live run for
/// a dead one), and none deletes another's probe file.
#[test]
fn journals_opened_at_once_on_one_directory_all_open() {
    use tollgate::audit::Journal;

    let dir = tempfile::tempdir().unwrap();
    std::thread::scope(|scope| {
        let openers: Vec<_> = (0..8)
            .map(|_| {
                scope.spawn(|| {
                    (0..40)
                        .map(|_| {
                            Journal::open(dir.path(), 1 << 30).map(|j| j.append(&a_refusal("x")))
                        })
                        .filter(|opened| !matches!(opened, Ok(Some(_))))
                        .map(|failed| format!("{failed:?}"))
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        for opener in openers {
            let failures = opener.join().unwrap();
            assert!(failures.is_empty(), "{failures:?}");
        }
    });
}

/// A crash while a run starts leaves its `.locking` or `.probe-` file
/// behind. The next run deletes those older than a minute, and neither a
/// fresh one (a neighbour starting now) nor a locked one (a neighbour
/// stuck starting).
#[test]
fn files_a_crash_left_while_starting_are_deleted_once_stale() {
    use std::fs::File;
    use tollgate::audit::Journal;

    let dir = tempfile::tempdir().unwrap();
    let at = |name: &str| dir.path().join(name);
    let an_hour_ago = std::time::SystemTime::now() - Duration::from_secs(3600);
    let stale = [".1700000000000-11-0.locking", ".probe-1700000000000-11-0"];
    let fresh = [".1700000000000-12-0.locking", ".probe-1700000000000-12-0"];
    let locked = ".1700000000000-13-0.locking";
    for name in stale.iter().chain(&fresh).chain([&locked]) {
        File::create(at(name)).unwrap();
    }
    for name in stale.iter().chain([&locked]) {
        let file = File::options().write(true).open(at(name)).unwrap();
        file.set_modified(an_hour_ago).unwrap();
    }
    let neighbour = File::options().write(true).open(at(locked)).unwrap();
    neighbour.try_lock().unwrap();

    let _journal = Journal::open(dir.path(), 1 << 30).unwrap();

    for name in stale {
        assert!(!at(name).exists(), "{name} is a crash's leftover");
    }
    for name in fresh.iter().chain([&locked]) {
        assert!(at(name).exists(), "{name} may be a live neighbour's");
    }
}

/// A writer that falls behind (here stuck on a locked table) fills the
/// queue: what does not fit goes to the journal, the log says so once
/// (not once an event, which a flood would turn into a full disk), and
/// every refusal reaches the database, once, when the table is free.
#[tokio::test]
async fn a_full_queue_is_logged_once_and_what_did_not_fit_is_replayed() {
    let db = TestDb::new(DbKind::Postgres).await;
    let dir = tempfile::tempdir().unwrap();
    let path = config_with(
        dir.path(),
        "tollgate.toml",
        &db.url,
        "batch_size = 1\nqueue_capacity = 4\nwrite_timeout = \"60s\"",
    );
    let server = Tollgate::start(&path).await;
    let client = reqwest::Client::new();
    let sent = client
        .post(format!("{}/sms/send", server.address))
        .json(&json!({ "phone": PHONE }))
        .send()
        .await
        .unwrap();
    assert_eq!(sent.status(), 200);

    let mut holder = sqlx::PgConnection::connect(&db.url).await.unwrap();
    let mut lock = holder.begin().await.unwrap();
    sqlx::query("LOCK TABLE audit_events IN ACCESS EXCLUSIVE MODE")
        .execute(&mut *lock)
        .await
        .unwrap();
    let ids: Vec<String> = (0..20).map(|i| format!("past-the-queue-{i}")).collect();
    for id in &ids {
        server.refused_send(&client, id).await;
    }
    let full = server.logged("audit queue full").await;
    assert_eq!(full.len(), 1, "one line for the whole overflow: {full:?}");
    let line: serde_json::Value = serde_json::from_str(&full[0]).unwrap();
    assert_eq!(line["capacity"], json!(4), "{line}");
    assert_eq!(line["level"], json!("WARN"), "{line}");

    lock.rollback().await.unwrap();
    let pool = db.connect().await;
    every_id_arrives(&pool, &ids).await;
    assert!(each_once(&all_rows(&pool).await, &ids));
}

/// Waits (up to 60 s: a replay follows a segment's sealing) until every
/// request id in `ids` has a row.
async fn every_id_arrives(pool: &AuditDb, ids: &[String]) {
    eventually(
        "every refusal in the database",
        Duration::from_secs(60),
        || async {
            let counts = request_id_counts(&all_rows(pool).await);
            ids.iter().all(|id| counts.contains_key(id))
        },
    )
    .await;
}
